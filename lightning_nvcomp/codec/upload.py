"""Host bytes onto a GPU, checksummed on the way (:func:`checked_upload`).

A blob read from a file lies in pageable memory (often the file's own mapping): ``.to(gpu)`` copies it through the
driver's bounce buffers on one thread, after a separate pass has checksummed it. Here the blob is cut into pieces,
each copied into one of a few pinned buffers (:class:`UploadRing`) on the CRC threads and checksummed as it is copied
(its bytes read once), and each landed piece is sent to the GPU asynchronously while the next ones are copied.
"""

from __future__ import annotations

import collections
import threading

import torch

from lightning_nvcomp._process import shared
from lightning_nvcomp.codec import checksum as checksums
from lightning_nvcomp.codec.pinned import host_memory

#: The bytes of each piece, and of each of the ring's buffers.
PIECE_NBYTES = 16 << 20
#: The ring's buffers: pieces being copied into host memory while earlier ones are sent to the GPU.
RING_SIZE = 8


class UploadRing:
    """A few host buffers that pieces of blobs pass through on their way to a GPU, pinned where CUDA lets them be
    (else pageable: each send then waits for its copy); one upload at a time.

    Args:
        piece_nbytes: the size of each buffer. size: how many there are. pin: pin them (default: when CUDA is there).
    """

    def __init__(self, piece_nbytes: int = PIECE_NBYTES, size: int = RING_SIZE, pin: bool | None = None) -> None:
        pin = torch.cuda.is_available() if pin is None else pin
        try:
            self.buffers = [host_memory(piece_nbytes, pin) for _ in range(size)]
        except RuntimeError:  # pinning refused (a locked-memory limit, say): pageable buffers still work
            self.buffers = [host_memory(piece_nbytes, False) for _ in range(size)]
        self.piece_nbytes = piece_nbytes
        self._sent: list[torch.cuda.Event | None] = [None] * size  # the last send out of each buffer
        self._lock = threading.Lock()

    def upload(self, blob: torch.Tensor, device: torch.device, algorithm: str) -> tuple[torch.Tensor, int]:
        """``blob`` (1-D uint8, in host memory) copied to ``device``, and its CRC (``algorithm``'s, as
        :mod:`~lightning_nvcomp.codec.checksum` names them), computed from the bytes copied. Work queued on the device's
        current stream after this call sees the bytes."""
        out = torch.empty(blob.numel(), dtype=torch.uint8, device=device)
        with self._lock:
            crc = 0
            staging: collections.deque = collections.deque()  # (its start, its buffer, its copy and checksum)
            try:
                for piece, start in enumerate(range(0, blob.numel(), self.piece_nbytes)):
                    slot = piece % len(self.buffers)
                    if len(staging) == len(self.buffers):  # every buffer taken: send the oldest piece first
                        crc = self._send(staging.popleft(), out, crc, algorithm)
                    sent = self._sent[slot]
                    if sent is not None:  # its bytes may still be on their way to the GPU
                        sent.synchronize()
                    n = min(self.piece_nbytes, blob.numel() - start)
                    copying = checksums.submit(
                        checksums.copy_checked, blob[start : start + n], [(0, self.buffers[slot][:n])], algorithm
                    )
                    staging.append((start, slot, copying))
                while staging:
                    crc = self._send(staging.popleft(), out, crc, algorithm)
            finally:
                for _, _, copying in staging:  # after a failure: no thread still writes into a buffer
                    copying.exception()
        return out, crc

    def _send(self, staged: tuple, out: torch.Tensor, crc: int, algorithm: str) -> int:
        start, slot, copying = staged
        piece_crc = copying.result()
        n = min(self.piece_nbytes, out.numel() - start)
        out[start : start + n].copy_(self.buffers[slot][:n], non_blocking=True)
        if out.device.type == "cuda":
            self._sent[slot] = torch.cuda.Event()
            self._sent[slot].record(torch.cuda.current_stream(out.device))
        return checksums.combine(crc, piece_crc, n, algorithm)


def checked_upload(blob: torch.Tensor, device: torch.device, algorithm: str) -> tuple[torch.Tensor, int]:
    """``blob`` (1-D uint8, host memory) on ``device`` (a GPU), and its CRC: see :meth:`UploadRing.upload` (through the
    process's ring, ``upload-ring``)."""
    return shared("upload-ring", UploadRing).upload(blob, device, algorithm)
