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

Every error names the URL (:mod:`lightning_nvcomp.storage.remote.errors`) and says what the failure left. A failure before
the last request leaves no new file. When the last request (``CompleteMultipartUpload``, ``PutObject``, the rename,
the ``put_file``) gets no answer, the server may have carried it out: an S3 upload then finds out from the object's
ETag before it reports (:meth:`MultipartUpload.commit`); where that cannot be found out, the save raises
:class:`~lightning_nvcomp.storage.remote.errors.OutcomeUnknownError` and never claims that the previous file is intact.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from lightning_nvcomp.storage.remote.errors import OutcomeUnknownError, maybe_applied, naming, storage_error
from lightning_nvcomp.storage.remote.options import RemoteOptions
from lightning_nvcomp.storage.temp_names import own_name

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
#: What a save that failed before its last request left.
INTACT = "Nothing was written under that name: any previous checkpoint there is intact."
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
        return MultipartUpload(fs, key, options, name)
    if kind == "rename":
        return RenameUpload(fs, key, name)
    return SpooledPut(fs, key, name)


def last_request_failed(err: Exception, name: str, request: str) -> BaseException:
    """The error of a save of ``name`` whose last request (``request``: the one that makes the file appear) failed
    with ``err``, where the storage cannot be asked whether it was carried out: a failure leaving the previous file
    if the request never reached the server or was refused, else :class:`OutcomeUnknownError`."""
    if not maybe_applied(err):
        return storage_error(err, name, "save", INTACT)
    return outcome_unknown(err, name, request, "")


def outcome_unknown(err: Exception, name: str, request: str, why: str) -> OutcomeUnknownError:
    """:class:`OutcomeUnknownError` for a save of ``name`` whose last request (``request``) failed with ``err``;
    ``why``: why the file could not be checked."""
    return OutcomeUnknownError(
        f"the save of {name} has an unknown outcome: its last request ({request}) got no answer "
        f"({type(err).__name__}: {err}){why}. The file there is either the previous checkpoint or the new one, whole, "
        f"never a mix: once the storage answers, check it (lightning-nvcomp verify {name}), or save again.",
        name,
    )


# -- S3 multipart ---------------------------------------------------------------------------------------------------

#: Multipart uploads whose abort failed (the server unreachable): (file system, bucket, key, upload id), retried
#: when the next multipart upload of this process begins.
_FAILED_ABORTS: list[tuple[Any, str, str, str]] = []
_FAILED_LOCK = threading.Lock()


