"""S3 multipart uploads: an object written in parts that go up in parallel while the save codes the next ones, and
that becomes the object, whole, only at ``CompleteMultipartUpload`` (a file smaller than one part is one
``PutObject``). A failed save aborts its upload; an abort that cannot reach the server is retried when the next
multipart upload of this process begins. When the last request gets no answer, the object's ETag tells whether it
is the new one (:meth:`MultipartUpload.commit`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from lightning_nvcomp.storage.remote.errors import INTACT, maybe_applied, naming, outcome_unknown, storage_error
from lightning_nvcomp.storage.remote.options import RemoteOptions

log = logging.getLogger(__name__)

#: Parts grow to twice :attr:`RemoteOptions.part_nbytes` every this many parts (S3 takes at most 10,000).
PARTS_PER_SIZE = 1000
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
