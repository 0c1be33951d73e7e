"""GPU codec paths: nvCOMP gANS and Zstd on CUDA tensors. Skipped without a CUDA GPU and nvCOMP."""

import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lightning_nvcomp
from lightning_nvcomp.codec import engines, layouts, record
from lightning_nvcomp.codec.cpu import CpuZstdEngine
from lightning_nvcomp.codec.gpu import NvcompEngine, gpu_available

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and nvCOMP")]

DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _trained_like(n: int, dtype: torch.dtype, device: str = "cuda") -> torch.Tensor:
    """Values shaped like trained weights, with special values mixed in (NaN payloads, -0.0, denormals, inf)."""
    g = torch.Generator(device="cpu").manual_seed(n)
    if dtype == torch.bool:
        return (torch.rand(n, generator=g) > 0.7).to(device)
    if not (dtype.is_floating_point or dtype.is_complex):
        info = torch.iinfo(dtype)
        return (
            torch.randint(max(info.min, -1000), min(info.max, 1000), (n,), generator=g, dtype=torch.int64)
            .to(dtype)
            .to(device)
        )
    x = torch.randn(n, generator=g, dtype=torch.float64) * 0.02
    if n >= 8:
        x[:4] = torch.tensor([float("inf"), -0.0, 1e-310, float("-inf")], dtype=torch.float64)
    t = x.to(torch.complex128 if dtype.is_complex else torch.float64).to(dtype)
    if dtype == torch.float32 and n >= 8:
        t.view(torch.int32)[5:7] = torch.tensor([0x7FC00001, -0x3EDCBA99], dtype=torch.int32)  # NaN payloads
    return t.to(device)


@pytest.mark.parametrize("codec", ["ans", "zstd"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_record_round_trip_on_gpu(codec, dtype):
    t = _trained_like(300_001, dtype)
    raw = t.reshape(-1).view(torch.uint8)
    blobs, meta = record.encode(raw, dtype, codec)
    assert all(b.device.type == "cpu" for b in blobs)
    back = record.decode(blobs, meta, "cuda")
    assert back.device.type == "cuda"
    assert torch.equal(back.cpu(), _bytes(t))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 70_000), dtype=st.sampled_from(DTYPES), codec=st.sampled_from(["ans", "zstd"]))
def test_record_round_trip_sizes(n, dtype, codec, monkeypatch_chunks):
    t = _trained_like(n, dtype)
    blobs, meta = record.encode(t.reshape(-1).view(torch.uint8), dtype, codec)
    assert torch.equal(record.decode(blobs, meta, "cuda").cpu(), _bytes(t))


@pytest.fixture
def monkeypatch_chunks():
    """Small segments and chunks, so that hypothesis's small inputs cross every boundary."""
    mp = pytest.MonkeyPatch()
    mp.setattr(engines, "SEGMENT_NBYTES", 64 * 8 * 16)
    mp.setattr(layouts, "CHUNK_NBYTES", {k: 256 for k in layouts.CHUNK_NBYTES})
    yield
    mp.undo()


