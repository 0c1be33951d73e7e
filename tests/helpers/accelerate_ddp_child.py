"""One rank of the 2-process Accelerate test (launched by ``torch.distributed.run``, gloo on the CPU).

Usage: ``accelerate_ddp_child.py OUT_DIR CHECKPOINT_DIR TIMEOUT_S``: train, attach, save_state, train on, load_state;
each rank writes what it saved and what it loaded (as digests) to ``OUT_DIR/rank{N}.json``. TIMEOUT_S bounds every
collective (gloo), so a rank-mismatched collective fails instead of hanging.
"""

from __future__ import annotations

import copy
import datetime
import faulthandler
import json
import os
import sys

import torch
from accelerate.utils import InitProcessGroupKwargs

from lightning_nvcomp.integrations.accelerate.attach import attach

from tests.helpers import accelerate_runs as R


def main() -> None:
    out, ckpt, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    faulthandler.dump_traceback_later(timeout_s * 3, exit=True)  # a hang becomes a traceback and an exit
    group = InitProcessGroupKwargs(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    run = R.build(seed=0, kwargs_handlers=[group])
    acc = run.accelerator
    rank = acc.process_index
    torch.manual_seed(100 + rank)  # each rank its own batches: DDP averages the gradients
    R.train(run, 3)
    attachment = attach(acc, codec="zstd", probe_mb=4)
    expected = copy.deepcopy(R.states(run))
    acc.save_state(ckpt)
    after_save = R.draws()
    R.train(run, 2)
    acc.load_state(ckpt)
    after_load = R.draws()
    result = {
        "rank": rank,
        "world": acc.num_processes,
        "distributed_type": str(acc.distributed_type),
        "backend": torch.distributed.get_backend(),
        "expected": R.tree_digest(expected),
        "loaded": R.tree_digest(R.states(run)),
        "draws_after_save": after_save,
        "draws_after_load": after_load,
        "saves_written": len(attachment.writer.savings.history),
        "world_size_metric": attachment.writer.savings.world_size,
    }
    attachment.detach()
    acc.wait_for_everyone()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    acc.end_training()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
