"""Demo: train a small GPT on the Python standard library's sources, checkpoint it compressed, resume from the
checkpoint bit-exactly, and print what compression saved. Runs on the CPU (zstd) or a GPU (gANS with nvCOMP).

    python examples/demo.py [--steps 60] [--dir runs/demo]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import lightning_nvcomp
from gpt import GPT, stdlib_corpus, train


def bytes_equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)) for k in a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--dir", default="runs/demo")
    parser.add_argument("--codec", default="auto", choices=lightning_nvcomp.container.SAVE_CODECS)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    os.makedirs(args.dir, exist_ok=True)

    torch.manual_seed(0)
    model = GPT(dim=256, layers=4, heads=4, context=128).to(device)
    print(f"training a {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M-parameter GPT on {device}")
    opt = train(model, stdlib_corpus(8 << 20), args.steps, batch=16, device=device, log_every=20)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": args.steps}

    begin = time.perf_counter()
    torch.save(state, os.path.join(args.dir, "plain.ckpt"))
    plain_s = time.perf_counter() - begin
    plain = os.path.getsize(os.path.join(args.dir, "plain.ckpt"))
    stats = lightning_nvcomp.save(state, os.path.join(args.dir, "compressed.ckpt"), codec=args.codec)

    resumed = lightning_nvcomp.load(stats.path, map_location=device)
    exact = bytes_equal(state["model"], resumed["model"]) and all(
        bytes_equal(s, resumed["optimizer"]["state"][i]) for i, s in state["optimizer"]["state"].items()
    )
    model.load_state_dict(resumed["model"])
    opt.load_state_dict(resumed["optimizer"])
    print(f"resumed at step {resumed['step']}; weights and AdamW state bit-exact: {exact}")

    print(f"\n{'checkpoint':<28}{'size MB':>10}{'seconds':>10}")
    print(f"{'torch.save':<28}{plain / 1e6:>10.2f}{plain_s:>10.2f}")
    print(f"{'lightning_nvcomp (' + stats.codec + ')':<28}{stats.file_nbytes / 1e6:>10.2f}{stats.seconds:>10.2f}")
    print(f"saved {100 * (1 - stats.file_nbytes / plain):.1f}% of the bytes ({plain / stats.file_nbytes:.3f}x)")
    if not exact:
        raise SystemExit("resume was not bit-exact")


if __name__ == "__main__":
    main()
