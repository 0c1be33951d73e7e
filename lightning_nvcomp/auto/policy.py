"""What ``codec="auto"`` means: measure the storage and the codecs, predict each codec's save time
(:mod:`~lightning_nvcomp.auto.prediction`, the model), pick the one that loses the least training time, and learn from
every real save (:class:`CodecPolicy`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Hashable
from dataclasses import replace

import torch

from lightning_nvcomp._process import shared
from lightning_nvcomp.auto.calibration import CodecProfile, bulk_device, calibrate, candidate_codecs, sample_state
from lightning_nvcomp.auto.prediction import Prediction, choose, predict
from lightning_nvcomp.auto.probe import FALLBACK_GBPS, PROBE_NBYTES, measure_bandwidth
from lightning_nvcomp.options import Codec
from lightning_nvcomp.storage import StorageBackend, storage_for
from lightning_nvcomp.storage.local import Storage
from lightning_nvcomp.storage.remote.options import RemoteOptions

log = logging.getLogger(__name__)

#: Weight of a real checkpoint write in the moving average of a directory's write bandwidth: a probe that was wrong
#: (a burst allowance, a cache) is mostly corrected by the first real write (80%), within 4% by the second.
EMA_WEIGHT = 0.8
#: Weight of a real save's ratio and coding time in its codec's profile: a calibration that was wrong is mostly
#: corrected by the next save (80%) and within 4% of its error by the one after. A run's first save pays one-off costs
#: whichever codec makes it (0.3-0.5 s more for 3 GB on the H200, with gANS and raw alike, none of it pinning or CUDA
#: allocation: round 11), so its coding time only corrects a calibration that was too slow.
PROFILE_WEIGHT = 0.8
#: A runner-up predicted within this fraction of the chosen codec's blocked time is tried, once, at the next
#: decision when no real save has measured it yet, else when it has not been used for :data:`RETRY_EVERY` decisions:
#: its profile is refined by a real save too (only used codecs are), so that a close call is decided on real saves.
RETRY_CLOSE = 0.10
RETRY_EVERY = 10
#: Writes smaller than this do not refine the estimate: their time is mostly fsync latency, not bandwidth.
MIN_OBSERVED_NBYTES = 64 << 20
#: Weight of a new interval between saves in their moving average.
INTERVAL_WEIGHT = 0.5


def _per_byte(gbps: float) -> float:
    """Seconds per byte of a throughput in GB/s (0 for an instant one: inf GB/s)."""
    return 1 / (gbps * 1e9) if math.isfinite(gbps) else 0.0


def _gbps(per_byte: float) -> float:
    """The throughput in GB/s of ``per_byte`` seconds per byte (inf for 0)."""
    return 1 / per_byte / 1e9 if per_byte > 0 else math.inf


class CodecPolicy:
    """Chooses the codec for each save from measured storage bandwidth and codec throughput.

    Measurements are cached for the run: the storage probe per file system or bucket (a new checkpoint directory on
    the same disk, or in the same bucket, is not probed again; refined by every large real write through :meth:`observe_write`), the codec
    calibration per (device, dtypes). A probe that had to be skipped (too little free space, a failed probe write:
    see :func:`measure_bandwidth`) leaves :data:`FALLBACK_GBPS` assumed for that file system until the first real
    write there is observed, which replaces it.

    Args:
        mode: ``"sync"`` or ``"async"`` - which time matters (see the module docstring).
        interval_s: seconds between saves, for async mode (a write longer than that blocks the next save).
        probe_nbytes: largest size of the storage probe (it is bounded by the checkpoint's size and the free space).
        storage: how local files are written (for the probe); the default writes them durably. A directory that
            is a URL (``s3://bucket/run``) is probed through its remote storage, made with ``remote``.
        write_gbps: skip the probe and use this bandwidth (e.g. known shared-storage bandwidth per writer).
        profiles: skip calibration and use these codec measurements (e.g. from an earlier run or for what-ifs).
        collective: every rank saves (sharded checkpoints): probe together (see :func:`probe_bandwidth`).
        per_tensor: the saves code every tensor by itself (DCP items): calibrate on whole tensors, one codec call
            each, so that per-call costs count as they will.
        remote: how URL directories are reached (:class:`~lightning_nvcomp.storage.remote.RemoteOptions`; default ones).
    """

    def __init__(
        self,
        mode: str = "sync",
        interval_s: float | None = None,
        probe_nbytes: int = PROBE_NBYTES,
        storage: StorageBackend | None = None,
        write_gbps: float | None = None,
        profiles: list[CodecProfile] | None = None,
        collective: bool = False,
        per_tensor: bool = False,
        remote: RemoteOptions | None = None,
    ) -> None:
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', not {mode!r}")
        if probe_nbytes <= 0 or (write_gbps is not None and write_gbps <= 0):
            raise ValueError("probe_nbytes and write_gbps must be positive")
        self.mode, self.interval_s, self.probe_nbytes = mode, interval_s, probe_nbytes
        self.storage: StorageBackend = storage or Storage()
        self.remote = remote
        self._fixed_gbps = write_gbps
        self._bandwidth: dict[Hashable, float] = {}  # by file system or bucket (StorageBackend.bandwidth_key)
        self._assumed: set[Hashable] = set()  # those whose bandwidth is FALLBACK_GBPS, not measured
        self._fixed_profiles = profiles
        #: The seconds spent probing file systems' bandwidth and calibrating codecs so far: one-off measurements,
        #: which a save reports apart from its own time (``probe_s``).
        self.measuring_s = 0.0
        self.collective, self.per_tensor = collective, per_tensor
        self._profiles: dict[tuple, list[CodecProfile]] = {}
        #: The last :meth:`decide`'s result (the chosen codec's prediction, every candidate's): why auto chose.
        self.last_decision: tuple[Prediction, list[Prediction]] | None = None
        self._last_key: tuple | None = None  # the calibration the last decision used
        self._decisions = 0
        self._used: dict[Codec, int] = {}  # codec -> the number of the last decision that chose it
        self._measured: set[Codec] = set()  # codecs a real save has refined (observe_save)
        self._learnt: set[Codec] = set()  # those a save after the run's first has (its first may only speed them up)
        # By calibration key: the calibration as measured (not refined), and what real saves took per raw byte beyond
        # their codec's calibration (see observe_save).
        self._calibrated: dict[tuple, dict[Codec, CodecProfile]] = {}
        self._excess: dict[tuple, float] = {}
        self._observed_interval: float | None = None  # moving average of the seconds between saves
        self._last_start: float | None = None  # when the last save started (save_started)
        #: How much longer training steps take while a write runs behind them (:meth:`observe_slowdown`).
        self.slowdown = 0.0
        #: The run ends after the saves still to come (the Lightning savings callback sets it at the fit's last step
        #: or epoch): it waits for their writes, so an async save is decided by its time to be written, as if the
        #: next save came at once, and no runner-up is tried.
        self.run_ending = False

    def in_mode(self, mode: str, interval_s: float | None = None) -> CodecPolicy:
        """A policy for ``mode`` that shares this one's measurements (probe and calibration happen once)."""
        other = CodecPolicy(
            mode,
            interval_s,
            self.probe_nbytes,
            self.storage,
            self._fixed_gbps,
            self._fixed_profiles,
            self.collective,
            self.per_tensor,
            self.remote,
        )
        other._bandwidth, other._profiles, other._assumed = self._bandwidth, self._profiles, self._assumed
        # the profiles they refine are shared, and so is what refined them
        other._measured, other._learnt = self._measured, self._learnt
        other._calibrated, other._excess = self._calibrated, self._excess
        other._observed_interval, other.slowdown = self._observed_interval, self.slowdown
        return other

    def write_gbps(self, directory: str, raw_nbytes: int | None = None) -> float:
        """The write bandwidth per writer of the file system holding ``directory`` (probed there once, then a
        moving average of real writes).

        Args:
            directory: where the checkpoint goes.
            raw_nbytes: the size of the checkpoint about to be saved, if known: the first probe writes no more
                than that (nor less than ``MIN_PROBE_NBYTES``). With ``collective``, every rank must call this
                together the first time, as for :func:`measure_bandwidth`.
        """
        if self._fixed_gbps is not None:
            return self._fixed_gbps
        storage = self.storage_of(directory)
        key = storage.bandwidth_key(directory)
        if key not in self._bandwidth:
            begin = time.perf_counter()
            measured = measure_bandwidth(directory, self.probe_nbytes, storage, self.collective, raw_nbytes)
            self.measuring_s += time.perf_counter() - begin
            if measured is None:
                self._assumed.add(key)
            self._bandwidth[key] = FALLBACK_GBPS if measured is None else measured
        return self._bandwidth[key]

    def storage_of(self, directory: str) -> StorageBackend:
        """The storage ``directory`` is on: :attr:`storage` for a local path, the remote storage of a URL."""
        return storage_for(directory, self.remote, self.storage)

    def _key(self, directory: str) -> Hashable:
        return self.storage_of(directory).bandwidth_key(directory)

    def knows_bandwidth(self, directory: str) -> bool:
        """Whether :meth:`write_gbps` of ``directory`` answers without probing (given, probed, or assumed)."""
        return self._fixed_gbps is not None or self._key(directory) in self._bandwidth

    def bandwidth_assumed(self, directory: str) -> bool:
        """Whether the bandwidth of ``directory``'s file system is :data:`FALLBACK_GBPS`, assumed for a skipped
        probe, and no real write there has been observed yet."""
        return self._fixed_gbps is None and self._key(directory) in self._assumed

    def observe_write(self, directory: str, nbytes: int, seconds: float) -> None:
        """Fold a real checkpoint write into the bandwidth estimate of ``directory``'s file system: into the moving
        average when it is large enough to tell (``MIN_OBSERVED_NBYTES``); in place of an assumed bandwidth
        (:data:`FALLBACK_GBPS`) whatever its size, since any measurement beats an assumption."""
        key = self._key(directory)
        if seconds <= 0 or key not in self._bandwidth:
            return
        if key in self._assumed:
            if nbytes > 0:
                self._bandwidth[key] = nbytes / seconds / 1e9
                self._assumed.discard(key)
        elif nbytes >= MIN_OBSERVED_NBYTES:
            self._bandwidth[key] = (1 - EMA_WEIGHT) * self._bandwidth[key] + EMA_WEIGHT * nbytes / seconds / 1e9

    def profiles(self, tensors: list[torch.Tensor]) -> list[CodecProfile]:
        """Codec calibration on a sample of ``tensors`` (cached per device and dtypes)."""
        if self._fixed_profiles is not None:
            key: tuple = ("given",)
            self._profiles.setdefault(key, list(self._fixed_profiles))
        else:
            device = bulk_device(tensors)
            tensors = [t for t in tensors if t.device == device]  # e.g. AdamW's CPU step counters: too small to matter
            key = (str(device), tuple(sorted({str(t.dtype) for t in tensors})))
            if key not in self._profiles:
                begin = time.perf_counter()
                codecs = candidate_codecs(device)
                samples = sample_state(tensors, per_tensor=self.per_tensor)
                self._profiles[key] = calibrate(samples, codecs)
                self.measuring_s += time.perf_counter() - begin
        self._calibrated.setdefault(key, {p.codec: p for p in self._profiles[key]})
        self._last_key = key
        return self._profiles[key]

    def calibrated(self) -> bool:
        """Whether :meth:`profiles` has measured (or been given) codec profiles for some state already."""
        return bool(self._profiles) or self._fixed_profiles is not None

    def observe_save(self, codec: Codec, raw_nbytes: int, stored_nbytes: int, encode_s: float) -> None:
        """Fold a real save's figures into its codec's profile (the calibration the last :meth:`decide` used), with
        weight :data:`PROFILE_WEIGHT`: its ratio, and its coding time per byte (what training waited for to have
        the coded bytes; from the run's first save only if it is faster than the profile's, see
        :data:`PROFILE_WEIGHT`).

        Every real save but the run's first also says how far real saves run past the calibration, which times the
        codec alone: the save's own work (the checkpoint's structure, its checksums, the snapshot) costs every
        codec alike. That excess, learnt with the same weight, is added to the codecs no real save after the run's
        first has measured yet (see :meth:`decide`): else the codec measured looks slower than one only calibrated,
        and auto tries the other for no reason (on a 2-core CPU a real zstd save ran at 0.19-0.26 GB/s against
        1.0-1.1 calibrated, a `none` save took 0.07-0.23 s against 0 predicted: round 11)."""
        key = self._last_key
        profiles = self._profiles.get(key) if key is not None else None
        if key is None or not profiles or raw_nbytes <= 0 or stored_nbytes <= 0:
            return
        first = not self._measured
        for i, old in enumerate(profiles):
            if old.codec != codec:
                continue
            w = PROFILE_WEIGHT
            ratio = (1 - w) * old.ratio + w * raw_nbytes / stored_nbytes
            # In seconds per byte, where an instant coder (none on the CPU: inf GB/s) is 0.
            calibrated, measured = _per_byte(old.encode_gbps), max(encode_s, 0.0) / raw_nbytes
            if first:
                measured = min(measured, calibrated)
            else:
                excess = measured - _per_byte(self._calibrated[key][codec].encode_gbps)
                self._excess[key] = (1 - w) * self._excess.get(key, 0.0) + w * excess
                self._learnt.add(codec)
            self._measured.add(codec)
            gbps = _gbps((1 - w) * calibrated + w * measured)
            profiles[i] = CodecProfile(codec, ratio, gbps)
            if abs(ratio / old.ratio - 1) > 0.1 or (
                math.isfinite(old.encode_gbps) and not 0.5 < gbps / old.encode_gbps < 2
            ):
                log.info(
                    "auto: %s measured %.3fx at %.2f GB/s in a real save, calibrated %.3fx at %.2f GB/s: corrected",
                    codec,
                    raw_nbytes / stored_nbytes,
                    raw_nbytes / max(encode_s, 1e-12) / 1e9,
                    old.ratio,
                    old.encode_gbps,
                )

    def _expected(self, profile: CodecProfile) -> CodecProfile:
        """``profile`` as a real save would measure it: a codec no real save but the run's first has measured yet
        (that one only corrects a calibration too slow) gets the excess real saves showed over their calibration
        (see :meth:`observe_save`)."""
        excess = self._excess.get(self._last_key, 0.0) if self._last_key is not None else 0.0
        if profile.codec in self._learnt or excess == 0:
            return profile
        return replace(profile, encode_gbps=_gbps(_per_byte(profile.encode_gbps) + excess))

    def save_started(self, now: float | None = None) -> None:
        """Note that a checkpoint's save starts (``now``: its ``time.perf_counter()``): the seconds since the previous
        one started are an interval between saves (:meth:`observe_interval`)."""
        now = time.perf_counter() if now is None else now
        if self._last_start is not None:
            self.observe_interval(now - self._last_start)
        self._last_start = now

    def run_started(self, now: float | None = None) -> None:
        """Note that a run (a fit) starts (``now``: its ``time.perf_counter()``): the interval to its first save is
        counted from here, so that the first save is decided knowing about how far apart saves come (the Lightning
        savings callback calls this at the fit's start; until then the first interval is unknown)."""
        self._last_start = time.perf_counter() if now is None else now

    def observe_interval(self, seconds: float) -> None:
        """Fold the seconds between the starts of two saves into the interval the predictions use (unless one was
        given)."""
        if seconds > 0:
            old = self._observed_interval
            self._observed_interval = (
                seconds if old is None else (1 - INTERVAL_WEIGHT) * old + INTERVAL_WEIGHT * seconds
            )

    def observe_slowdown(self, slowdown: float | None) -> None:
        """Use the slowdown of training while writes run behind it, as measured now (a
        :meth:`~lightning_nvcomp.auto.steps.StepTimer.slowdown`; None: not measured, keep the last)."""
        if slowdown is not None:
            self.slowdown = max(0.0, slowdown)

    @property
    def interval(self) -> float | None:
        """The seconds between saves the predictions use: the given ``interval_s``, else the observed ones."""
        return self.interval_s if self.interval_s is not None else self._observed_interval

    def decide(self, tensors: list[torch.Tensor], directory: str) -> tuple[Prediction, list[Prediction]]:
        """The chosen codec's prediction and every candidate's, for saving ``tensors`` into ``directory``."""
        raw = sum(t.numel() * t.element_size() for t in tensors)
        gbps = self.write_gbps(directory, raw)  # a first probe no larger than this checkpoint
        # A sync save waits for its write anyway: the run's end changes nothing in its prediction (nor its tie).
        interval = 0.0 if self.run_ending and self.mode == "async" else self.interval
        profiles = [self._expected(p) for p in self.profiles(tensors)]
        predictions = [predict(raw, p, gbps, self.mode, interval, self.slowdown) for p in profiles]
        # Until the interval is known, an async save's write is predicted to end before the next save (as if the
        # interval were endless): so is its tie tolerance, else a GPU coder's few ms lose the first save to `none`.
        tie_interval = math.inf if interval is None and self.mode == "async" else interval
        chosen = choose(predictions, tie_interval)
        self._decisions += 1
        close = [
            p
            for p in predictions
            if not self.run_ending
            and p.codec != chosen.codec
            and p.blocked_s <= chosen.blocked_s * (1 + RETRY_CLOSE) + 1e-9
            and (
                (chosen.codec in self._measured and p.codec not in self._measured and p.codec not in self._used)
                or self._decisions - self._used.get(p.codec, 0) >= RETRY_EVERY
            )
        ]
        if close:
            runner_up = min(close, key=lambda p: p.blocked_s)
            why = "not yet measured" if runner_up.codec not in self._measured else f"unused for {RETRY_EVERY} saves"
            log.info(
                "auto: trying %s (predicted %.3f s blocked) instead of %s (%.3f s) to measure it: within %d%%, %s",
                runner_up.codec,
                runner_up.blocked_s,
                chosen.codec,
                chosen.blocked_s,
                round(RETRY_CLOSE * 100),
                why,
            )
            reason = (
                f"tried instead of {chosen.codec} to measure it in a real save (predicted within {RETRY_CLOSE:.0%} "
                f"of it, {why})"
            )
            chosen = replace(runner_up, reason=reason)
        self._used[chosen.codec] = self._decisions
        chosen = replace(chosen, alternatives=tuple(p for p in predictions if p.codec != chosen.codec))
        self.last_decision = (chosen, predictions)
        return self.last_decision


def default_policy() -> CodecPolicy:
    """The policy ``codec="auto"`` uses when none is given: sync mode, measurements cached for the process."""
    return shared("policy", CodecPolicy)


def resolve_codec(
    codec: Codec, tensors: list[torch.Tensor], directory: str, policy: CodecPolicy | None = None
) -> tuple[Codec, Prediction | None]:
    """The codec a save of ``tensors`` into ``directory`` uses, and for ``auto`` the prediction behind it.

    Args:
        codec: ``ANS``, ``ZSTD``, ``NONE``: that codec; ``AUTO``: ``policy`` (default: this process's
            :func:`default_policy`) measures the storage and the codecs and predicts the fastest save.
    """
    if codec is not Codec.AUTO:
        return codec, None
    policy = policy or default_policy()
    chosen, _ = policy.decide(tensors, directory)
    return chosen.codec, chosen
