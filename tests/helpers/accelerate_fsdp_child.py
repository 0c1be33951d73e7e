"""One rank of the Accelerate FSDP tests (launched by ``torch.distributed.run``).

Usage: ``accelerate_fsdp_child.py MODE OUT_DIR TIMEOUT_S``; each rank writes ``OUT_DIR/rank{N}.json``.

MODE ``cpu`` (2 gloo ranks): Accelerate 1.15 runs FSDP only on an accelerator (on a CPU it ignores ``fsdp_plugin``
and runs DDP), so ``save_state`` never reaches its FSDP functions there. This mode calls those functions themselves
(``save_fsdp_model``, ``save_fsdp_optimizer``, ``load_fsdp_model``, ``load_fsdp_optimizer``: Accelerate's own code,
as ``save_state`` / ``load_state`` call them) on an FSDP2 model (``fully_shard`` on a CPU mesh) with a
``SHARDED_STATE_DICT`` plugin, inside the routing the attachment uses, with zstd.

MODE ``gpu1`` / ``gpu2`` (one process per GPU): ``Accelerator(fsdp_plugin=FSDP1 or FSDP2, SHARDED_STATE_DICT)``,
``attach(codec="ans")``, ``save_state`` / ``load_state``; then the same with ``state_on_gpu=False``.

Each result holds the full model and optimizer state at the save and after the load (as digests of their bits),
and what the attachment recorded about the DCP parts.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin, InitProcessGroupKwargs
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

from lightning_nvcomp._compat.accelerate import checkpoint_io_as
from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter
from lightning_nvcomp.integrations.accelerate.attach import attach
from lightning_nvcomp.options import SaveOptions

from tests.helpers import accelerate_runs as R

FULL = StateDictOptions(full_state_dict=True, cpu_offload=False)


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(R.IN_DIM, R.HIDDEN), torch.nn.GELU(), torch.nn.Linear(R.HIDDEN, R.IN_DIM)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return model


def train(model: torch.nn.Module, optimizer: Any, steps: int, backward: Any) -> None:
    device = next(model.parameters()).device
    for _ in range(steps):
        x = torch.randn(16, R.IN_DIM, device=device)
        backward(torch.nn.functional.mse_loss(model(x), x.roll(1, dims=1)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def full_state(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """The whole model and optimizer state, gathered (every rank gets all of it), as digests."""
    optim = get_optimizer_state_dict(model, optimizer, options=FULL)
    return {
        "model": R.flat_digests(get_model_state_dict(model, options=FULL)),
        "optimizer": R.flat_digests(optim["state"]),
        "param_groups": repr(optim["param_groups"]),
    }


def cpu(out: str, group: InitProcessGroupKwargs) -> dict[str, Any]:
    from accelerate.utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard

    acc = Accelerator(cpu=True, kwargs_handlers=[group])
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    mesh = init_device_mesh("cpu", (acc.num_processes,))
    model = net()
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    torch.manual_seed(100 + acc.process_index)
    train(model, optimizer, 3, lambda loss: loss.backward())
    expected = full_state(model, optimizer)
    ck = os.path.join(out, "ck")
    writers: list[NvcompFileSystemWriter] = []
    readers: list[str] = []

    def writer(path: str, **kwargs: Any) -> NvcompFileSystemWriter:
        writers.append(NvcompFileSystemWriter(path, options=SaveOptions(codec="zstd"), **kwargs))
        return writers[-1]

    def reader(path: str, **kwargs: Any) -> NvcompFileSystemReader:
        readers.append(os.path.basename(os.fspath(path)))
        return NvcompFileSystemReader(path, **kwargs)

    with checkpoint_io_as(dcp_writer=writer):
        save_fsdp_model(plugin, acc, model, ck)
        save_fsdp_optimizer(plugin, acc, optimizer, model, ck)
    saved = {os.path.basename(w.path): part(w.gather_stats(), w.shard_devices) for w in writers}
    train(model, optimizer, 2, lambda loss: loss.backward())
    changed = full_state(model, optimizer)
    with checkpoint_io_as(dcp_reader=reader):
        load_fsdp_model(plugin, acc, model, ck)
        load_fsdp_optimizer(plugin, acc, optimizer, model, ck)
    return {"ck": {**round_trip(expected, changed, full_state(model, optimizer)), "saved": saved, "reads": readers}}


def gpu(version: int, out: str, group: InitProcessGroupKwargs) -> dict[str, Any]:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, state_dict_type="SHARDED_STATE_DICT")
    acc = Accelerator(fsdp_plugin=plugin, kwargs_handlers=[group])
    model = net()
    if version == 1:  # FSDP1 flattens the parameters: the optimizer is made after the model is prepared
        model = acc.prepare(model)
        optimizer = acc.prepare(torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1))
    else:  # FSDP2: prepared together
        model, optimizer = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1))
    torch.manual_seed(100 + acc.process_index)
    train(model, optimizer, 3, acc.backward)
    results = {}
    for state_on_gpu in (True, False):
        attachment = attach(acc, codec="ans", probe_mb=4, state_on_gpu=state_on_gpu)
        expected = full_state(model, optimizer)
        name = "ck_gpu" if state_on_gpu else "ck_offload"
        acc.save_state(os.path.join(out, name))
        saved = {name: part(p.stats, p.devices) for name, p in attachment.last_sharded.items()}
        # the plugin's own configs are back (Accelerate's default: offload)
        plugin_offload = [plugin.state_dict_config.offload_to_cpu, plugin.optim_state_dict_config.offload_to_cpu]
        train(model, optimizer, 2, acc.backward)
        changed = full_state(model, optimizer)
        acc.load_state(os.path.join(out, name))
        results[name] = {
            **round_trip(expected, changed, full_state(model, optimizer)),
            "saved": saved,
            "reads": list(attachment.last_sharded_loads),
            "plugin_offload": plugin_offload,
            "distributed_type": str(acc.distributed_type),
        }
        attachment.detach()
    return results


def part(stats: Any, devices: frozenset[str]) -> dict[str, Any]:
    return {
        "devices": sorted(devices),
        "codecs": [r.codec for r in stats.ranks],
        "raw": stats.raw_nbytes,
        "stored": stats.stored_nbytes,
    }


def round_trip(expected: dict, changed: dict, loaded: dict) -> dict[str, Any]:
    return {"expected": expected, "changed": changed, "loaded": loaded}


def main() -> None:
    mode, out, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    faulthandler.dump_traceback_later(timeout_s * 3, exit=True)  # a hang becomes a traceback and an exit
    backend = {"backend": "gloo"} if mode == "cpu" else {}
    group = InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=timeout_s), **backend)
    result = cpu(out, group) if mode == "cpu" else gpu(int(mode.removeprefix("gpu")), out, group)
    rank = dist.get_rank()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": dist.get_world_size(), **result}, f)
    dist.barrier()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
