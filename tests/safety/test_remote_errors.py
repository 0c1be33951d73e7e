"""Remote storage that names its URL and knows its outcome (issue 32, part E), against the real S3 server on localhost
that tests/integration/test_remote.py runs (moto over HTTP, the s3fs client); no mocks.

What is shown: without credentials, every save, load, probe, listing, removal and CLI check names the URL and says
how to give credentials (a ``PermissionError``, never botocore's ``NoCredentialsError``); a storage that cannot be
reached, before or in the middle of a load, is named and never called damage. Through a proxy on localhost that drops
connections (:class:`DroppingProxy`), the last request of an S3 save (``CompleteMultipartUpload``, ``PutObject``)
whose answer is lost after the server carried it out is a successful save (a warning says so); one that never reached
the server fails and leaves the previous checkpoint; and where the object cannot be looked at afterwards the save
says its outcome is unknown, never that the previous checkpoint is intact.
"""

from __future__ import annotations

import http.client
import logging
import os
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import s3fs  # noqa: E402

import lightning_nvcomp  # noqa: E402
from lightning_nvcomp import cli  # noqa: E402
from lightning_nvcomp.auto.policy import CodecPolicy  # noqa: E402
from lightning_nvcomp.errors import CorruptCheckpointError  # noqa: E402
from lightning_nvcomp.storage import storage_for  # noqa: E402
from lightning_nvcomp.storage.remote import RemoteOptions  # noqa: E402
from lightning_nvcomp.storage.remote.errors import (  # noqa: E402
    OutcomeUnknownError,
    RemoteAccessError,
    RemoteStorageError,
    RemoteUnreachableError,
)
from lightning_nvcomp.storage.remote.multipart import retry_failed_aborts  # noqa: E402

from tests.helpers.states import assert_tree_bit_exact, trained_like  # noqa: E402
from tests.integration import test_remote  # noqa: E402
from tests.integration.test_remote import _free_port, object_bytes, objects, state, uploads  # noqa: E402

#: The S3 server of tests/integration/test_remote.py, and a fresh bucket on it.
s3_endpoint, bucket = test_remote.s3_endpoint, test_remote.bucket
MiB = 1 << 20
#: A client that gives up quickly: botocore tries once, s3fs retries a dropped connection a few times (~2 s).
QUICK = {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 10}}


# -- a proxy that loses answers ------------------------------------------------------------------------------------


class DroppingProxy:
    """An HTTP proxy on localhost in front of the S3 server. For each request, ``rule(method, path)`` says what
    happens: ``"pass"`` (forwarded, answered), ``"drop_answer"`` (forwarded, the server carries it out, then the
    client's connection is closed without an answer) or ``"drop_request"`` (the connection is closed, nothing
    reaches the server).

    Args:
        upstream: the S3 server's URL (``http://127.0.0.1:PORT``).
        rule: the decision for each request.
    """

    def __init__(self, upstream: str, rule: Callable[[str, str], str]) -> None:
        host, port = upstream.removeprefix("http://").split(":")

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                what = rule(self.command, self.path)
                if what == "drop_request":
                    self.close_connection = True
                    return
                upstream_conn = http.client.HTTPConnection(host, int(port), timeout=60)
                upstream_conn.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                answer = upstream_conn.getresponse()
                data = answer.read()
                upstream_conn.close()
                if what == "drop_answer":
                    self.close_connection = True
                    return
                self.send_response_only(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                length = answer.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length or "0")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Faults:
    """What the proxy does, switched by the test: nothing until :attr:`mode` is set (see :meth:`decide`);
    :attr:`dropped`: (method, what) of each request or answer dropped."""

    def __init__(self) -> None:
        self.mode = "pass"
        self.dropped: list[tuple[str, str]] = []
        #: ``read``: ranged reads answered before the others are lost; the count of those answered.
        self.reads_left, self.reads = 0, 0

    def rule(self, method: str, path: str) -> str:
        what = self.decide(method, path)
        if what != "pass":
            self.dropped.append((method, what))
        return what

    def decide(self, method: str, path: str) -> str:
        """``complete_answer``/``complete_request``: lose CompleteMultipartUpload answers / requests;
        ``put_answer``: lose the answers of PutObject (a PUT without a query); ``complete_then_all``: lose the answer
        to CompleteMultipartUpload and every request after it; ``read``: answer :attr:`reads_left` GETs of objects (ranged
        reads), then lose them."""
        complete = method == "POST" and "uploadId=" in path
        if self.mode == "complete_answer" and complete:
            return "drop_answer"
        if self.mode == "complete_request" and complete:
            return "drop_request"
        if self.mode == "put_answer" and method == "PUT" and "?" not in path:
            return "drop_answer"
        if self.mode == "complete_then_all":
            if complete:
                self.mode = "all"
                return "drop_answer"
        if self.mode == "all":
            return "drop_request"
        if method == "GET" and "?" not in path:
            self.reads += 1
            if self.mode == "read":
                self.reads_left -= 1
                return "drop_request" if self.reads_left < 0 else "pass"
        return "pass"


