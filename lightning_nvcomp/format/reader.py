"""Reading a checkpoint file: opened once, its zip structure and small entries checked, ``torch.load`` with the
load's decode bound, the storages of a plain ``torch.save`` file checked by their zip CRC-32s (:func:`load`)."""

from __future__ import annotations

import io
import os
import pickle
import re
import struct
import warnings
import zipfile
import zlib
from typing import Any, BinaryIO

import numpy as np
import torch

from lightning_nvcomp._process import collector_paused
from lightning_nvcomp.codec import checksum
from lightning_nvcomp.errors import CheckpointError, CorruptCheckpointError, RefusedObjectsError
from lightning_nvcomp.format.contents import find_contents
from lightning_nvcomp.format.decode import Describing, TensorInfo, _describe, _keep_on_gpu
from lightning_nvcomp.format.load_state import LoadState, _load
from lightning_nvcomp.format.zip import central_record, end_records, local_header
from lightning_nvcomp.storage import StorageBackend, storage_for


def load(
    path: str | os.PathLike,
    map_location: Any = None,
    weights_only: bool = True,
    mmap: bool | None = None,
    keep_on_gpu: bool = False,
    max_decoded_nbytes: float | None = None,
    storage: StorageBackend | None = None,
) -> Any:
    """Load a checkpoint written by :func:`save` (or any ``torch.save`` file), bit-exactly and verified.

    The file is opened once: a local load reads the file that was at ``path`` when it began, whatever replaces it
    meanwhile. At a URL, its byte ranges are read in parallel, ahead of the decoder; an object replaced while it is
    read fails the load (its checksums, or its size), never with wrong tensors. Every tensor is checked before it is returned (our records by their CRC-32s and checks, the storages
    of a plain ``torch.save`` file by the zip's CRC-32s), and so is the pickle. Returned tensors are in memory of
    their own, never pages of the file, unless ``mmap=True``: then tensors stored by plain ``torch.save`` share the
    file's pages, copy-on-write, as with ``torch.load(mmap=True)``. Compressed bytes go from the page cache to the
    decoder either way.

    Args:
        path: the checkpoint: a local path or a URL (``s3://bucket/run/last.ckpt``).
        map_location: as ``torch.load``'s; ``"cuda"`` decodes on the GPU directly. Default: the CPU.
        weights_only: as ``torch.load``'s.
        mmap: True maps plain tensors from the file (see above); None or False: they are copied.
        keep_on_gpu: with no ``map_location``, compressed tensors saved from a GPU come back on the current GPU
            when there is one, decoded there (what a resume wants: the optimizer adopts them as they are).
        max_decoded_nbytes: the most bytes the load may decode, a guard against decompression bombs
            (:class:`DecodeLimitError`): a number of bytes, or ``math.inf`` for no bound. None (the default): the
            environment variable ``LIGHTNING_NVCOMP_MAX_DECODED_BYTES`` (bytes, or ``unlimited``) if set, else 16 x
            the file's size + 256 MiB.
        storage: where ``path`` is read from (default: :func:`~lightning_nvcomp.storage.backend.storage_for` the path).

    Raises:
        CorruptCheckpointError: the file is damaged (the message names it and the tensor at fault).
        CodecUnavailableError: a codec it needs cannot run here (gANS without a GPU).
        CheckpointError: anything else about the file (not a checkpoint, refused by ``weights_only``, too large
            to decode). Errors of the machine (memory, devices, threads) pass through, the file named.

    On the main thread, Python's garbage collector is paused while the file is read (see
    :func:`~lightning_nvcomp._process.collector_paused`).
    """
    if max_decoded_nbytes is False:  # the default's old spelling (None meant no bound then)
        warnings.warn(
            "load(max_decoded_nbytes=False) is deprecated: leave it out (None) for the default bound",
            DeprecationWarning,
            stacklevel=2,
        )
        max_decoded_nbytes = None
    storage = storage or storage_for(path)
    path = os.fspath(path)
    if storage.isdir(path):
        raise IsADirectoryError(f"checkpoint {path} is a directory, not a checkpoint file")
    if not storage.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    token = _keep_on_gpu.set(keep_on_gpu and map_location is None)
    try:
        with collector_paused(), storage.open_read(path) as f:
            return read(f, path, map_location, weights_only, mmap, max_decoded_nbytes)
    finally:
        _keep_on_gpu.reset(token)


