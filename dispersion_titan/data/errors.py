"""The one error type of the data package (its own module: every other one imports it)."""


class DataConfigError(ValueError):
    """Bad dataset name, path or contents; the one-line message names the field or file."""
