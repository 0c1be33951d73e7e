"""Remote checkpoint storage through fsspec: ``s3://``, ``gs://``, ``abfs://``, ``hdfs://``, ``memory://`` (and any
other fsspec protocol), behind the same :class:`~lightning_nvcomp.storage.backend.StorageBackend` as local files.

Modules, one concern each: ``options`` (:class:`RemoteOptions`, importable without fsspec), ``upload`` (how a file
becomes an object under its final name only once complete, and which upload does it: ``multipart``, S3 multipart
uploads in parallel parts, or ``file_uploads``, a rename or a single put), ``errors`` (what a failed request raises),
``ranges`` (a seekable file that reads byte ranges in parallel, ahead of the decoder) and
``fsspec_storage`` (:class:`~lightning_nvcomp.storage.remote.fsspec_storage.FsspecStorage`, which imports fsspec: install the
``remote`` extra, and ``s3`` / ``gcs`` / ``azure`` / ``hdfs`` for a backend's fsspec implementation).

Durability, per backend (what a save guarantees once it returns, and what a failed or killed one leaves):

* ``s3://`` (and S3-compatible stores): a file smaller than one part is one ``PutObject``; a larger one is a
  multipart upload whose parts go up in parallel while the next segments are coded, and which becomes the object
  only at ``CompleteMultipartUpload``. Either way the object appears whole under its final name or not at all: a
  failed save aborts its upload (an abort that cannot reach the server is retried at the next upload of this
  process), and a killed process leaves only an incomplete multipart upload, never an object - it is invisible to
  readers and costs storage until a bucket lifecycle rule (``AbortIncompleteMultipartUpload``) removes it. The
  previous object under that name stays readable until the new one is complete.
* ``gs://``, ``abfs://``, ``memory://`` and other object stores: the file is spooled to a local temporary file
  while it is coded, then uploaded with the backend's ``put_file`` (one upload that the store makes visible only
  once complete: a GCS resumable upload, an Azure block blob's block list); a failure before or during the upload
  leaves the previous object as it was.
* ``hdfs://`` and ``file://`` (file systems with an atomic rename): the file is streamed to a hidden temporary name
  beside the target, then renamed over it; a failure removes the temporary file.

Errors: every failure of the storage raises a :class:`RemoteStorageError` (an ``OSError``, never damage) that names
the URL and says what to do: :class:`RemoteAccessError` (no or bad credentials, no permission),
:class:`RemoteNotFoundError`, :class:`RemoteUnreachableError` (no connection, no answer), and
:class:`OutcomeUnknownError` for a save whose last request got no answer when what it did cannot be found out (see
:mod:`lightning_nvcomp.storage.remote.errors`). An S3 save whose ``CompleteMultipartUpload`` (or ``PutObject``) answer is lost
looks at the object's ETag first: if it is the new checkpoint the save succeeded (a warning says so).

A local path (no URL) never comes here: it keeps the durable local write of :mod:`lightning_nvcomp.storage.local`
(temporary name, fsync, rename, directory fsync) and the sweep of crashed saves' names
(:mod:`lightning_nvcomp.storage.discards`).
"""

from lightning_nvcomp.storage.remote.errors import (
    OutcomeUnknownError,
    RemoteAccessError,
    RemoteNotFoundError,
    RemoteStorageError,
    RemoteUnreachableError,
)
from lightning_nvcomp.storage.remote.options import RemoteOptions

__all__ = [
    "OutcomeUnknownError",
    "RemoteAccessError",
    "RemoteNotFoundError",
    "RemoteOptions",
    "RemoteStorageError",
    "RemoteUnreachableError",
]