#: The start of a legacy (pre-zip) torch file: protocol 2, then the pickled magic number 0x1950a86a20f9469cfc6c.
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


_TORCH_ZIP_ERRORS = ("PytorchStreamReader", "inline_container")


_OUR_DECODERS = (b"lightning_nvcomp\ndecode_tensor\n", b"lightning_nvcomp\ndecode_storage\n")


def _fd_path(f: BinaryIO) -> str | None:
    """A path that opens the very file ``f`` has open (Linux), for torch.load(mmap=True), which wants a path."""
    try:
        fd_path = f"/proc/self/fd/{f.fileno()}"
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    return fd_path if os.path.exists(fd_path) else None


def read(
    source: BinaryIO,
    name: str,
    map_location: Any = None,
    weights_only: bool = True,
    mmap: bool | None = None,
    max_decoded_nbytes: float | None = None,
    state: LoadState | None = None,
) -> Any:
    """``torch.load`` of a seekable binary file, verified: the zip's structure and the CRC-32 of every small entry
    (the pickle among them) first, every record's checks while decoding, and the zip CRC-32s of the storages of a
    plain ``torch.save`` file after. Every failure is named after ``name``; :class:`CorruptCheckpointError` means
    damage and nothing else. See :func:`load` for the arguments; ``state``: a :class:`LoadState` shared by several
    files read as one load (the items of a DCP checkpoint: one decode bound for all of them)."""
    source.seek(0, os.SEEK_END)
    file_nbytes = source.tell()
    source.seek(0)
    pickle_bytes = _check_structure(source, name, file_nbytes)
    ours = pickle_bytes is not None and any(d in pickle_bytes for d in _OUR_DECODERS)
    state = state or LoadState(name, max_decoded_nbytes, file_nbytes)
    # Map the file only where no returned tensor can share its pages: ours decode into new memory.
    fd_path = _fd_path(source) if pickle_bytes is not None and (mmap or (mmap is None and ours)) else None
    token = _load.set(state)
    try:
        obj = torch.load(
            fd_path or source, map_location=map_location, weights_only=weights_only, mmap=fd_path is not None
        )
        foreign = _describe.get() is None and _foreign_storages(obj, state.produced)
        if foreign and pickle_bytes is not None:
            _check_data_crcs(source, name, obj)
            if fd_path is not None and not mmap:  # a file of ours with plain storages in it: load them copied
                source.seek(0)
                obj = torch.load(source, map_location=map_location, weights_only=weights_only)
        return obj
    except CheckpointError as err:
        raise type(err)(err.args[0] if str(err).startswith(name) else f"{name}: {err}") from None
    except pickle.UnpicklingError as err:
        if pickle_bytes is None or any(mark in str(err) for mark in _TORCH_ZIP_ERRORS):
            # a legacy file: its pickle has no checksum to tell damage from refusal; torch's zip reader failing:
            # torch 2.4 re-raises every RuntimeError of a weights_only load as an UnpicklingError
            raise CorruptCheckpointError(
                f"{name} cannot be read as a checkpoint (truncated or damaged?): {err}"
            ) from err
        raise RefusedObjectsError(
            f"{name} holds objects that weights_only=True does not load (its pickle is intact: this is not damage). "
            f"Allow them with torch.serialization.add_safe_globals, or, only for a file you trust, load it with "
            f"weights_only=False.\n{err}",
            name,
            tuple(dict.fromkeys(re.findall(r"GLOBAL ([\w.]+)", str(err)))),
        ) from None
    except RuntimeError as err:
        # torch's zip reader (inline_container.cc) parses the directory itself, and fails damage we let through.
        if any(mark in str(err) for mark in _TORCH_ZIP_ERRORS) or pickle_bytes is None:
            raise CorruptCheckpointError(f"{name} cannot be loaded ({err}); the file is damaged") from err
        raise _named(err, name) from err
    except Exception as err:
        if pickle_bytes is None and not isinstance(err, (MemoryError, OSError)):
            raise CorruptCheckpointError(
                f"{name} cannot be loaded ({type(err).__name__}: {err}); the legacy file may be truncated or damaged"
            ) from err
        raise _named(err, name) from err
    finally:
        _load.reset(token)


