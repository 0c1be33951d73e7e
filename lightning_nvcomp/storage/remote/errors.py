"""What a failed request to remote storage raises: a :class:`RemoteStorageError` (an ``OSError``) that names the URL,
says what failed and what to do; never a bare botocore or fsspec error, and never a claim that a checkpoint is
damaged (the network, the server, credentials and permissions are not the file). A failed save's error also says
what the failure left (:data:`INTACT`, :func:`last_request_failed`, :func:`outcome_unknown`). Importable without
fsspec."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class RemoteStorageError(OSError):
    """A request to remote storage failed (the network, the server, credentials, permissions): not damage.

    Args:
        message: what failed, naming the URL, and what to do.
        url: the file or directory the request was about.
    """

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class RemoteAccessError(RemoteStorageError, PermissionError):
    """The storage refused the request: no credentials, invalid or expired ones, or no permission."""


class RemoteNotFoundError(RemoteStorageError, FileNotFoundError):
    """The file, or its bucket, does not exist."""


class RemoteUnreachableError(RemoteStorageError, ConnectionError):
    """The storage could not be reached, or its answer was lost (connection refused, closed or timed out)."""


class OutcomeUnknownError(RemoteStorageError):
    """A save's last request (the one that makes the file appear) got no answer, and what the storage holds now could
    not be found out: the file there is either the previous one or the new one, whole."""


#: What a save that failed before its last request left.
INTACT = "Nothing was written under that name: any previous checkpoint there is intact."
#: How to give credentials, per protocol (the fsspec implementation's environment and arguments).
CREDENTIALS = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary ones), or "
    "AWS_PROFILE with ~/.aws/credentials, or pass RemoteOptions(storage_options={'key': ..., 'secret': ...}); for a "
    "public bucket, RemoteOptions(storage_options={'anon': True})",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS to a key file (or run `gcloud auth application-default login`), or "
    "pass RemoteOptions(storage_options={'token': ...})",
    "abfs": "set AZURE_STORAGE_CONNECTION_STRING (or AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY), or "
    "pass RemoteOptions(storage_options={'account_name': ..., 'account_key': ...})",
}
#: Where the address of the storage is set, per protocol.
ENDPOINTS = {
    "s3": "AWS_ENDPOINT_URL, or RemoteOptions(storage_options={'client_kwargs': {'endpoint_url': ...}})",
}
#: Where RemoteOptions are given.
PASSED_AS = (
    "(RemoteOptions go to remote= of NvcompCheckpointIO, attach() and NvcompFileSystemWriter/Reader, or to "
    "storage_for(url, RemoteOptions(...)) for save() and load())"
)
#: Protocols that share another's advice.
SAME_AS = {"s3a": "s3", "gcs": "gs", "abfss": "abfs", "az": "abfs"}
#: The libraries behind fsspec's storage back-ends: an error raised by one of them is the storage's.
STORAGE_LIBRARIES = {"fsspec", "s3fs", "botocore", "aiobotocore", "aiohttp", "gcsfs", "google", "adlfs", "azure"}
#: Error codes of S3 (and S3-compatible servers) that mean the credentials are missing, wrong or expired.
BAD_CREDENTIALS = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidToken",
    "TokenRefreshRequired",
}


def _protocol(url: str) -> str:
    protocol = url.split("://", 1)[0].lower() if "://" in url else ""
    return SAME_AS.get(protocol, protocol)


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and the errors it was raised from (s3fs raises an OSError from botocore's ClientError)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _answer(err: BaseException) -> tuple[str, int]:
    """The error code and HTTP status of the server's answer behind ``err`` ('', 0 if there was none)."""
    for e in _chain(err):
        response = getattr(e, "response", None)
        if isinstance(response, dict) and "Error" in response:
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            return str(response["Error"].get("Code", "")), int(status)
    return "", 0


def _names(err: BaseException) -> set[str]:
    """The class names of ``err``'s chain and of their bases (botocore need not be importable here)."""
    return {cls.__name__ for e in _chain(err) for cls in type(e).__mro__}


