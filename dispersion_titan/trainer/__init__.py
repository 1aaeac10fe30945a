"""The training side: TorchTitan's Trainer with the dispersion objective, the baselines, signal-driven
checkpoints and the launcher. Import-free, so ``train`` checks a config without building the trainer.
"""
