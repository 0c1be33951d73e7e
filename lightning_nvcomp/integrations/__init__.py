"""The frameworks' seams, each in its own package and importing its framework only there: :mod:`.lightning` (the
``CheckpointIO`` plugin, the savings callback, the sharded strategies, LightningCLI configs), :mod:`.accelerate`
(``attach``), :mod:`.dcp` (torch.distributed.checkpoint's storage writer and reader). Each drives
:mod:`lightning_nvcomp.saving` and the file format below it; private framework names live in
:mod:`lightning_nvcomp._compat`."""
