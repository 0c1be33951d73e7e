"""``python -m lightning_nvcomp``: the ``lightning-nvcomp`` command line."""

from lightning_nvcomp.cli import main

raise SystemExit(main())
