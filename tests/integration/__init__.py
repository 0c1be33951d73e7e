"""Integration tests: the package with the frameworks, processes, servers and files users run it with (see
tests/README.md)."""
