"""The job config as a launch parses and checks it: ``parse`` (TorchTitan's ``ConfigManager``
with our sections, the TOML's types first; the hub assets fetched; a fork's checkpoint
options; the run folder's fixed settings) and ``checks`` (every value we depend on, and the
batch sizes derived for the data-parallel degree). Used by the training command and by the
sweep, which checks every cell before it submits anything."""
