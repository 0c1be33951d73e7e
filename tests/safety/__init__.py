"""Safety tests: damaged and hostile files, failing and interrupted saves, storage that fails (see tests/README.md)."""