def _named(err: BaseException, name: str) -> BaseException:
    """``err`` with ``name`` in its message (same type), for errors of the machine rather than of the file."""
    try:
        named = type(err)(f"{name}: {err}")
    except Exception:
        return err
    return named


def _check_structure(f: BinaryIO, name: str, file_nbytes: int) -> bytes | None:
    """Check the zip's directory, every entry's local header and the CRC-32 of every small entry (the pickle, the
    byte order...); return the pickle's bytes. A legacy (non-zip) torch file has no checksums: None. ``f`` is left
    at its start."""
    try:
        head = f.read(len(_LEGACY_MAGIC))
        f.seek(max(file_nbytes - 22, 0))
        tail = f.read(22)  # torch writes no zip comment: the end record ends the file (read errors pass through)
        f.seek(0)
        if len(tail) < 22 or tail[:4] != b"PK\x05\x06":
            if head == _LEGACY_MAGIC:
                return None
            what = "empty" if file_nbytes == 0 else f"{file_nbytes} bytes"
            raise CorruptCheckpointError(
                f"{name} is not a checkpoint ({what}, neither a torch.save zip nor a legacy torch file): truncated "
                "or damaged, or another kind of file"
            )
        pickle_bytes = None
        with zipfile.ZipFile(f) as archive:
            infos = archive.infolist()
            top = infos[0].filename.split("/", 1)[0] if infos else ""
            headers = []
            for info in infos:
                if info.filename.split("/", 1)[0] != top or not 0 <= info.header_offset < file_nbytes:
                    raise CorruptCheckpointError(f"{name}: the zip directory entry {info.filename!r} is damaged")
                f.seek(info.header_offset)
                header = f.read(30)
                header += f.read(sum(struct.unpack("<HH", header[26:30])) if len(header) == 30 else 0)
                # torch writes and reads stored entries only: another method or sizes that differ or reach past
                # the file are damage (torch 2.4's reader allocates a damaged size before it fails)
                if (
                    info.compress_type != zipfile.ZIP_STORED
                    or info.file_size != info.compress_size
                    or info.header_offset + len(header) + info.compress_size > file_nbytes
                    or not _entry_agrees(f, header, info)
                ):
                    raise CorruptCheckpointError(f"{name}: the header of entry {info.filename!r} is damaged")
                headers.append(header)
                if "/data/" in info.filename and not info.filename.endswith("serialization_id"):
                    continue  # storages: checked by their records, or after the load (plain torch.save files)
                data = archive.read(info)  # raises BadZipFile on a CRC mismatch
                if info.filename.endswith("/data.pkl"):
                    pickle_bytes = data
            if pickle_bytes is None:
                raise CorruptCheckpointError(f"{name}: the checkpoint has no pickle (data.pkl): damaged")
            if not _end_records_agree(f, archive, file_nbytes):
                raise CorruptCheckpointError(f"{name}: the zip's end records are damaged")
            # Our writer never writes data descriptors, torch.save's always does: a pickle of our decoder calls
            # that torch.save wrote (built by hand) has its headers checked as any torch.save file's.
            if any(d in pickle_bytes for d in _OUR_DECODERS) and not all(i.flag_bits & 0x08 for i in infos):
                _check_our_headers(f, name, archive, headers, file_nbytes)
        return pickle_bytes
    except CorruptCheckpointError:
        raise
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        NotImplementedError,
        EOFError,
        ValueError,
        struct.error,
        UnicodeDecodeError,
        KeyError,
    ) as err:  # zipfile's ways to fail damage
        detail = str(err) if len(str(err)) <= 300 else f"{str(err)[:300]}..."  # zipfile quotes damaged headers whole
        raise CorruptCheckpointError(
            f"{name}: the checkpoint's structure is damaged ({type(err).__name__}: {detail})"
        ) from None
    finally:
        f.seek(0)