@pytest.fixture
def proxied(s3_endpoint, bucket):
    """``(bucket name, s3fs file system, storage through the proxy, faults)``: a storage whose requests pass through
    a :class:`DroppingProxy` that drops nothing until ``faults.mode`` is set."""
    faults = Faults()
    proxy = DroppingProxy(s3_endpoint, faults.rule)
    options = RemoteOptions(
        storage_options={**QUICK, "client_kwargs": {"endpoint_url": proxy.url}, "skip_instance_cache": True},
        part_nbytes=5 * MiB,
        max_parallel=2,
    )
    name, fs = bucket
    try:
        yield name, fs, storage_for(f"s3://{name}/run", options), faults
    finally:
        faults.mode = "pass"
        proxy.close()


# -- no credentials ------------------------------------------------------------------------------------------------


@pytest.fixture
def without_credentials(bucket, monkeypatch, tmp_path):
    """A bucket holding ``run/last.ckpt`` (``state(0)``), then an environment with no AWS credentials anywhere (no
    variables, no files, no instance metadata), in a fresh working directory: ``(bucket name, s3fs file system)``."""
    name, fs = bucket
    lightning_nvcomp.save(state(0, numel=100_000), f"s3://{name}/run/last.ckpt", codec="zstd")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.chdir(tmp_path)
    s3fs.S3FileSystem.clear_instance_cache()  # a file system made earlier holds the earlier credentials
    yield name, fs
    s3fs.S3FileSystem.clear_instance_cache()


def assert_says_credentials(err: BaseException, url: str) -> None:
    """``err`` is a PermissionError naming ``url`` and the ways to give S3 credentials."""
    message = str(err)
    assert isinstance(err, PermissionError) and isinstance(err, RemoteAccessError), repr(err)
    assert url in message, message
    assert "AWS_ACCESS_KEY_ID" in message and "RemoteOptions(storage_options=" in message, message


OPERATIONS: dict[str, Callable[[str], object]] = {
    "save": lambda name: lightning_nvcomp.save({"w": torch.ones(8)}, f"s3://{name}/run/new.ckpt", codec="zstd"),
    "load": lambda name: lightning_nvcomp.load(f"s3://{name}/run/last.ckpt"),
    "list": lambda name: storage_for(f"s3://{name}/run").listdir(f"s3://{name}/run"),
    "remove": lambda name: storage_for(f"s3://{name}/run/last.ckpt").remove(f"s3://{name}/run/last.ckpt"),
    "lightning remove_checkpoint": lambda name: lightning_nvcomp.NvcompCheckpointIO().remove_checkpoint(
        f"s3://{name}/run/last.ckpt"
    ),
}
URLS = {"save": "run/new.ckpt", "list": "run"}


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_no_credentials_names_the_url_and_how_to_give_them(without_credentials, operation):
    name, fs = without_credentials
    url = f"s3://{name}/{URLS.get(operation, 'run/last.ckpt')}"
    with pytest.raises(PermissionError) as raised:
        OPERATIONS[operation](name)
    assert_says_credentials(raised.value, url)
    assert list(objects(fs, name)) == ["run/last.ckpt"]  # nothing written, nothing removed
    assert os.listdir() == []  # nothing local either


