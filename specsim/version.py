"""The package version, importable from any floor without loading the public API."""

__version__ = "0.1.0"
