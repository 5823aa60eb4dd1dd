"""The package version, in a module of its own so that any layer may read it without
importing the package root (which imports the engine)."""

__version__ = "0.1.0"