def test_no_credentials_in_the_probe_warns_naming_the_directory_and_the_save_fails_naming_the_file(
    without_credentials, caplog
):
    name, fs = without_credentials
    directory, url = f"s3://{name}/run", f"s3://{name}/run/auto.ckpt"
    policy = CodecPolicy(probe_nbytes=8 * MiB)
    with caplog.at_level(logging.WARNING, logger="lightning_nvcomp.auto.probe"):
        with pytest.raises(PermissionError) as raised:
            lightning_nvcomp.save({"w": torch.ones(8)}, url, codec="auto", policy=policy)
    assert_says_credentials(raised.value, url)
    probe_warnings = [r.getMessage() for r in caplog.records if r.name == "lightning_nvcomp.auto.probe"]
    assert len(probe_warnings) == 1, probe_warnings
    assert directory in probe_warnings[0] and "AWS_ACCESS_KEY_ID" in probe_warnings[0], probe_warnings[0]
    assert list(objects(fs, name)) == ["run/last.ckpt"]


def test_no_credentials_in_the_cli_exits_2_naming_the_url(without_credentials, capsys):
    name, _ = without_credentials
    url = f"s3://{name}/run/last.ckpt"
    for command in ("verify", "inspect"):
        assert cli.main([command, url]) == 2, command  # cannot be checked here: not "missing or damaged"
        err = capsys.readouterr().err
        assert url in err and "AWS_ACCESS_KEY_ID" in err and "RemoteOptions(storage_options=" in err, err
        assert "damaged" not in err, err


# -- the network ---------------------------------------------------------------------------------------------------


def test_an_unreachable_storage_is_named_and_never_called_damage(bucket, tmp_path, monkeypatch):
    """A server that is not there (nothing listens on its port): every operation names the URL and the address
    settings; a save says the previous checkpoint is intact."""
    monkeypatch.chdir(tmp_path)
    name, _ = bucket
    options = RemoteOptions(
        storage_options={
            **QUICK,
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{_free_port()}"},
            "skip_instance_cache": True,
        }
    )
    url = f"s3://{name}/run/last.ckpt"
    storage = storage_for(url, options)
    calls = {
        "save": lambda: lightning_nvcomp.save({"w": torch.ones(8)}, url, codec="zstd", storage=storage),
        "load": lambda: lightning_nvcomp.load(url, storage=storage),
        "list": lambda: storage.listdir(f"s3://{name}/run"),
        "remove": lambda: storage.remove(url),
    }
    for operation, call in calls.items():
        with pytest.raises(ConnectionError) as raised:
            call()
        message = str(raised.value)
        assert isinstance(raised.value, RemoteUnreachableError), (operation, repr(raised.value))
        assert f"s3://{name}/run" in message and "AWS_ENDPOINT_URL" in message, (operation, message)
        if operation == "save":
            assert "previous checkpoint there is intact" in message, message


@pytest.mark.parametrize("part", [0, 1, 2], ids=["first read", "a third in", "two thirds in"])
def test_a_connection_lost_in_the_middle_of_a_load_is_not_damage(proxied, part):
    """The object's ranged reads are lost from the first one (zipfile's look at the file), a third or two thirds
    into the load (the structure check, torch's reads of the records): a network error naming the URL, never
    damage."""
    name, _, storage, faults = proxied
    storage.fs.retries = 1  # s3fs retries a lost read 5 x 5 times (nested), with back-off: ~20 s each
    url = f"s3://{name}/run/last.ckpt"
    saved = {f"w{i}": trained_like(1_000_000, torch.float32, i) for i in range(6)}
    lightning_nvcomp.save(saved, url, codec="zstd", storage=storage)
    assert_tree_bit_exact(saved, lightning_nvcomp.load(url, storage=storage))
    reads = faults.reads  # what a whole load reads
    assert reads >= 6, reads
    faults.mode, faults.reads_left = "read", reads * part // 3
    with pytest.raises(RemoteUnreachableError) as raised:
        lightning_nvcomp.load(url, storage=storage)
    assert not isinstance(raised.value, CorruptCheckpointError)
    assert url in str(raised.value) and "damaged" not in str(raised.value), str(raised.value)
    faults.mode = "pass"
    assert_tree_bit_exact(saved, lightning_nvcomp.load(url, storage=storage))  # it was never damaged


# -- the outcome of a save whose last answer is lost ---------------------------------------------------------------


