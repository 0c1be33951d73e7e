"""Run the code blocks of a markdown file (the README, docs/*.md) as a reader would: each block in a fresh
interpreter whose working directory is a fresh empty directory, so that relative and bare file names mean what they
mean to a user, and a block that crashes fails.

A block runs as written, with three documented exceptions:

* **Substitutions** (:data:`SUBSTITUTIONS`): where no CUDA GPU with nvCOMP is (CI), GPU-only text is replaced
  mechanically, everywhere in the block: ``map_location="cuda"`` -> ``map_location="cpu"`` and ``codec="ans"`` ->
  ``codec="zstd"``. With a GPU and nvCOMP the block runs unchanged.
* **The prelude** (:func:`prelude`): a block may use the names a reader already has in their own program, which the
  prose around it assumes: ``state`` and ``state_dict`` (a small model's weights and AdamW state, and the step),
  ``GPTModule`` (a LightningModule: a tiny byte-level language model), ``model`` (one of them), ``data`` (a
  LightningDataModule of one batch of 4 x 64 bytes an epoch: the Trainer's default 1000 epochs are 1000 steps),
  ``optimizer`` (AdamW on ``model``), ``scheduler`` (StepLR) and ``progress`` (an object with ``state_dict`` and
  ``load_state_dict``). Only the names a block mentions are made, and nothing else: the block imports what it uses.
* **Markers**: a block preceded (blank lines aside) by an HTML comment ``<!-- not run: why -->`` is not run, and
  says why (a multi-node launch, storage that needs credentials); nothing else is skipped.

Tracebacks name the markdown file and its line numbers. By hand: ``python tests/helpers/doc_blocks.py README.md 48``
runs the block whose opening fence is on line 48 in the current directory, substituted (``--gpu``: as written).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: (GPU-only text, what it becomes without a CUDA GPU and nvCOMP). Applied to every block, in this order.
SUBSTITUTIONS = [
    ('map_location="cuda"', 'map_location="cpu"'),
    ('codec="ans"', 'codec="zstd"'),
]

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced code block: ``line`` is its opening fence's line (1-based); ``not_run`` the reason its marker
    gives, or None."""

    path: Path
    line: int
    language: str
    code: str
    not_run: str | None

    def __str__(self) -> str:
        return f"{self.path.name}:{self.line}"


def blocks(markdown: str | os.PathLike, language: str | None = None) -> list[Block]:
    """The fenced code blocks of ``markdown`` (those of ``language`` only, when given), in order."""
    path = Path(markdown)
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang = opening.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{path}:{i + 1}: a code block that is never closed")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _NOT_RUN.match(before)
        code = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end]) + "\n"
        if language is None or lang == language:
            found.append(Block(path, i + 1, lang, code, marker.group(1) if marker else None))
        i = end + 1
    return found


def substituted(code: str, gpu: bool) -> str:
    """``code`` as it runs here: unchanged with a GPU and nvCOMP (``gpu``), else with :data:`SUBSTITUTIONS` made."""
    if not gpu:
        for old, new in SUBSTITUTIONS:
            code = code.replace(old, new)
    return code


def run(block: Block, cwd: str | os.PathLike, gpu: bool, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a Python ``block`` in a fresh interpreter (this one's executable and environment) in ``cwd``, substituted
    unless ``gpu`` (a CUDA GPU and nvCOMP are here)."""
    if block.language != "python":
        raise ValueError(f"{block}: only python blocks run, not {block.language!r}")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    gpu_flag = ["--gpu"] if gpu else []
    return subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(block.path.resolve()), str(block.line), *gpu_flag],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# the prelude ------------------------------------------------------------------------------------------------------


def prelude(names: set[str]) -> dict[str, Any]:
    """The prelude's values for those of ``names`` it provides (see the module docstring)."""
    import torch

    made: dict[str, Any] = {}
    torch.manual_seed(0)
    if names & {"state", "state_dict"}:
        net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        adamw = torch.optim.AdamW(net.parameters())
        net(torch.randn(8, 64)).square().mean().backward()
        adamw.step()
        made["state"] = {"model": net.state_dict(), "optimizer": adamw.state_dict(), "step": 1000}
        made["state_dict"] = {"model": net.state_dict(), "optimizer": adamw.state_dict()}
    if names & {"GPTModule", "model", "data", "optimizer", "scheduler"}:
        made.update(_lightning_names())
        made["optimizer"] = torch.optim.AdamW(made["model"].parameters(), lr=1e-3)
        made["scheduler"] = torch.optim.lr_scheduler.StepLR(made["optimizer"], step_size=100)
    if "progress" in names:
        made["progress"] = _Progress()
    return {k: v for k, v in made.items() if k in names}


class _Progress:
    """What a training loop registers for checkpointing besides the model: a counter."""

    def __init__(self) -> None:
        self.batches = 0

    def state_dict(self) -> dict[str, int]:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batches = state["batches"]


def _lightning_names() -> dict[str, Any]:
    import lightning as L
    import torch

    class GPTModule(L.LightningModule):
        """A tiny byte-level language model: embedding, one linear layer to the next byte's logits."""

        def __init__(self, dim: int = 32) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.embed = torch.nn.Embedding(256, dim)
            self.head = torch.nn.Linear(dim, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(x))

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            logits = self(batch[:, :-1])
            return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Bytes(L.LightningDataModule):
        """One batch of 4 x 64 bytes of text an epoch."""

        def train_dataloader(self) -> torch.utils.data.DataLoader:
            text = torch.tensor(list((b"lightning-nvcomp " * 16)[:256]), dtype=torch.long).view(4, 64)
            return torch.utils.data.DataLoader(text, batch_size=4)

    return {"GPTModule": GPTModule, "model": GPTModule(), "data": Bytes()}


# running one block ------------------------------------------------------------------------------------------------


def main(markdown: str, line: int, gpu: bool) -> None:
    """Run the Python block of ``markdown`` whose opening fence is on ``line``, as :func:`run` describes. Nothing of
    lightning_nvcomp is imported before the block: importing it has effects (``torch.load`` learns its decoder)."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p).resolve() != here]  # the reader's sys.path, not the tests'
    found = [b for b in blocks(markdown, "python") if b.line == line]
    if not found:
        sys.exit(f"{markdown}:{line}: no python block opens on this line")
    code = substituted(found[0].code, gpu)
    names = set(re.findall(r"[A-Za-z_]\w*", code))
    namespace = {"__name__": "__main__", **prelude(names)}
    # line numbers in tracebacks are the markdown file's
    exec(compile("\n" * line + code, str(found[0].path), "exec"), namespace)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), gpu="--gpu" in sys.argv[3:])
