"""The test suite: ``unit/``, ``integration/`` and ``safety/`` (see README.md here), and what they share in
``helpers/``."""
