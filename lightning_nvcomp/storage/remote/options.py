"""How remote storage is reached and used: :class:`RemoteOptions`, one object handed down from the integrations to
the storage (importable without fsspec)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MiB = 1 << 20
#: What :attr:`RemoteOptions.upload` may be (see :mod:`lightning_nvcomp.storage.remote.upload`).
UPLOADS = ("auto", "multipart", "rename", "put")
#: The smallest part S3 takes (all parts of a multipart upload but the last).
MIN_PART_NBYTES = 5 * MiB


@dataclass(frozen=True)
class RemoteOptions:
    """How checkpoints are written to and read from a URL (``s3://bucket/run``...).

    Args:
        storage_options: keyword arguments for the fsspec file system (``fsspec.core.url_to_fs``), e.g.
            ``{"client_kwargs": {"endpoint_url": "http://localhost:9000"}}`` for an S3-compatible server, or
            ``{"anon": True}``. Credentials and endpoints may also come from the backend's usual environment
            variables and configuration files (``AWS_ENDPOINT_URL``, ``~/.aws/credentials``...).
        part_nbytes: size of an upload part and of a ranged read (at least 5 MiB, S3's smallest part). Parts of a
            multipart upload grow to twice this every 1000 parts, so that S3's 10,000 parts reach ~16 TB at 16 MiB.
        max_parallel: parts uploaded, or ranges read, at once; an upload holds at most ``max_parallel + 1`` parts
            in memory and a load about ``2 * max_parallel`` ranges.
        upload: how a file becomes visible under its final name: ``"multipart"`` (S3: parallel parts, completed
            or aborted), ``"rename"`` (a temporary name, then a rename: HDFS, ``file://``), ``"put"`` (spooled to a
            local temporary file, then one upload: GCS, Azure, memory), or ``"auto"``: by the URL's protocol.

    Raises:
        ValueError: a part smaller than 5 MiB, ``max_parallel`` below 1, or an unknown ``upload``.
    """

    storage_options: Mapping[str, Any] = field(default_factory=dict)
    part_nbytes: int = 16 * MiB
    max_parallel: int = 8
    upload: str = "auto"

    def __post_init__(self) -> None:
        if self.part_nbytes < MIN_PART_NBYTES:
            raise ValueError(f"part_nbytes must be at least {MIN_PART_NBYTES} (5 MiB), not {self.part_nbytes}")
        if self.max_parallel < 1:
            raise ValueError(f"max_parallel must be at least 1, not {self.max_parallel}")
        if self.upload not in UPLOADS:
            raise ValueError(f"upload must be one of {UPLOADS}, not {self.upload!r}")