def test_a_lost_complete_answer_after_the_server_completed_is_a_successful_save(proxied, caplog):
    """CompleteMultipartUpload reaches the server, which makes the object; every answer to it is lost. The save
    looks at the object's ETag, finds the new checkpoint and succeeds, with a warning."""
    name, fs, storage, faults = proxied
    url = f"s3://{name}/run/last.ckpt"
    lightning_nvcomp.save(state(0), url, codec="zstd", storage=storage)
    faults.mode = "complete_answer"
    with caplog.at_level(logging.WARNING, logger="lightning_nvcomp.storage.remote.multipart"):
        stats = lightning_nvcomp.save(state(1), url, codec="zstd", storage=storage)
    assert ("POST", "drop_answer") in faults.dropped
    assert stats.file_nbytes > 2 * 5 * MiB  # a multipart upload of several parts
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(url in w and "CompleteMultipartUpload" in w and "succeeded" in w for w in warnings), warnings
    faults.mode = "pass"
    assert objects(fs, name) == {"run/last.ckpt": stats.file_nbytes} and uploads(fs, name) == []
    assert_tree_bit_exact(state(1), lightning_nvcomp.load(url, storage=storage))


def test_a_lost_put_answer_after_the_server_stored_the_object_is_a_successful_save(proxied, caplog):
    """The same for a file smaller than one part (one PutObject)."""
    name, fs, storage, faults = proxied
    url = f"s3://{name}/run/small.ckpt"
    lightning_nvcomp.save({"w": torch.zeros(100)}, url, codec="none", storage=storage)
    faults.mode = "put_answer"
    small = {"w": torch.arange(100.0)}
    with caplog.at_level(logging.WARNING, logger="lightning_nvcomp.storage.remote.multipart"):
        stats = lightning_nvcomp.save(small, url, codec="none", storage=storage)
    assert ("PUT", "drop_answer") in faults.dropped
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(url in w and "PutObject" in w and "succeeded" in w for w in warnings), warnings
    faults.mode = "pass"
    assert objects(fs, name) == {"run/small.ckpt": stats.file_nbytes}
    assert_tree_bit_exact(small, lightning_nvcomp.load(url, storage=storage))


def test_a_complete_that_never_reaches_the_server_fails_and_leaves_the_previous_checkpoint(proxied):
    name, fs, storage, faults = proxied
    url = f"s3://{name}/run/last.ckpt"
    lightning_nvcomp.save(state(0), url, codec="zstd", storage=storage)
    before = object_bytes(fs, name, "run/last.ckpt")
    faults.mode = "complete_request"
    with pytest.raises(RemoteStorageError) as raised:
        lightning_nvcomp.save(state(1), url, codec="zstd", storage=storage)
    assert ("POST", "drop_request") in faults.dropped
    message = str(raised.value)
    assert not isinstance(raised.value, OutcomeUnknownError)
    assert url in message and "previous checkpoint there is intact" in message, message
    faults.mode = "pass"
    assert object_bytes(fs, name, "run/last.ckpt") == before
    assert uploads(fs, name) == []  # the upload was aborted: it can never complete later
    assert_tree_bit_exact(state(0), lightning_nvcomp.load(url, storage=storage))


def test_a_lost_complete_answer_that_cannot_be_checked_is_an_unknown_outcome(proxied, caplog):
    """The answer to CompleteMultipartUpload is lost and every request after it too (the abort, the look at the
    object): the save says its outcome is unknown, names the URL and does not claim the previous checkpoint is
    intact - rightly: the server did complete it."""
    name, fs, storage, faults = proxied
    url = f"s3://{name}/run/last.ckpt"
    lightning_nvcomp.save(state(0), url, codec="zstd", storage=storage)
    faults.mode = "complete_then_all"
    with caplog.at_level(logging.WARNING, logger="lightning_nvcomp.storage.remote.multipart"):
        with pytest.raises(OutcomeUnknownError) as raised:
            lightning_nvcomp.save(state(1), url, codec="zstd", storage=storage)
    message = str(raised.value)
    assert url in message and "unknown" in message and "intact" not in message, message
    assert "lightning-nvcomp verify" in message, message
    faults.mode = "pass"
    assert_tree_bit_exact(state(1), lightning_nvcomp.load(url, storage=storage))  # the new one was completed
    assert uploads(fs, name) == []
    assert any("could not abort" in r.getMessage() for r in caplog.records)  # the abort was lost too
    caplog.clear()
    retry_failed_aborts()  # while this proxy still runs (the next upload of the process would do it)
    assert not any("could not abort" in r.getMessage() for r in caplog.records)
