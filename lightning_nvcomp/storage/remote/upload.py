"""How a file written to remote storage becomes visible under its final name only once it is complete.

An :class:`Upload` is the writable stream a save codes into; :meth:`Upload.commit` makes the file appear whole under
its name, :meth:`Upload.abort` gives up and leaves no new object (the previous one, if any, untouched). Three kinds,
picked by :func:`open_upload` from :attr:`RemoteOptions.upload` (``auto``: by the URL's protocol), each in a module of
its own:

* :class:`~.multipart.MultipartUpload` (``s3://``): parts of :attr:`RemoteOptions.part_nbytes` go up in parallel on
  threads while the caller writes (codes) the next ones; ``CompleteMultipartUpload`` makes the object,
  ``AbortMultipartUpload`` discards the parts. A file smaller than one part is one ``PutObject``.
* :class:`~.file_uploads.RenameUpload` (``hdfs://``, ``file://``): streamed to a hidden temporary name beside the
  target (the local storage's pattern), renamed over it when complete, removed on failure.
* :class:`~.file_uploads.SpooledPut` (``gs://``, ``abfs://``, ``memory://``...): spooled to a local temporary file,
  then one ``put_file``, which those stores make visible only once the whole upload is done.

Every error names the URL (:mod:`lightning_nvcomp.storage.remote.errors`) and says what the failure left. A failure
before the last request leaves no new file. When the last request (``CompleteMultipartUpload``, ``PutObject``, the
rename, the ``put_file``) gets no answer, the server may have carried it out: an S3 upload then finds out from the
object's ETag before it reports (:meth:`~.multipart.MultipartUpload.commit`); where that cannot be found out, the
save raises :class:`~lightning_nvcomp.storage.remote.errors.OutcomeUnknownError` and never claims that the previous
file is intact.
"""

from __future__ import annotations

from typing import Any, Protocol

from lightning_nvcomp.storage.remote.file_uploads import RenameUpload, SpooledPut
from lightning_nvcomp.storage.remote.multipart import MultipartUpload
from lightning_nvcomp.storage.remote.options import RemoteOptions

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
