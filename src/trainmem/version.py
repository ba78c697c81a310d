"""The package version, in a module of its own so that modules below `trainmem/__init__` can record it
without importing the package they are part of."""

__version__ = "0.1.0"