def _of_storage(err: BaseException) -> bool:
    """Whether ``err`` is an error of the storage (an OSError, or one of a storage library's), not of the machine
    (memory, a thread that could not start) or the program."""
    return isinstance(err, OSError) or any(type(e).__module__.split(".")[0] in STORAGE_LIBRARIES for e in _chain(err))


def _credentials_missing(err: BaseException) -> bool:
    names = _names(err)
    return any("Credential" in n or n in ("NoAuthTokenError", "TokenRetrievalError") for n in names) or (
        _answer(err)[0] in BAD_CREDENTIALS
    )


def _not_sent(err: BaseException) -> bool:
    """Whether the request behind ``err`` never reached the server (no credentials, no connection)."""
    names = _names(err)
    connect = {"EndpointConnectionError", "ConnectTimeoutError", "ProxyConnectionError", "ConnectionRefusedError"}
    return _credentials_missing(err) or bool(names & connect)


def maybe_applied(err: BaseException) -> bool:
    """Whether the request that failed with ``err`` may have been carried out: False only where it never reached the
    server, the server refused it (an answer below 500 other than 404: a 404 may answer the retry of a request that
    was carried out, e.g. ``NoSuchUpload`` for a completed multipart upload), or the local system did (an OSError
    with an errno, other than a lost connection)."""
    if _not_sent(err):
        return False
    _, status = _answer(err)
    if status:
        return status >= 500 or status == 404
    local = isinstance(err, OSError) and err.errno is not None and not isinstance(err, (ConnectionError, TimeoutError))
    return not local


def storage_error(err: BaseException, url: str, doing: str, outcome: str = "") -> BaseException:
    """The error a user sees for ``err``, raised by a request about ``url``: a :class:`RemoteStorageError` of the
    kind that fits, naming the URL, what failed and what to do; ``err`` itself where it is one already or is no
    storage error (memory, threads, an interrupt: errors of the machine pass through as they are).

    Args:
        err: what fsspec or its backend raised.
        url: the file or directory the request was about.
        doing: what was being done, as in "cannot <doing> <url>" (``save``, ``read``, ``list``...).
        outcome: a last sentence on what the failure left (a save: "any previous checkpoint there is intact").
    """
    if isinstance(err, RemoteStorageError) or not _of_storage(err):
        return err
    names = _names(err)
    protocol = _protocol(url)
    code, status = _answer(err)
    detail = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    if _credentials_missing(err):
        advice = CREDENTIALS.get(protocol, "pass the credentials in RemoteOptions(storage_options=...)")
        kind: type[RemoteStorageError] = RemoteAccessError
        message = f"no valid credentials for {protocol or 'this'} storage ({detail}): {advice} {PASSED_AS}"
    elif isinstance(err, PermissionError) or status == 403:
        kind = RemoteAccessError
        message = f"access denied ({detail}): the credentials in use lack the permission; check them and the policy"
    elif isinstance(err, FileNotFoundError) or code in ("NoSuchBucket", "NoSuchKey") or status == 404:
        kind = RemoteNotFoundError
        message = f"it does not exist ({detail})" if code != "NoSuchBucket" else f"its bucket does not exist ({detail})"
    elif isinstance(err, (ConnectionError, TimeoutError)) or names & {"HTTPClientError", "ConnectionError"}:
        kind = RemoteUnreachableError
        where = ENDPOINTS.get(protocol, "RemoteOptions(storage_options=...)")
        message = (
            f"the storage could not be reached or did not answer ({detail}); check the network and the address "
            f"({where}) {PASSED_AS}, then retry"
        )
    else:
        kind = RemoteStorageError
        message = f"the storage failed ({detail}); retry, and check the storage options if it persists"
    return kind(" ".join(filter(None, [f"cannot {doing} {url}: {message}.", outcome])), url)


@contextlib.contextmanager
def naming(url: str, doing: str, outcome: str = "") -> Iterator[None]:
    """Raise what the block raises as :func:`storage_error` makes it (naming ``url``), from the original."""
    try:
        yield
    except Exception as err:
        named = storage_error(err, url, doing, outcome)
        if named is err:
            raise
        raise named from err


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
