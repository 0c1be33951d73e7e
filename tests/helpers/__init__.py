"""What the tests share, by concern (import them as ``from tests.helpers.states import assert_bit_exact``).

Functions:

* ``states``: bit-exact comparisons of tensors and state trees, and test data (random bytes, trained-like weights,
  special floats).
* ``processes``: child processes (a fresh interpreter, ``torch.distributed.run``, a killable run) and what they
  report back (a JSON line, tensor digests).
* ``files``: what a save leaves on disk (temporary files, zip members of a torch.save file).
* ``collector``: on whose account the garbage collector ran.
* ``paths``: the repository root, this folder, the fixtures of earlier versions.
* ``wandb_run``: the records W&B stored in an offline run file.

Framework runs and their models, imported by tests and by child processes:

* ``lightning_models``: a tiny LightningModule and DataModule (and LightningCLI's entry point).
* ``lightning_sharded_run``: a script, a Lightning run with a sharded strategy.
* ``accelerate_runs``: a tiny, deterministic Accelerate training run; ``accelerate_ddp_child`` and
  ``accelerate_fsdp_child`` are scripts, one rank each of the 2-process DDP and the FSDP runs.
* ``dcp_workers``, ``dcp_damage_workers``: the multi-process jobs of the DCP tests (gloo, real processes).
* ``damage_campaign``: the damage campaign's regions, sampled damage, loaders and outcomes.
* ``doc_blocks``: runs the Python blocks of a markdown file as a reader would (also a script).

The scripts import ``tests.helpers``: the repository root goes on their ``PYTHONPATH`` (the tests' children get
it from :data:`~tests.helpers.paths.REPO_ROOT`).
"""
