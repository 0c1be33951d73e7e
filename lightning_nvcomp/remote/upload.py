"""How a file written to remote storage becomes visible under its final name only once it is complete.

An :class:`Upload` is the writable stream a save codes into; :meth:`Upload.commit` makes the file appear whole under
its name, :meth:`Upload.abort` gives up and leaves no new object (the previous one, if any, untouched). Three ways,
picked by :func:`open_upload` from :attr:`RemoteOptions.upload` (``auto``: by the URL's protocol):

* :class:`MultipartUpload` (``s3://``): parts of :attr:`RemoteOptions.part_nbytes` go up in parallel on threads while
  the caller writes (codes) the next ones; ``CompleteMultipartUpload`` makes the object, ``AbortMultipartUpload``
  discards the parts. A file smaller than one part is one ``PutObject``.
* :class:`RenameUpload` (``hdfs://``, ``file://``): streamed to a hidden temporary name beside the target (the local
  storage's pattern), renamed over it when complete, removed on failure.
* :class:`SpooledPut` (``gs://``, ``abfs://``, ``memory://``...): spooled to a local temporary file, then one
  ``put_file``, which those stores make visible only once the whole upload is done.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from lightning_nvcomp.remote.options import RemoteOptions
from lightning_nvcomp.temp_names import own_name

log = logging.getLogger(__name__)

#: The upload of each protocol under ``upload="auto"``; any other protocol gets ``"put"``.
AUTO_UPLOADS = {
    "s3": "multipart",
    "s3a": "multipart",
    "hdfs": "rename",
    "webhdfs": "rename",
    "viewfs": "rename",
    "file": "rename",
    "local": "rename",
}
#: Parts grow to twice :attr:`RemoteOptions.part_nbytes` every this many parts (S3 takes at most 10,000).
PARTS_PER_SIZE = 1000


class Upload(Protocol):
    """A file being written to remote storage: ``write``, ``tell`` and ``flush`` as a binary file's (``flush``
    makes nothing durable), then ``commit`` (the file appears whole under its name) or ``abort`` (nothing new
    appears)."""

    def write(self, data: Any) -> int: ...

    def tell(self) -> int: ...

    def flush(self) -> None: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...


def upload_kind(protocol: str, options: RemoteOptions) -> str:
    """The upload ``options`` asks for, ``auto`` resolved by ``protocol`` (see :data:`AUTO_UPLOADS`)."""
    return options.upload if options.upload != "auto" else AUTO_UPLOADS.get(protocol, "put")


def open_upload(fs: Any, key: str, protocol: str, options: RemoteOptions, name: str) -> Upload:
    """Begin writing the file ``key`` of the fsspec file system ``fs`` (``name``: its URL, for messages).

    Raises:
        ValueError: ``upload="multipart"`` for a file system that is not S3's (s3fs).
    """
    kind = upload_kind(protocol, options)
    if kind == "multipart":
        if not hasattr(fs, "call_s3"):
            raise ValueError(f"{name}: upload='multipart' needs S3 (s3fs), not {type(fs).__name__}")
        return MultipartUpload(fs, key, options)
    if kind == "rename":
        return RenameUpload(fs, key)
    return SpooledPut(fs, key)


# -- S3 multipart ---------------------------------------------------------------------------------------------------

#: Multipart uploads whose abort failed (the server unreachable): (file system, bucket, key, upload id), retried
#: when the next multipart upload of this process begins.
_FAILED_ABORTS: list[tuple[Any, str, str, str]] = []
_FAILED_LOCK = threading.Lock()


def _abort(fs: Any, bucket: str, key: str, upload_id: str) -> None:
    """Abort a multipart upload; remember it for :func:`retry_failed_aborts` if the server cannot be reached."""
    try:
        fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
    except FileNotFoundError:  # NoSuchUpload: aborted (or completed) already
        pass
    except Exception as err:
        log.warning(
            "lightning_nvcomp: could not abort the multipart upload of s3://%s/%s (%s); it holds no object and is "
            "retried at the next upload",
            bucket,
            key,
            err,
        )
        with _FAILED_LOCK:
            _FAILED_ABORTS.append((fs, bucket, key, upload_id))


def retry_failed_aborts() -> None:
    """Abort again the multipart uploads whose abort failed earlier in this process."""
    with _FAILED_LOCK:
        pending = list(_FAILED_ABORTS)
        _FAILED_ABORTS.clear()
    for fs, bucket, key, upload_id in pending:
        _abort(fs, bucket, key, upload_id)


class MultipartUpload:
    """An S3 object written in parts, uploaded in parallel while the caller writes the next ones.

    At most ``options.max_parallel`` parts are in flight (a write waits for one to finish when that many are),
    so the upload holds at most ``max_parallel + 1`` parts in memory, never the whole file.

    Args:
        fs: an s3fs ``S3FileSystem``.
        key: ``bucket/key`` of the object.
        options: the part size and the parallelism.
    """

    def __init__(self, fs: Any, key: str, options: RemoteOptions) -> None:
        retry_failed_aborts()
        self._fs = fs
        self._bucket, self._key, _ = fs.split_path(key)
        self._extra = dict(getattr(fs, "s3_additional_kwargs", None) or {})  # server-side encryption, ACLs...
        self._base = options.part_nbytes
        self._slots = threading.BoundedSemaphore(options.max_parallel)
        self._pool = ThreadPoolExecutor(max_workers=options.max_parallel, thread_name_prefix="lnv-upload")
        self._buffer = bytearray()
        self._parts: list[Future[dict[str, Any]]] = []
        self._upload_id: str | None = None
        self._written = 0

    def _part_nbytes(self) -> int:
        return self._base << (len(self._parts) // PARTS_PER_SIZE)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        nbytes = view.nbytes
        while view.nbytes:
            room = self._part_nbytes() - len(self._buffer)
            self._buffer += view[:room]
            view = view[room:]
            if len(self._buffer) >= self._part_nbytes():
                self._send()
        self._written += nbytes
        return nbytes

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        """Nothing: parts go up as they fill, the rest at :meth:`commit`."""

    def _send(self) -> None:
        """Hand the buffered part to an upload thread (after waiting for a free slot)."""
        self._raise_failed()
        if self._upload_id is None:
            created = self._fs.call_s3("create_multipart_upload", Bucket=self._bucket, Key=self._key, **self._extra)
            self._upload_id = created["UploadId"]
        body, self._buffer = bytes(self._buffer), bytearray()
        self._slots.acquire()
        self._parts.append(self._pool.submit(self._put_part, len(self._parts) + 1, body))

    def _put_part(self, number: int, body: bytes) -> dict[str, Any]:
        try:
            sent = self._fs.call_s3(
                "upload_part",
                Bucket=self._bucket,
                Key=self._key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=body,
            )
            return {"PartNumber": number, "ETag": sent["ETag"]}
        finally:
            self._slots.release()

    def _raise_failed(self) -> None:
        """Raise the error of a part that failed already (the save stops coding at once)."""
        for part in self._parts:
            if part.done() and part.exception() is not None:
                raise part.exception()  # type: ignore[misc]

    def commit(self) -> None:
        """Complete the upload: the object appears, whole. A file smaller than one part is one ``PutObject``."""
        try:
            if self._upload_id is None:
                self._fs.call_s3(
                    "put_object", Bucket=self._bucket, Key=self._key, Body=bytes(self._buffer), **self._extra
                )
            else:
                if self._buffer:
                    self._send()
                parts = [part.result() for part in self._parts]
                self._fs.call_s3(
                    "complete_multipart_upload",
                    Bucket=self._bucket,
                    Key=self._key,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": parts},
                )
        finally:
            self._pool.shutdown(wait=True)
            self._fs.invalidate_cache(f"{self._bucket}/{self._key}")

    def abort(self) -> None:
        """Stop the part uploads and abort the multipart upload: no object is made, the previous one is kept."""
        for part in self._parts:
            part.cancel()
        self._pool.shutdown(wait=True)
        self._buffer = bytearray()
        if self._upload_id is not None:
            _abort(self._fs, self._bucket, self._key, self._upload_id)


class _ThroughFile:
    """An upload whose bytes are written to a file first (``_file``): a temporary object, or a local spool."""

    _file: Any

    def write(self, data: Any) -> int:
        return self._file.write(data)

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        self._file.flush()


# -- a temporary name, then a rename -------------------------------------------------------------------------------


class RenameUpload(_ThroughFile):
    """A file streamed to a hidden temporary name beside ``key`` (``.NAME.lnv-<host>-<pid>-<token>.tmp``, as local
    saves name theirs), renamed over ``key`` once complete (atomic on HDFS and local file systems).

    Args:
        fs: an fsspec file system with an atomic ``mv``.
        key: the file's path in ``fs``.
    """

    def __init__(self, fs: Any, key: str) -> None:
        self._fs, self._key = fs, key
        parent, _, base = key.rpartition("/")
        self._tmp = f"{parent}/{own_name(base, '.tmp')}"
        self._file = fs.open(self._tmp, "wb")

    def commit(self) -> None:
        self._file.close()
        self._fs.mv(self._tmp, self._key)
        self._fs.invalidate_cache(self._key)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()
        with contextlib.suppress(Exception):
            self._fs.rm_file(self._tmp)


# -- spooled, then one upload ----------------------------------------------------------------------------------------


class SpooledPut(_ThroughFile):
    """A file spooled to a local temporary file (in ``TMPDIR``) while it is written, then uploaded with one
    ``put_file``: the store makes it visible once the upload is complete.

    Args:
        fs: an fsspec file system.
        key: the file's path in ``fs``.
    """

    def __init__(self, fs: Any, key: str) -> None:
        self._fs, self._key = fs, key
        self._file = tempfile.NamedTemporaryFile(prefix="lightning-nvcomp-", suffix=".upload")

    def commit(self) -> None:
        try:
            self._file.flush()
            self._fs.put_file(self._file.name, self._key)
        finally:
            self._file.close()
        self._fs.invalidate_cache(self._key)

    def abort(self) -> None:
        self._file.close()