def _concat(frames: list[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    spans, pos = [], 0
    for f in frames:
        spans.append((pos, f.numel()))
        pos += f.numel()
    return torch.cat(frames), spans


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_zstd_frames_decode_on_cpu_and_back(dtype):
    t = _trained_like(1_000_003, dtype)
    raw = t.reshape(-1).view(torch.uint8)
    spans = [(o, min(1 << 16, raw.numel() - o)) for o in range(0, raw.numel(), 1 << 16)]
    gpu, cpu = NvcompEngine(), CpuZstdEngine()
    frames, frame_spans = _concat(gpu.encode(raw, spans, "zstd", "|u1"))
    out = torch.empty(raw.numel(), dtype=torch.uint8)
    cpu.decode(frames.cpu(), frame_spans, out, spans, "zstd", "|u1")
    assert torch.equal(out, raw.cpu())
    frames, frame_spans = _concat(cpu.encode(raw.cpu(), spans, "zstd", "|u1"))
    out_gpu = torch.empty(raw.numel(), dtype=torch.uint8, device="cuda")
    # nvCOMP reads 16-byte aligned chunks: copy each CPU frame to an aligned slot
    aligned, aligned_spans, pos = torch.zeros(len(spans) * ((1 << 17) + 16), dtype=torch.uint8), [], 0
    for o, n in frame_spans:
        aligned[pos : pos + n] = frames[o : o + n]
        aligned_spans.append((pos, n))
        pos += -(-n // 16) * 16
    gpu.decode(aligned.cuda(), aligned_spans, out_gpu, spans, "zstd", "|u1")
    assert torch.equal(out_gpu, raw)


def test_zstd_record_written_on_gpu_loads_on_cpu_and_reverse(tmp_path):
    state = {"w": _trained_like(2_000_000, torch.bfloat16), "m": _trained_like(1_500_000, torch.float32)}
    lightning_nvcomp.save(state, tmp_path / "gpu.ckpt", codec="zstd")
    on_cpu = lightning_nvcomp.load(tmp_path / "gpu.ckpt", map_location="cpu")
    cpu_state = {k: v.cpu() for k, v in state.items()}
    lightning_nvcomp.save(cpu_state, tmp_path / "cpu.ckpt", codec="zstd")
    on_gpu = lightning_nvcomp.load(tmp_path / "cpu.ckpt", map_location="cuda")
    for k in state:
        assert on_cpu[k].device.type == "cpu" and on_gpu[k].device.type == "cuda"
        assert torch.equal(_bytes(on_cpu[k]), _bytes(state[k]))
        assert torch.equal(_bytes(on_gpu[k]), _bytes(state[k]))


@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_save_load_model_and_optimizer_on_gpu(tmp_path, codec):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        model(torch.randn(32, 256, device="cuda")).square().mean().backward()
        opt.step()
        opt.zero_grad()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "bf16": model[0].weight.bfloat16()}
    stats = lightning_nvcomp.save(state, tmp_path / "x.ckpt", codec=codec)
    assert stats.codec == codec
    for loader in (lightning_nvcomp.load, torch.load):
        back = loader(tmp_path / "x.ckpt", map_location="cuda", weights_only=True)
        assert torch.equal(_bytes(back["bf16"]), _bytes(state["bf16"]))
        for k, v in state["model"].items():
            assert torch.equal(_bytes(back["model"][k]), _bytes(v)), k
        for pid, s in state["optimizer"]["state"].items():
            for k, v in s.items():
                assert torch.equal(_bytes(back["optimizer"]["state"][pid][k]), _bytes(v)), (pid, k)


def test_typed_f4_ans_is_chosen_only_when_lossless():
    t = _trained_like(4_000_000, torch.float32)
    blobs, meta = record.encode(t.view(torch.uint8), torch.float32, "ans")
    assert meta["data_type"] in ("<f4", "|u1")
    assert torch.equal(record.decode(blobs, meta, "cuda"), t.view(torch.uint8))


def test_ans_ratio_beats_raw_bytes_on_bf16():
    t = _trained_like(8_000_000, torch.bfloat16)
    raw = t.view(torch.uint8)
    blobs, _ = record.encode(raw, torch.bfloat16, "ans")
    spans = [(o, min(1 << 20, raw.numel() - o)) for o in range(0, raw.numel(), 1 << 20)]
    plain = NvcompEngine().encode(raw, spans, "ans", "|u1")
    assert sum(b.numel() for b in blobs) < sum(p.numel() for p in plain)


def test_repeated_decode_does_not_grow_gpu_memory():
    t = _trained_like(8_000_000, torch.bfloat16)
    blobs, meta = record.encode(t.view(torch.uint8), torch.bfloat16, "ans")
    for _ in range(3):
        record.decode(blobs, meta, "cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(20):
        record.decode(blobs, meta, "cuda")
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before + (1 << 20)


def test_concurrent_zstd_decoders_are_exact():
    t = _trained_like(4_000_000, torch.float32)
    blobs, meta = record.encode(t.view(torch.uint8), torch.float32, "zstd")
    want = t.view(torch.uint8)
    errors = []

    def worker():
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(5):
                    got = record.decode(blobs, meta, "cuda")
                    stream.synchronize()
                    if not torch.equal(got, want):
                        errors.append("mismatch")
        except Exception as err:  # collected and reported below
            errors.append(repr(err))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


def test_ans_checkpoint_converts_to_zstd_readable_on_cpu(tmp_path):
    state = {"w": _trained_like(500_000, torch.bfloat16)}
    lightning_nvcomp.save(state, tmp_path / "a.ckpt", codec="ans")
    back = lightning_nvcomp.load(tmp_path / "a.ckpt", map_location="cpu")
    lightning_nvcomp.save(back, tmp_path / "z.ckpt", codec="zstd")
    z = lightning_nvcomp.load(tmp_path / "z.ckpt")
    assert torch.equal(_bytes(z["w"]), _bytes(state["w"]))


def test_auto_calibrates_gpu_codecs_and_saves_bit_exactly(tmp_path):
    from lightning_nvcomp.auto.policy import CodecPolicy
    from lightning_nvcomp.storage import ThrottledStorage

    state = {"w": _trained_like(4_000_000, torch.bfloat16), "m": _trained_like(2_000_000, torch.float32)}
    policy = CodecPolicy(probe_nbytes=8 << 20, storage=ThrottledStorage(200e6))
    codecs = {p.codec for p in policy.profiles(list(state.values()))}
    assert codecs == {"ans", "zstd", "none"}
    stats = lightning_nvcomp.save(state, tmp_path / "auto.ckpt", codec="auto", policy=policy)
    assert stats.codec == "ans"  # at 200 MB/s the fastest coder with a good ratio wins
    back = lightning_nvcomp.load(tmp_path / "auto.ckpt", map_location="cuda")
    assert all(torch.equal(_bytes(back[k]), _bytes(v)) for k, v in state.items())


def test_auto_on_gpu_state_with_cpu_step_counters(tmp_path):
    """AdamW keeps its step counters on the CPU next to CUDA moments: auto calibrates on the CUDA bulk."""
    from lightning_nvcomp.auto.policy import CodecPolicy
    from lightning_nvcomp.storage import ThrottledStorage

    state = {
        "m": _trained_like(2_000_000, torch.float32),
        "step": torch.tensor(7.0),
        "w": _trained_like(1000, torch.bfloat16),
    }
    policy = CodecPolicy(probe_nbytes=8 << 20, storage=ThrottledStorage(200e6))
    stats = lightning_nvcomp.save(state, tmp_path / "auto.ckpt", codec="auto", policy=policy)
    assert stats.codec == "ans"
    back = lightning_nvcomp.load(tmp_path / "auto.ckpt")
    assert all(torch.equal(_bytes(back[k]), _bytes(v)) for k, v in state.items())


def test_keep_on_gpu_puts_back_only_what_was_on_the_gpu(tmp_path):
    state = {
        "w": _trained_like(300_000, torch.float32),
        "cpu": _trained_like(300_000, torch.bfloat16, "cpu"),
        "step": torch.tensor(3.0),
    }
    lightning_nvcomp.save(state, tmp_path / "k.ckpt", codec="ans")
    back = lightning_nvcomp.load(tmp_path / "k.ckpt", keep_on_gpu=True)
    assert back["w"].is_cuda and not back["cpu"].is_cuda and not back["step"].is_cuda
    assert all(torch.equal(_bytes(back[k]), _bytes(v)) for k, v in state.items())
    assert not lightning_nvcomp.load(tmp_path / "k.ckpt")["w"].is_cuda
    io = lightning_nvcomp.NvcompCheckpointIO("ans")
    assert io.load_checkpoint(tmp_path / "k.ckpt")["w"].is_cuda
    assert not io.load_checkpoint(tmp_path / "k.ckpt", map_location="cpu")["w"].is_cuda


class Sub(torch.Tensor):
    """A tensor subclass (pickled by reference: it must live at module level)."""


@pytest.mark.parametrize("codec", ["none", "ans", "zstd"])
def test_gpu_state_with_passed_through_tensors_is_checked_by_both_loaders(tmp_path, codec):
    """GPU state stored raw (codec none: a pinned copy) or coded, with tensors the coder passes through (a conj
    view sharing its storage, a subclass): bit-exact through both loaders, and a damaged byte is caught by both."""
    c = _trained_like(64, torch.complex64)
    state = {
        "w": _trained_like(100_000, torch.float32),
        "p": torch.nn.Parameter(_trained_like(10, torch.bfloat16)),
        "c": c,
        "cj": c.conj(),
        "sub": _trained_like(32, torch.float32).as_subclass(Sub),
    }
    path = tmp_path / "n.ckpt"
    lightning_nvcomp.save(state, path, codec=codec)
    for back in (lightning_nvcomp.load(path, weights_only=False), torch.load(path, weights_only=False)):
        assert back["w"].device.type == "cpu" and isinstance(back["p"], torch.nn.Parameter)
        assert type(back["sub"]) is Sub and back["cj"].is_conj()
        assert back["cj"].untyped_storage().data_ptr() == back["c"].untyped_storage().data_ptr()
        for k in ("w", "p", "c", "sub"):
            assert torch.equal(_bytes(back[k]), _bytes(state[k])), k
    on_gpu = lightning_nvcomp.load(path, map_location="cuda", weights_only=False)
    assert on_gpu["w"].is_cuda and torch.equal(_bytes(on_gpu["w"]), _bytes(state["w"]))
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x10  # inside the big record's data
    path.write_bytes(bytes(data))
    for load in (lambda: lightning_nvcomp.load(path, weights_only=False), lambda: torch.load(path, weights_only=False)):
        with pytest.raises(lightning_nvcomp.CorruptCheckpointError):
            load()


@pytest.mark.parametrize("version", ["v0.1", "v0.2-dev"])
def test_ans_fixtures_load_bit_exactly(version):
    """gANS files written on an H200 by v0.1 and by the code before the reshape (format 2, commit 327f5fe) load."""
    import hashlib
    import json

    from tests.helpers.paths import FIXTURES
    from tests.helpers.states import tensor_bytes

    fixtures = FIXTURES
    path = fixtures / version / "ans.pt"
    expected = json.loads((fixtures / "v0.1" / "state.json").read_text())  # both were written from its state
    for obj in (lightning_nvcomp.load(path), torch.load(path, weights_only=True)):
        for k, v in obj.items():
            if isinstance(v, torch.Tensor):
                assert hashlib.sha256(tensor_bytes(v.detach().cpu()).numpy()).hexdigest() == expected[k][-1], k
            else:
                assert v == expected[k]


@pytest.mark.parametrize("async_save", [False, True])
def test_lightning_fit_resume_and_load_with_ans_on_gpu(tmp_path, async_save):
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))

        def training_step(self, batch, _):
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    data = DataLoader(TensorDataset(torch.randn(256, 64)), batch_size=32)
    io = lightning_nvcomp.NvcompCheckpointIO(codec="ans", async_save=async_save, probe_mb=8)
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        max_steps=8,
        plugins=[io],
        callbacks=[ckpt],
        enable_progress_bar=False,
        logger=False,
        default_root_dir=tmp_path,
    )
    model = Tiny()
    trainer.fit(model, data)
    path = str(tmp_path / "epoch=0-step=8.ckpt")
    raw = torch.load(path, map_location="cuda", weights_only=True)
    assert raw["global_step"] == 8
    for k, v in model.state_dict().items():
        assert torch.equal(_bytes(raw["state_dict"][k]), _bytes(v)), k
    resumed = L.Trainer(
        accelerator="gpu",
        devices=1,
        max_steps=10,
        plugins=[lightning_nvcomp.NvcompCheckpointIO("ans")],
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
    )
    resumed.fit(Tiny(), data, ckpt_path=str(tmp_path / "epoch=0-step=4.ckpt"))
    assert resumed.global_step == 10