def _abort(fs: Any, bucket: str, key: str, upload_id: str) -> bool:
    """Abort a multipart upload; remember it for :func:`retry_failed_aborts` if the server cannot be reached. Returns
    whether the abort removed the upload (False: it was gone already, completed or aborted, or the abort failed)."""
    try:
        fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
        return True
    except FileNotFoundError:  # NoSuchUpload: aborted (or completed) already
        return False
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
        return False


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
        name: the object's URL, for messages.
    """

    def __init__(self, fs: Any, key: str, options: RemoteOptions, name: str) -> None:
        retry_failed_aborts()
        self._fs, self._name = fs, name
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
            with naming(self._name, "save", INTACT):
                created = self._fs.call_s3("create_multipart_upload", Bucket=self._bucket, Key=self._key, **self._extra)
            self._upload_id = created["UploadId"]
        body, self._buffer = bytes(self._buffer), bytearray()
        self._slots.acquire()
        self._parts.append(self._pool.submit(self._put_part, len(self._parts) + 1, body))

    def _put_part(self, number: int, body: bytes) -> dict[str, Any]:
        try:
            with naming(self._name, "save", INTACT):
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
        """Complete the upload: the object appears, whole. A file smaller than one part is one ``PutObject``.

        If that last request fails, what it did is found out before anything is reported (:meth:`_settle`): the
        save succeeded if the object is now the new one (a warning says so), failed if the object is not (the
        previous one is intact), and raises :class:`OutcomeUnknownError` if that cannot be found out.
        """
        try:
            if self._upload_id is None:
                body = bytes(self._buffer)
                try:
                    self._fs.call_s3("put_object", Bucket=self._bucket, Key=self._key, Body=body, **self._extra)
                except Exception as err:
                    self._settle(err, "PutObject", f'"{hashlib.md5(body, usedforsecurity=False).hexdigest()}"')
            else:
                if self._buffer:
                    self._send()
                parts = [part.result() for part in self._parts]
                try:
                    self._fs.call_s3(
                        "complete_multipart_upload",
                        Bucket=self._bucket,
                        Key=self._key,
                        UploadId=self._upload_id,
                        MultipartUpload={"Parts": parts},
                    )
                except Exception as err:
                    self._settle(err, "CompleteMultipartUpload", multipart_etag([p["ETag"] for p in parts]))
        finally:
            self._pool.shutdown(wait=True)
            self._fs.invalidate_cache(f"{self._bucket}/{self._key}")

    def _settle(self, err: Exception, request: str, etag: str | None) -> None:
        """Find out what the last request (``request``), which failed with ``err``, did: abort the multipart upload
        (a completion that did not happen can no longer happen), then read the object's ETag. Return if it is
        ``etag``, the new object's (the answer was lost, the save succeeded); raise a failure (the previous object
        intact) if the abort removed the upload, ``err`` says the request never reached the server or was refused,
        or the object is not the new one; else :class:`OutcomeUnknownError`."""
        aborted = self._abort_upload()
        try:
            with naming(self._name, "look at"):
                head = self._fs.call_s3("head_object", Bucket=self._bucket, Key=self._key)
        except FileNotFoundError:  # no object at all: not the new one
            head = {}
        except Exception as head_err:
            if aborted or not maybe_applied(err):
                raise storage_error(err, self._name, "save", INTACT) from err
            why = f", and the object could not be looked at ({head_err})"
            raise outcome_unknown(err, self._name, request, why) from err
        if etag is not None and head.get("ETag") == etag:
            log.warning(
                "lightning_nvcomp: the answer to the %s of %s was lost (%s: %s), but the object there is the new "
                "checkpoint (its ETag is the uploaded data's): the save succeeded",
                request,
                self._name,
                type(err).__name__,
                err,
            )
            return
        # The ETag of an object encrypted with a KMS or a customer key is not the MD5 of its data.
        known_etag = (
            etag is not None
            and "SSECustomerAlgorithm" not in head
            and "kms" not in head.get("ServerSideEncryption", "")
        )
        if aborted or not maybe_applied(err) or not head or known_etag:
            raise storage_error(err, self._name, "save", INTACT) from err
        raise outcome_unknown(err, self._name, request, ", and the object's ETag does not tell (encrypted)") from err

    def _abort_upload(self) -> bool:
        """Abort the multipart upload, once; whether that removed it (see :func:`_abort`)."""
        upload_id, self._upload_id = self._upload_id, None
        return upload_id is not None and _abort(self._fs, self._bucket, self._key, upload_id)

    def abort(self) -> None:
        """Stop the part uploads and abort the multipart upload: no object is made, the previous one is kept."""
        for part in self._parts:
            part.cancel()
        self._pool.shutdown(wait=True)
        self._buffer = bytearray()
        self._abort_upload()


def multipart_etag(part_etags: list[str]) -> str | None:
    """The ETag S3 gives the object a multipart upload of parts of ``part_etags`` makes: the MD5 of their MD5s, then
    ``-`` and their count (None where a part's ETag is not an MD5)."""
    try:
        digests = b"".join(bytes.fromhex(e.strip('"')) for e in part_etags)
    except ValueError:
        return None
    if len(digests) != 16 * len(part_etags):
        return None
    return f'"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(part_etags)}"'


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
        name: the file's URL, for messages.
    """

    def __init__(self, fs: Any, key: str, name: str) -> None:
        self._fs, self._key, self._name = fs, key, name
        parent, _, base = key.rpartition("/")
        self._tmp = f"{parent}/{own_name(base, '.tmp')}"
        with naming(name, "save", INTACT):
            self._file = fs.open(self._tmp, "wb")

    def write(self, data: Any) -> int:
        with naming(self._name, "save", INTACT):
            return super().write(data)

    def flush(self) -> None:
        with naming(self._name, "save", INTACT):
            super().flush()

    def commit(self) -> None:
        with naming(self._name, "save", INTACT):
            self._file.close()
        try:
            self._fs.mv(self._tmp, self._key)
        except Exception as err:
            raise last_request_failed(err, self._name, "the rename") from err
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
        name: the file's URL, for messages.
    """

    def __init__(self, fs: Any, key: str, name: str) -> None:
        self._fs, self._key, self._name = fs, key, name
        self._file = tempfile.NamedTemporaryFile(prefix="lightning-nvcomp-", suffix=".upload")

    def commit(self) -> None:
        try:
            self._file.flush()
            try:
                self._fs.put_file(self._file.name, self._key)
            except Exception as err:
                raise last_request_failed(err, self._name, "the upload") from err
        finally:
            self._file.close()
        self._fs.invalidate_cache(self._key)

    def abort(self) -> None:
        self._file.close()