def _name_bytes(info: zipfile.ZipInfo) -> bytes:
    """An entry's name as the zip stores it (UTF-8 when its flag says so, else code page 437, as zipfile reads it)."""
    return info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")


#: Extra fields a torch.save zip's local headers hold: zip64 sizes, and "FB" (padding to the alignment).
_ZIP64_EXTRA, _PADDING_EXTRA = 0x0001, 0x4246


def _entry_agrees(f: BinaryIO, header: bytes, info: zipfile.ZipInfo) -> bool:
    """Whether an entry's local header (``header``) and data descriptor, if any, say what the central directory
    says of it (``info``): every field both hold, sizes through the zip64 field; whether the local extra fields are
    the ones torch.save writes, well formed (zip64 sizes, "FB" padding of zeros or torch's "Z"s); and whether the
    central directory makes it a file (torch's reader reads nothing of an entry marked as a directory)."""
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        return False
    if info.external_attr & 0x10 or info.filename.endswith("/") or info.volume or info.comment:
        return False
    needed, flags, method, time, date, crc, csize, usize, nlen = struct.unpack("<HHHHHIIIH", header[4:28])
    year, month, day, hour, minute, second = info.date_time
    central = (
        info.extract_version | info.reserved << 8,
        info.flag_bits,
        info.compress_type,
        hour << 11 | minute << 5 | second // 2,
        (year - 1980) << 9 | month << 5 | day,
    )
    name = _name_bytes(info)
    if (needed, flags, method, time, date) != central or nlen != len(name) or header[30 : 30 + nlen] != name:
        return False
    extra, fields = header[30 + nlen :], {}
    while extra:
        if len(extra) < 4 or 4 + struct.unpack("<H", extra[2:4])[0] > len(extra):
            return False
        field_id, length = struct.unpack("<HH", extra[:4])
        if field_id not in (_ZIP64_EXTRA, _PADDING_EXTRA) or field_id in fields:
            return False
        fields[field_id], extra = extra[4 : 4 + length], extra[4 + length :]
    padding = fields.get(_PADDING_EXTRA, b"")
    if padding.strip(b"\0") and padding.strip(b"Z"):
        return False
    zip64 = fields.get(_ZIP64_EXTRA, b"")
    if len(zip64) % 8:
        return False
    large = list(struct.unpack(f"<{len(zip64) // 8}Q", zip64))
    sizes = [large.pop(0) if size == 0xFFFFFFFF and large else size for size in (usize, csize)]
    if not flags & 0x08:
        return crc == info.CRC and sizes == [info.file_size, info.compress_size]
    # A data descriptor follows the data (torch.save's writer): the local header holds zeros, the descriptor (its
    # signature, then 4- or 8-byte sizes) the CRC-32 and sizes.
    if (crc, csize, usize) != (0, 0, 0):
        return False
    f.seek(info.header_offset + len(header) + info.compress_size)
    descriptor = f.read(24)
    expected = [
        b"PK\x07\x08" + struct.pack(f"<I{width}{width}", info.CRC, info.compress_size, info.file_size)
        for width in ("I", "Q")
        if width == "Q" or info.file_size < 1 << 32
    ]
    return any(descriptor.startswith(e) for e in expected)


