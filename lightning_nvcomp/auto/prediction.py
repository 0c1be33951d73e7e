"""The model behind ``codec="auto"`` (see docs/guides/codec-and-durability.md): what a save with each codec costs,
and which one wins (:class:`~lightning_nvcomp.auto.policy.CodecPolicy` measures the inputs and learns them from real
saves). A save of ``R`` raw bytes with a codec of ratio ``r`` and encode throughput ``E`` to storage that takes ``W``
bytes/s per writer costs

* ``encode = R / E`` and ``write = R / r / W``; ``E`` covers what training waits for: GPU coding and the copy of
  the compressed bytes to host memory (their CRC-32 runs on CPU threads while the next bytes are coded and written);
* sync mode: segments are written while the next ones are coded, so training is blocked about
  ``max(encode, write)`` (the file is durable when the save returns);
* async mode: training is blocked ``encode`` (the snapshot is in host memory), plus any part of the previous write
  still running when the next save starts: ``max(0, write - interval)``, the interval given or observed, plus what
  training loses running slower while the write runs behind it: ``min(write, interval) * s / (1 + s)`` where its
  steps take ``1 + s`` times as long meanwhile (measured; 0 until then). The run's last checkpoint
  (:attr:`~lightning_nvcomp.auto.policy.CodecPolicy.run_ending`) is decided as if the next save came at once: the run
  waits for its write before it ends.

The codec that loses the least training time wins; a tie (see :func:`choose`) goes to the smaller file, then to the
checkpoint durable sooner; the chosen prediction says which rule decided (:attr:`Prediction.reason`). Uncompressed
saves (``none``) have ``r = 1`` and ``E`` = the device-to-host copy rate (``inf`` for CPU state).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lightning_nvcomp.auto.calibration import CodecProfile
from lightning_nvcomp.options import Codec

#: Predicted losses within TIE_FRACTION of the least, or within TIE_S when that is at most TIE_INTERVAL_FRACTION of
#: the interval between saves, are a tie (the model is not more precise than that): won by the smaller file, then
#: by the sooner durable checkpoint.
TIE_FRACTION = 0.05
TIE_S = 0.1
TIE_INTERVAL_FRACTION = 0.01
#: Ratios within this fraction count as equal (a sample's ratios are not more precise than that).
_RATIO_TIE = 0.01


def slowed_seconds(slowdown: float, behind_s: float) -> float:
    """Training time lost over ``behind_s`` seconds of writing behind it when its steps take ``1 + slowdown`` times
    as long meanwhile: the steps it would have run in that time, less those it ran."""
    return behind_s * slowdown / (1 + slowdown)


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of one save with one codec (seconds): ``blocked_s`` is the training time it loses (the save
    itself, and for an async save the wait it causes at the next one)."""

    codec: Codec
    ratio: float
    encode_s: float
    write_s: float
    blocked_s: float
    #: The other candidates' predictions at the decision that chose this one (why it was chosen).
    alternatives: tuple[Prediction, ...] = ()
    #: Why the decision chose this one, in words: the rule that decided (see :func:`choose`) or the policy's trial of
    #: a close runner-up; "" for a prediction no decision chose.
    reason: str = ""

    @classmethod
    def from_dict(cls, fields: dict) -> Prediction:
        """The prediction ``dataclasses.asdict`` made ``fields`` of (its alternatives dicts too)."""
        return cls(**{**fields, "alternatives": tuple(cls.from_dict(a) for a in fields.get("alternatives", ()))})

    @property
    def durable_s(self) -> float:
        """Seconds until the checkpoint is written, at most (a sync save overlaps the coding and the writes)."""
        return self.encode_s + self.write_s


def predict(
    raw_nbytes: int,
    profile: CodecProfile,
    write_gbps: float,
    mode: str = "sync",
    interval_s: float | None = None,
    slowdown: float = 0.0,
) -> Prediction:
    """Predict what saving ``raw_nbytes`` with ``profile``'s codec costs in ``mode`` ("sync" or "async"), where
    training steps take ``1 + slowdown`` times as long while an async save's write runs behind them."""
    if mode not in ("sync", "async"):
        raise ValueError(f"mode must be 'sync' or 'async', not {mode!r}")
    if write_gbps <= 0 or raw_nbytes < 0:
        raise ValueError(f"write bandwidth ({write_gbps} GB/s) must be positive and size ({raw_nbytes}) >= 0")
    encode_s = raw_nbytes / (profile.encode_gbps * 1e9) if math.isfinite(profile.encode_gbps) else 0.0
    write_s = raw_nbytes / profile.ratio / (write_gbps * 1e9)
    if mode == "sync":
        blocked = max(encode_s, write_s)
    else:
        interval = interval_s if interval_s is not None else math.inf
        blocked = encode_s + max(0.0, write_s - interval) + slowed_seconds(slowdown, min(write_s, interval))
    return Prediction(profile.codec, profile.ratio, encode_s, write_s, blocked)


def choose(predictions: list[Prediction], interval_s: float | None = None) -> Prediction:
    """The prediction that loses the least training time, where a tie (within :data:`TIE_FRACTION` of the least,
    or :data:`TIE_S` when saves are ``interval_s`` apart, at most :data:`TIE_INTERVAL_FRACTION` of it) is won by
    the smaller file (ratios within 1% are equal), then by the sooner durable checkpoint. Its
    :attr:`~Prediction.reason` names the rule that decided."""
    if not predictions:
        raise ValueError("no codec to choose from")
    best = min(p.blocked_s for p in predictions)
    absolute = min(TIE_S, TIE_INTERVAL_FRACTION * interval_s) if interval_s is not None else 0.0
    relative = TIE_FRACTION * best
    close = [p for p in predictions if p.blocked_s <= best + max(absolute, relative) + 1e-9]
    top = max(p.ratio for p in close)
    smallest = [p for p in close if p.ratio * (1 + _RATIO_TIE) >= top]
    chosen = min(smallest, key=lambda p: (p.durable_s, p.blocked_s))
    tied = [p for p in close if p is not chosen]
    within = format_seconds(absolute) if absolute > relative else f"{TIE_FRACTION:.0%}"
    if len(predictions) == 1:
        reason = "the only candidate"
    elif not tied:
        reason = f"the least, no other within {within} of it"
    else:
        tie = f"a tie with {', '.join(p.codec for p in tied)} (within {within} of the least)"
        if len(smallest) == 1:
            ratios = ", ".join(f"{p.codec} {p.ratio:.3f}x" for p in tied)
            reason = f"{tie}, won by the smaller file ({chosen.ratio:.3f}x; {ratios})"
        else:
            durable = ", ".join(f"{p.codec} {format_seconds(p.durable_s)}" for p in smallest if p is not chosen)
            reason = (
                f"{tie} and ratios within {_RATIO_TIE:.0%}, won by the checkpoint durable sooner "
                f"({format_seconds(chosen.durable_s)}; {durable})"
            )
    return replace(chosen, reason=reason)


def format_seconds(s: float) -> str:
    """``12.35 s``, ``0.42 s``, ``28.5 ms``, ``-3.1 ms``: milliseconds under a tenth of a second."""
    return f"{s:.2f} s" if abs(s) >= 0.1 else f"{s * 1e3:.1f} ms"