@pytest.mark.parametrize("async_save", [False, True])
def test_accelerate_save_state_with_ans_on_gpu(tmp_path, async_save):
    from accelerate import Accelerator

    from lightning_nvcomp.integrations.accelerate.attach import attach

    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)
    for _ in range(3):
        accelerator.backward(model(torch.randn(32, 256, device="cuda")).square().mean())
        opt.step()
        opt.zero_grad()
    handle = attach(accelerator, codec="ans", async_save=async_save, probe_mb=8)
    accelerator.save_state(str(tmp_path / "ck"))
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = {k: v.clone() for k, v in opt.state_dict()["state"][0].items() if torch.is_tensor(v)}
    for p in model.parameters():
        p.data.add_(1.0)
    accelerator.load_state(str(tmp_path / "ck"))
    handle.detach()
    assert (tmp_path / "ck" / "pytorch_model.bin").exists() and (tmp_path / "ck" / "optimizer.bin").exists()
    for k, v in model.state_dict().items():
        assert torch.equal(_bytes(v), _bytes(saved_model[k])), k
    for k, v in saved_opt.items():
        assert torch.equal(_bytes(opt.state_dict()["state"][0][k]), _bytes(v)), k


@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_encode_batch_on_gpu_gives_each_buffer_its_own_record(codec):
    from tests.unit.test_codec import assert_batch_matches_encoder

    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int64):
        sizes = [0, 1, 7, 1000, 70_000, 300_000, 5]
        datas = [_bytes(_trained_like(n, dtype)).cuda() for n in sizes]
        assert_batch_matches_encoder(datas, dtype, codec)