def _end_records_agree(f: BinaryIO, archive: zipfile.ZipFile, file_nbytes: int) -> bool:
    """Whether the end record (with no comment, as torch writes it) and the zip64 end record and locator, where
    present, agree with each other and with the central directory zipfile read: readers that trust one or the
    other then read the same directory."""
    count, start = len(archive.infolist()), archive.start_dir
    f.seek(file_nbytes - 22)
    sig, disk, cd_disk, on_disk, total, cd_size, cd_offset, comment = struct.unpack("<IHHHHIIH", f.read(22))
    if sig != 0x06054B50 or disk or cd_disk or comment or on_disk != total or total not in (count, 0xFFFF):
        return False
    f.seek(max(file_nbytes - 42, 0))
    locator = f.read(20) if file_nbytes >= 42 else b""
    if locator[:4] != b"PK\x06\x07":  # no zip64 records
        return total == count and cd_offset == start and start + cd_size == file_nbytes - 22
    _, z64_disk, z64_offset, disks = struct.unpack("<IIQI", locator)
    if z64_disk or disks != 1 or z64_offset != file_nbytes - 42 - 56:
        return False
    f.seek(z64_offset)
    z64 = struct.unpack("<IQHHIIQQQQ", f.read(56))
    sig64, size, _, _, disk64, cd_disk64, on_disk64, total64, cd_size64, cd_offset64 = z64
    return (
        (sig64, size, disk64, cd_disk64, on_disk64, total64, cd_offset64) == (0x06064B50, 44, 0, 0, count, count, start)
        and start + cd_size64 == z64_offset
        and cd_size in (cd_size64, 0xFFFFFFFF)
        and cd_offset in (start, 0xFFFFFFFF)
    )


def _check_our_headers(
    f: BinaryIO, name: str, archive: zipfile.ZipFile, headers: list[bytes], file_nbytes: int
) -> None:
    """A file our writer wrote (its pickle calls our decoders): every header byte, local, central and end records,
    is what :class:`~lightning_nvcomp.format.zip.ArchiveWriter` writes for these entries (names, CRC-32s, sizes,
    offsets), so a flipped bit in a field no reader uses is damage too."""
    infos = archive.infolist()
    for info, header in zip(infos, headers):
        if header != local_header(_name_bytes(info), info.CRC, info.file_size, info.header_offset):
            raise CorruptCheckpointError(f"{name}: the header of entry {info.filename!r} is damaged")
    start = archive.start_dir
    directory = b"".join(central_record(_name_bytes(i), i.CRC, i.file_size, i.header_offset) for i in infos)
    expected = directory + end_records(len(infos), start, start + len(directory))
    f.seek(start)
    if start + len(expected) != file_nbytes or f.read(len(expected)) != expected:
        raise CorruptCheckpointError(f"{name}: the zip's central directory or end records are damaged")


def check_zip(f: BinaryIO, name: str) -> None:
    """Check a ``torch.save`` zip whole without loading it: its structure and every entry's CRC-32 (``torch.load``
    checks none); :class:`CorruptCheckpointError` naming ``name`` if any fails. A legacy (non-zip) torch file has
    nothing to check."""
    f.seek(0, os.SEEK_END)
    nbytes = f.tell()
    f.seek(0)
    if _check_structure(f, name, nbytes) is not None:
        _check_data_crcs(f, name)


