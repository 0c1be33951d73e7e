"""The pinned pool that coded segments are copied off the GPU into: bounded, reused, and never handing out memory a
live blob (or any view of it) still uses. On the CPU the slabs are unpinned; the GPU tests pin them and copy."""

from __future__ import annotations

import contextlib
import gc
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_nvcomp import _process as resources
from lightning_nvcomp.codec.gpu import gpu_available
from lightning_nvcomp.codec.pinned import PinnedPool, pool

MIB = 1 << 20


def _pattern(n: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8))


def test_a_copy_holds_the_bytes_then_zeros():
    p = PinnedPool(limit=8 * MIB, pin=False, slab_nbytes=MIB)
    src = _pattern(1000, 0)
    host = p.copy(src, 1024)
    assert host.numel() == 1024
    assert torch.equal(host[:1000], src) and not host[1000:].any()
    assert p.copy(torch.empty(0, dtype=torch.uint8)).numel() == 0


def test_an_empty_buffer_is_cut_from_the_pool_and_reused():
    p = PinnedPool(limit=8 * MIB, pin=False, slab_nbytes=4 * MIB)
    for _ in range(3):  # three loads' read buffers: the same slab each time
        buffers = [p.empty(3 * MIB // 2), p.empty(3 * MIB // 2)]
        assert [b.numel() for b in buffers] == [3 * MIB // 2] * 2
        del buffers
        gc.collect()
    assert p.nbytes == 4 * MIB


def test_memory_is_reused_once_every_blob_of_a_slab_is_gone():
    p = PinnedPool(limit=64 * MIB, pin=False, slab_nbytes=4 * MIB)
    for round_ in range(5):  # five saves of 10 MiB each: the slabs of the first are reused by the rest
        blobs = [p.copy(_pattern(MIB, i)) for i in range(10)]
        if round_ == 0:
            grown = p.nbytes
        assert p.nbytes == grown
        del blobs
        gc.collect()
    assert grown == 12 * MIB  # 10 MiB in three 4 MiB slabs, reused from their starts
    assert p.in_use_nbytes <= 4 * MIB  # at most the open slab


def test_a_snapshot_the_size_of_the_last_fits_the_room_it_left_without_pinning_more():
    # 11 MiB in 4 MiB slabs: 12 MiB pinned, the third slab left open with 1 MiB free. Once the first snapshot is
    # written (its blobs gone), the next of the same size is cut from the same three slabs, from their starts: the
    # writer's reserve pins nothing and the save grows nothing (it used to pin a fourth slab during the save).
    p = PinnedPool(limit=64 * MIB, pin=False, slab_nbytes=4 * MIB)
    for round_ in range(3):
        with p.holding(11 * MIB):
            p._reserving.join()
            if round_ == 0:
                grown = p.nbytes
            blobs = [p.copy(_pattern(MIB, round_ * 11 + i)) for i in range(11)]
        assert p.nbytes == grown == 12 * MIB
        assert all(torch.equal(b, _pattern(MIB, round_ * 11 + i)) for i, b in enumerate(blobs))
        del blobs
        gc.collect()


def test_the_pool_holds_what_a_save_copies_not_its_raw_bytes():
    # Saves of 100 MiB of state coded to 80 MiB: the first reserve pins the state's size (the ratio is not known
    # yet); from the second on, one slab of the coded size (+2%, in 2 MiB grains) is pinned instead, and reused.
    p = PinnedPool(limit=1024 * MIB, pin=False, slab_nbytes=4 * MIB)
    for round_ in range(4):
        with p.holding(100 * MIB):
            p._reserving.join()
            reserved = p.nbytes
            blobs = [p.copy(_pattern(4 * MIB, round_ * 20 + i)) for i in range(20)]
        assert p.nbytes == reserved and p.overflow_nbytes == 0  # the copies pinned nothing more
        assert reserved == (102 * MIB if round_ == 0 else 82 * MIB), (round_, reserved / MIB)
        assert all(torch.equal(b, _pattern(4 * MIB, round_ * 20 + i)) for i, b in enumerate(blobs))
        del blobs
        gc.collect()


def test_saves_that_stream_leave_the_pool_one_slab_of_what_a_held_save_copies():
    # The DCP benchmark's rounds: a sync save streams its coded bytes through the pool (its blobs written and dropped
    # as it goes, up to 48 MiB at once), then an async save holds its snapshot (100 MiB of state coded to 80), then a
    # load reads through the pool. The pool kept the streaming's slabs beside the snapshot's (on an H100, 4 x 0.54 GB
    # + 1.14 GB for a 2.66 GB snapshot: 1.24x), and the streamed bytes counted as a held save's. Now the first
    # reserve pins the rest of the state's size beside the streaming's slabs (3 x 16 + 54 MiB); from then on only held
    # copies count, and the largest free slabs that make up what a held save copies stay (54 + 2 x 16 MiB), the others
    # go.
    p = PinnedPool(limit=1024 * MIB, pin=False, slab_nbytes=16 * MIB)
    for round_ in range(3):
        for start in (0, 12):  # the sync save, streamed
            streamed = [p.copy(_pattern(4 * MIB, start + i)) for i in range(12)]
            assert all(torch.equal(b, _pattern(4 * MIB, start + i)) for i, b in enumerate(streamed))
            del streamed
            gc.collect()
        with p.holding(100 * MIB):  # the async save, held
            p._reserving.join()
            assert p.nbytes == (102 * MIB if round_ == 0 else 86 * MIB), (round_, p.nbytes / MIB)
            blobs = [p.copy(_pattern(4 * MIB, round_ * 20 + i)) for i in range(20)]
        assert p.nbytes == (102 * MIB if round_ == 0 else 86 * MIB)
        assert all(torch.equal(b, _pattern(4 * MIB, round_ * 20 + i)) for i, b in enumerate(blobs))
        del blobs
        gc.collect()
        buffer = p.empty(12 * MIB)  # the load's read buffer
        del buffer
        gc.collect()


def test_copies_made_pinning_nothing_use_free_room_then_pageable_memory_on_their_thread_only():
    # An async delta's records coded again on the writer thread, while the save's held snapshot fills the pool: their
    # copies take the room left, then pageable memory (no slab pinned, which on a GPU would wait for every stream),
    # and the next reserve does not count them; the other threads' copies still grow the pool as before.
    p = PinnedPool(limit=64 * MIB, pin=False, slab_nbytes=8 * MIB)
    with p.holding(8 * MIB):  # a save of 8 MiB of state (the first: all of it pinned, one slab of 10 MiB)...
        p._reserving.join()
        held = [p.copy(_pattern(MIB, i)) for i in range(3)]  # ...coded to 3 MiB, held: 7 MiB free
        before = p.nbytes

        def code_again() -> list[torch.Tensor]:
            with p.pinning_nothing():
                return [p.copy(_pattern(2 * MIB, 10 + i), 2 * MIB + 16) for i in range(4)]

        with ThreadPoolExecutor(1) as writer:
            again = writer.submit(code_again).result()
        assert p.nbytes == before and p.overflow_nbytes == 0
        in_pool = [
            p._slabs[0].array.ctypes.data <= b.data_ptr() < p._slabs[0].array.ctypes.data + before for b in again
        ]
        assert in_pool == [True, True, True, False]  # three fit in the room left, the last is pageable
        for i, blob in enumerate(again):
            assert blob.numel() == 2 * MIB + 16 and not blob[2 * MIB :].any()
            assert torch.equal(blob[: 2 * MIB], _pattern(2 * MIB, 10 + i))
        more = p.copy(_pattern(2 * MIB, 20))  # this thread's copies still grow the pool
    assert p.nbytes > before and torch.equal(more, _pattern(2 * MIB, 20))
    assert all(torch.equal(b, _pattern(MIB, i)) for i, b in enumerate(held))
    del held, again, more
    gc.collect()
    p.reserve(8 * MIB)  # the next save expects what the save copied (3 + 2 MiB), not the copies made pinning nothing
    p._reserving.join()
    assert sorted(s.memory.numel() for s in p._slabs) == [6 * MIB], [s.memory.numel() / MIB for s in p._slabs]


def test_a_live_view_keeps_its_bytes_from_being_reused():
    p = PinnedPool(limit=64 * MIB, pin=False, slab_nbytes=MIB)
    blob = p.copy(_pattern(300_000, 1))
    expected = blob.clone()
    kept = [blob[10:20_000], blob.numpy()[5:], blob[100:]]  # a tensor view, a NumPy view, a memoryview's source
    view_bytes = memoryview(kept[2].numpy())
    del blob
    gc.collect()
    others = [p.copy(_pattern(200_000, 2 + i)) for i in range(12)]  # would overwrite it, were its slab free
    assert torch.equal(kept[0], expected[10:20_000])
    assert np.array_equal(kept[1], expected.numpy()[5:])
    assert bytes(view_bytes) == expected[100:].numpy().tobytes()
    del others


def test_past_the_limit_requests_get_pageable_memory():
    p = PinnedPool(limit=2 * MIB, pin=False, slab_nbytes=MIB)
    blobs = [p.copy(_pattern(700_000, i)) for i in range(4)]
    assert p.nbytes <= 2 * MIB
    assert p.overflow_nbytes == 2 * 700_000  # two blobs fit its two slabs; the other two are pageable
    assert all(torch.equal(b, _pattern(700_000, i)) for i, b in enumerate(blobs))


def test_reserve_pins_ahead_so_the_save_does_not_grow_the_pool():
    p = PinnedPool(limit=64 * MIB, pin=False, slab_nbytes=MIB)
    p.reserve(10 * MIB)
    p._reserving.join()
    assert p.nbytes >= 10 * MIB
    reserved = p.nbytes
    blobs = [p.copy(_pattern(MIB // 2, i)) for i in range(20)]
    assert p.nbytes == reserved
    del blobs
    p.reserve(1000 * MIB)  # bounded by the limit
    p._reserving.join()
    assert 63 * MIB <= p.nbytes <= 64 * MIB


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3 * MIB // 2), st.booleans()), min_size=1, max_size=30))
def test_live_blobs_are_never_overwritten_and_the_pool_stays_bounded(ops):
    p = PinnedPool(limit=6 * MIB, pin=False, slab_nbytes=MIB)
    live: list[tuple[torch.Tensor, torch.Tensor]] = []
    for i, (n, drop_oldest) in enumerate(ops):
        src = _pattern(n, i)
        live.append((p.copy(src), src))
        if drop_oldest and live:
            live.pop(0)
        assert p.nbytes <= 6 * MIB
        for blob, src in live:
            assert torch.equal(blob, src)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3 * MIB // 2), st.booleans(), st.integers(0, 8)), min_size=1, max_size=30))
def test_reserves_that_let_slabs_go_never_take_a_live_blobs_memory(ops):
    # Copies (streamed or held), some kept alive, interleaved with the reserves of held saves of 0-8 MiB: however the
    # reserves fit the pool to what held saves copied, letting free slabs go, every live blob keeps its bytes.
    p = PinnedPool(limit=12 * MIB, pin=False, slab_nbytes=MIB)
    live: list[tuple[torch.Tensor, torch.Tensor]] = []
    for i, (n, drop_oldest, held_mib) in enumerate(ops):
        src = _pattern(n, i)
        with p.holding(held_mib * MIB) if held_mib else contextlib.nullcontext():
            if p._reserving is not None:
                p._reserving.join()
            live.append((p.copy(src), src))
        if drop_oldest:
            live.pop(0)
            gc.collect()
        assert p.nbytes <= 12 * MIB
        for blob, expected in live:
            assert torch.equal(blob, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")
def test_gpu_copies_land_in_pinned_reused_memory(tmp_path):
    import lightning_nvcomp
    from lightning_nvcomp.options import SaveOptions
    from lightning_nvcomp.saving.writer import CheckpointWriter

    resources.reset()
    torch.manual_seed(0)
    state = {f"w{i}": torch.randn(3 << 20, device="cuda").to(torch.bfloat16) for i in range(8)}  # 48 MiB
    blob = pool().copy(state["w0"].view(torch.uint8).flatten())
    torch.cuda.synchronize()
    assert blob.is_pinned()
    assert torch.equal(blob, state["w0"].view(torch.uint8).flatten().cpu())
    del blob
    w = CheckpointWriter(SaveOptions(codec="ans", async_save=True))
    try:
        sizes = []
        for i in range(4):
            w.save(state, tmp_path / f"c{i}.ckpt")
            w.wait()
            sizes.append(pool().nbytes)
    finally:
        w.close()
    # pinned by the first save (the state's size); the second pins a slab fitted to what the first copied, and the
    # first slab goes once free (by the third save at the latest); then reused
    assert sizes[3] == sizes[2] < sizes[0], sizes
    coded = max((tmp_path / f"c{i}.ckpt").stat().st_size for i in range(4))
    assert sizes[3] <= 1.1 * coded + (2 << 20), (sizes, coded)
    assert pool().overflow_nbytes == 0
    for i in range(4):
        loaded = lightning_nvcomp.load(tmp_path / f"c{i}.ckpt", map_location="cuda")
        assert all(torch.equal(loaded[k].view(torch.uint8), v.view(torch.uint8)) for k, v in state.items())


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")
def test_gpu_dcp_loads_read_through_the_pool_without_growing_it(tmp_path):
    import torch.distributed.checkpoint as dcp

    from lightning_nvcomp.dcp import NvcompFileSystemReader, NvcompFileSystemWriter

    resources.reset()
    torch.manual_seed(0)
    state = {f"w{i}": torch.randn(1 << 20, device="cuda") for i in range(16)}  # 64 MiB
    dcp.save(state, storage_writer=NvcompFileSystemWriter(tmp_path / "ck", "ans"))
    sizes = []
    for _ in range(3):
        target = {k: torch.empty_like(v) for k, v in state.items()}
        dcp.load(target, storage_reader=NvcompFileSystemReader(tmp_path / "ck"))
        assert all(torch.equal(target[k].view(torch.uint8), v.view(torch.uint8)) for k, v in state.items())
        sizes.append(pool().nbytes)
    assert sizes[1:] == sizes[:1] * 2 and sizes[0] > 0, sizes


def test_threads_taking_at_once_get_blobs_of_their_own():
    from concurrent.futures import ThreadPoolExecutor

    p = PinnedPool(limit=64 * MIB, pin=False, slab_nbytes=2 * MIB)

    def take_and_check(seed: int) -> bool:
        kept = []
        for i in range(40):
            src = _pattern(4096 + 64 * i, seed * 100 + i)
            kept.append((p.copy(src), src))
        return all(torch.equal(blob, src) for blob, src in kept)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: a race between two cuts shows
    try:
        with ThreadPoolExecutor(8) as pool_threads:
            assert all(pool_threads.map(take_and_check, range(16)))
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")
def test_a_lightning_fit_pins_ahead_of_its_first_save(tmp_path):
    """After the first training batch the savings callback pins as much host memory as the GPU state holds, on a
    thread of its own; the first save (after the second batch) then grows the pool no further, and its checkpoint
    loads bit-exactly."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    import lightning_nvcomp
    from lightning_nvcomp import NvcompCheckpointIO
    from lightning_nvcomp.integrations.lightning.checkpoint_io import gpu_state_nbytes

    from tests.helpers.lightning_models import TinyData, TinyModule

    seen: dict[str, int] = {}

    class BeforeTheFirstSave(L.Callback):  # runs before ModelCheckpoint's save at the same batch end
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 1:
                pool()._reserving.join()
                seen.update(pool=pool().nbytes, state=gpu_state_nbytes(module, trainer.optimizers))

    resources.reset()
    io = NvcompCheckpointIO(codec="ans", async_save=True, probe_mb=4)
    every_second = ModelCheckpoint(dirpath=tmp_path, filename="first", every_n_train_steps=2, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="cuda",
        devices=1,
        max_steps=2,
        plugins=[io],
        callbacks=[BeforeTheFirstSave(), every_second],
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
    )
    if not any(isinstance(c, lightning_nvcomp.NvcompSavings) for c in trainer.callbacks):
        trainer.callbacks.append(lightning_nvcomp.NvcompSavings())  # not installed (no entry points): run from source
    module = TinyModule(in_dim=8, hidden=1 << 16)  # ~6 MB of GPU state with AdamW's
    trainer.fit(module, TinyData())
    assert seen["state"] > 5 << 20 and seen["pool"] >= seen["state"], seen
    assert pool().nbytes == seen["pool"] and pool().overflow_nbytes == 0
    loaded = lightning_nvcomp.load(tmp_path / "first.ckpt", map_location="cpu")
    for name, value in module.state_dict().items():
        got = loaded["state_dict"][name]
        assert torch.equal(got.reshape(-1).view(torch.uint8), value.cpu().reshape(-1).view(torch.uint8)), name
