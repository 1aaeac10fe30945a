"""The job config as a launch parses (``parse``) and checks (``checks``) it; the sweep checks its
cells the same way."""
