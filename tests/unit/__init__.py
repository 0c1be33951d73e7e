"""Unit tests: one module or concern of the package at a time, fast, in this process (see tests/README.md)."""