def _check_data_crcs(f: BinaryIO, name: str, loaded: object = None) -> None:
    """Check the zip CRC-32 of every storage entry (a plain ``torch.save`` file's tensors have no other check):
    where ``loaded`` (what ``torch.load`` returned) holds one storage, in host memory, and the zip one entry of its
    size (a DCP item), over the loaded bytes themselves; else over each entry's bytes in ``f`` (an in-memory file's
    without a copy). Large ones' pieces in parallel; :func:`_check_structure` has validated every entry's header and
    extent already."""
    try:
        with zipfile.ZipFile(f) as archive:
            entries = [i for i in archive.infolist() if "/data/" in i.filename]
        sole = _sole_host_storage(loaded, entries) if loaded is not None else None
        whole = f.getvalue() if isinstance(f, io.BytesIO) and sole is None else None  # its own bytes: not copied
        for info in entries:
            crc = checksum.crc32(sole) if sole is not None else _entry_crc32(f, info, whole)
            if crc != info.CRC:
                raise CorruptCheckpointError(
                    f"{name}: a tensor's stored bytes are damaged (entry {info.filename!r}: CRC-32 {crc:#010x}, "
                    f"recorded {info.CRC:#010x})"
                )
    except (zipfile.BadZipFile, EOFError, ValueError, struct.error) as err:
        raise CorruptCheckpointError(
            f"{name}: a tensor's stored bytes are damaged ({type(err).__name__}: {err})"
        ) from None
    finally:
        f.seek(0)


def _sole_host_storage(loaded: object, entries: list[zipfile.ZipInfo]) -> np.ndarray | None:
    """The bytes of the one storage ``loaded`` holds, if it holds one, in host memory, and ``entries`` is one entry
    of its size (so those bytes are that entry's); else None."""
    contents = find_contents(loaded)
    storages = {t.untyped_storage()._cdata: t.untyped_storage() for t in contents.tensors}
    if len(entries) != 1 or len(storages) != 1 or contents.storages:
        return None
    (storage,) = storages.values()
    if storage.device.type != "cpu" or storage.nbytes() != entries[0].file_size:
        return None
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,)).numpy()


def _entry_crc32(f: BinaryIO, info: zipfile.ZipInfo, whole: bytes | None) -> int:
    """The CRC-32 of a stored entry's bytes: in ``whole`` (the file's bytes, when in memory) without a copy, else
    read from ``f`` in pieces into one reused buffer."""
    f.seek(info.header_offset)
    start = info.header_offset + 30 + sum(struct.unpack("<HH", f.read(30)[26:30]))
    if whole is not None:
        return checksum.crc32(np.frombuffer(whole, np.uint8, info.compress_size, start))
    f.seek(start)
    nbytes = info.compress_size
    buffer = bytearray(min(nbytes, 16 << 20))
    crc = 0
    while nbytes:
        view = memoryview(buffer)[: min(nbytes, len(buffer))]
        got = f.readinto(view)  # type: ignore[attr-defined]
        if not got:
            raise EOFError(f"the file ends {nbytes} bytes early")
        crc = zlib.crc32(view[:got], crc)
        nbytes -= got
    return crc


def _foreign_storages(obj: object, produced: set[int]) -> bool:
    """Whether ``obj`` holds a storage our decoders did not make (one torch.load took from the file as it is)."""
    contents = find_contents(obj)
    keys = [t.untyped_storage()._cdata for t in contents.tensors] + list(contents.storages)
    return any(key not in produced for key in keys)


def describe(
    path: str | os.PathLike, storage: StorageBackend | None = None, *, infos: list[TensorInfo] | None = None
) -> Any:
    """Load ``path``'s structure with a :class:`TensorInfo` in place of each compressed tensor, decoding nothing
    (``storage``: as for :func:`load`).

    A tensor that torch rebuilds from other tensors (a nested tensor from its sizes, a quantized one from its scales)
    cannot be rebuilt from descriptions: its rebuild raises TypeError, AttributeError or NotImplementedError. Describe such a file with
    ``infos``: it is then loaded (decoded and checked) as :func:`load` does, and the TensorInfo of every compressed
    tensor is appended to ``infos`` as it is decoded.
    """
    describing = Describing() if infos is None else Describing(decode=True, infos=infos)
    token = _describe.set(describing)
    try:
        return load(path, map_location="cpu", mmap=infos is None, storage=storage)
    finally:
        _describe.reset(token)
