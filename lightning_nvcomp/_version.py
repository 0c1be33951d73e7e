"""The package's version, read by ``pyproject.toml`` (the one place it is written) and the command line."""

__version__ = "0.3.0"
