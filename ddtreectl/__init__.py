"""ddtreectl: operate multi-GPU DDTree inference hosts."""

__version__ = "0.1.0"