@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_items_read_back_onto_the_gpu_together(codec):
    """Items coded in batches on the GPU and read a window at once decode on the GPU, bit-exactly."""
    from lightning_nvcomp.format import LoadState
    from lightning_nvcomp.format import items as tensor_items

    from tests.unit.test_items import archives

    tensors = [(f"l{i}.weight", _trained_like(n, torch.float32)) for i, n in enumerate([0, 7, 1000, 300_000])]
    tensors += [("e.bias", _trained_like(999, torch.bfloat16)), ("ids", torch.arange(50, device="cuda"))]
    data = archives(tensors, codec)
    for device in (torch.device("cuda", torch.cuda.current_device()), torch.device("cpu")):
        back = tensor_items.read_tensors([(d, n) for d, (n, _) in zip(data, tensors)], device, LoadState("x"))
        for (name, t), got in zip(tensors, back):
            assert got.device == device and got.dtype == t.dtype and got.shape == t.shape, name
            assert torch.equal(_bytes(got), _bytes(t)), name


@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_a_load_onto_the_gpu_borrows_a_segment_not_the_compressed_file(tmp_path, codec):
    """``load(map_location="cuda")`` keeps the blobs in host memory and copies a segment at a time to the GPU: beyond
    the tensors it returns it borrows well under the file's size (it used to hold the whole compressed file there)."""
    state = {f"t{i}": _trained_like((96 << 20) // 4 + i, torch.float32) for i in range(12)}  # 1.2 GB, several records
    path = tmp_path / f"{codec}.ckpt"
    lightning_nvcomp.save(state, path, codec=codec)
    state_nbytes = sum(t.numel() * t.element_size() for t in state.values())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loaded = lightning_nvcomp.load(path, map_location="cuda")
    borrowed = torch.cuda.max_memory_allocated() - base - state_nbytes
    assert all(loaded[k].device.type == "cuda" and torch.equal(_bytes(loaded[k]), _bytes(v)) for k, v in state.items())
    assert borrowed < 0.5 * path.stat().st_size, (borrowed, path.stat().st_size)


@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_a_gpu_delta_chain_round_trips_bit_exactly(tmp_path, codec: str) -> None:
    """Deltas of GPU state: the base decoded on the GPU at the save, the chain followed at the load, on the GPU and
    on the CPU (gANS decoded on the GPU), from a delta against a keyframe and against a delta, bit-exact."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(2_000_000, generator=gen) * 0.02
    states = [
        {"w": (w + step * 1e-6).cuda(), "v": (w * w + step * 1e-9).cuda(), "b": (w + step * 1e-4).bfloat16().cuda()}
        for step in range(3)
    ]
    lightning_nvcomp.save(states[0], tmp_path / "k.ckpt", codec=codec)
    lightning_nvcomp.save(states[1], tmp_path / "d1.ckpt", codec=codec, base=tmp_path / "k.ckpt")
    lightning_nvcomp.save(states[2], tmp_path / "d2.ckpt", codec=codec, base=tmp_path / "d1.ckpt")
    assert (tmp_path / "d2.ckpt").stat().st_size < (tmp_path / "k.ckpt").stat().st_size
    for device in ("cuda", "cpu"):
        for step in (1, 2):
            back = lightning_nvcomp.load(tmp_path / f"d{step}.ckpt", map_location=device)
            for name, t in states[step].items():
                assert back[name].device.type == device
                assert torch.equal(back[name].cpu().view(torch.uint8), t.cpu().view(torch.uint8)), (device, step, name)


@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_an_async_gpu_delta_is_coded_behind_training_on_a_stream_of_its_own(tmp_path, monkeypatch, codec: str) -> None:
    """An async save of GPU state with deltas codes it alone before it returns; the writer thread codes the held
    segments against the base on a CUDA stream of its own, so the file is written while training's stream is still
    busy, and is a delta of the state as it was saved (the live tensors zeroed meanwhile), bit-exact on the GPU."""
    from lightning_nvcomp import DeltaOptions, SaveOptions
    from lightning_nvcomp.format.bases import base_file
    from lightning_nvcomp.saving.writer import CheckpointWriter

    monkeypatch.chdir(tmp_path)
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(3_000_000, generator=gen) * 0.02

    def state(step: int) -> dict:
        return {
            "w": (w + step * 1e-6).cuda(),
            "v": (w * w + step * 1e-9).cuda(),
            "b": (w + step * 1e-4).bfloat16().cuda(),
        }

    writer = CheckpointWriter(SaveOptions(codec=codec, durable="os", async_save=True, delta=DeltaOptions()))
    for step in range(3):  # the third save, as training's later ones, finds its memory cached
        live = state(step)
        writer.save(live, f"step{step}.ckpt")
        writer.commit(step, f"step{step}.ckpt")
        if step < 2:
            writer.wait()
    for t in live.values():  # training changes the state, then keeps its stream busy for seconds
        t.zero_()
    # (zero_ first: the process's first fill kernel, loaded lazily by CUDA while the long one runs, would hold every
    # stream up until it ends; with CUDA_MODULE_LOADING=EAGER it does not. This test asks that the delta wait for no
    # stream of training's, not for CUDA's module loading.)
    torch.cuda._sleep(10_000_000_000)
    writer.close()
    assert not torch.cuda.current_stream().query(), "the delta waited for training's stream"
    torch.cuda.synchronize()
    found = base_file("step2.ckpt")
    assert found is not None and any("delta" in r.record for r in found.records)
    back = lightning_nvcomp.load("step2.ckpt", map_location="cuda")
    for name, t in state(2).items():
        assert torch.equal(back[name].cpu().view(torch.uint8), t.cpu().view(torch.uint8)), name
