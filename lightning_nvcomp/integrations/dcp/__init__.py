"""torch.distributed.checkpoint (DCP) storage that compresses every rank's local shards with the codec core.

Use it wherever DCP takes a storage writer::

    import torch.distributed.checkpoint as dcp
    from lightning_nvcomp.dcp import NvcompFileSystemWriter, NvcompFileSystemReader   # the public path

    dcp.save(state, storage_writer=NvcompFileSystemWriter(path, codec="auto"))
    dcp.async_save(state, storage_writer=NvcompFileSystemWriter(path, codec="zstd")).result()
    dcp.load(state, storage_reader=NvcompFileSystemReader(path))   # or plain dcp.load(state, checkpoint_id=path)

Which hook, and why. DCP's ``StreamTransformExtension`` (``FileSystemWriter(_extensions=...)``) was the first
candidate and is not used: an extension only wraps the byte stream of ``torch.save(cpu_tensor)`` - it never sees the
tensor, its dtype or its device - so it cannot cut byte planes by dtype (the source of most of the gain on trained
weights), and it runs after DCP has already copied every GPU shard to host memory, so it cannot compress on the GPU.
Instead :class:`NvcompFileSystemWriter` subclasses ``FileSystemWriter`` and replaces two methods:

* ``write_data``: each local shard the plan assigns to this rank (``planner.resolve_data``) is compressed on its own
  device (nvCOMP on CUDA tensors, CPU zstd otherwise) with :func:`lightning_nvcomp.format.snapshot`, and only
  the compressed bytes reach host memory and the ``__<rank>_<n>.distcp`` files, while the next shard is coded.
* ``stage`` (``dcp.async_save``): CUDA shards are compressed on the GPU *while staging*, so training waits for the
  GPU coder and a small device-to-host copy instead of a full-size one, and host memory holds compressed bytes;
  CPU shards are copied (cheap) and compressed in the background thread. ``stage_compress`` changes this. With
  ``codec="none"`` CUDA shards are copied to pinned host memory (what ``"auto"`` predicts for it), not by DCP's
  default staging, which copies to pageable memory at a fraction of the speed.

The file layout and metadata are DCP's own: one ``.metadata`` (written atomically), ``__<rank>_<n>.<id>.distcp`` data
files in which each item is stored at ``(offset, length)`` as a self-contained ``torch.save`` zip. For compressed
items that zip is the package's container format (:mod:`lightning_nvcomp.format`, docs/FORMAT.md): its blobs are the record's
compressed segments and its pickle rebuilds the tensor through ``lightning_nvcomp.decode_tensor``, which validates
every record field (:func:`lightning_nvcomp.codec.schema.validate`) and every segment CRC-32 before decoding a byte.
Each item's ``storage_data`` is a :class:`NvcompStorageInfo` (DCP's ``_StorageInfo`` plus ``codec`` and
``raw_nbytes``): readers know how each item was stored, and unpickling ``.metadata`` imports ``lightning_nvcomp.dcp``
(the module whose names it pickles, whichever module defines them), which registers the decoder with
``torch.load(weights_only=True)``. So:

* DCP's **default** ``FileSystemReader`` (``dcp.load(state, checkpoint_id=path)``, Lightning's FSDP sharded load,
  Accelerate's FSDP load, ``dcp_to_torch_save``) decodes these checkpoints natively, bit-exactly, wherever
  ``lightning_nvcomp`` is installed (gANS items need a GPU; CPU zstd reads the zstd ones anywhere). Where it is not
  installed, reading ``.metadata`` fails with ``No module named 'lightning_nvcomp'``: never garbage tensors.
  (DCP's own ``stream.zstd`` extension format was therefore not needed for compatibility.)
* :class:`NvcompFileSystemReader` adds GPU decoding (items decode on the target shard's GPU), a check of each
  item's pickle CRC, and error messages that name the file and the item.

A checkpoint id binds every data file to its ``.metadata``: drawn once per save by the coordinator
(``prepare_global_plan``) and handed to every rank with its plan, it is in each data file's name, in the header line
each data file starts with, and in every item's :class:`NvcompStorageInfo`. :class:`NvcompFileSystemReader` refuses a
data file whose header is not that of the id and name its items record - another step's file, or another rank's, put
in its place - naming the file, an item and both ids; and since no save reuses another's file names, no reader (DCP's
too) of one checkpoint opens another's file copied beside it. Files written before checkpoint ids are not checked.

Overwriting a checkpoint directory in place (Lightning's ``last.ckpt``) is crash-safe: a save never reuses a data file
name (they carry its checkpoint id), the new ``.metadata`` replaces the old one atomically once every rank has
written, and only then are data files no longer referenced deleted. A save that
fails on any rank, or a rank killed mid-save, leaves the previous checkpoint loadable (its partial data files are
referenced by nothing and are deleted by the next successful save).

Damage and hostile metadata. DCP pickles ``Metadata`` with no checksum, so a flipped byte in an item's
``(offset, length)`` or a chunk's offsets/sizes could load wrong data without an error. :class:`NvcompFileSystemWriter`
therefore writes ``.metadata`` as a pickle of one small object that unpickles through :func:`_checked_metadata`
``(payload, crc, version)``: ``payload`` is DCP's own pickle of the ``Metadata``, ``crc`` its CRC-32, checked before
the payload is unpickled (:class:`~lightning_nvcomp.errors.CorruptCheckpointError` naming ``.metadata`` when it
fails). DCP's default ``FileSystemReader`` does a plain ``pickle.load`` of ``.metadata`` (``read_metadata`` in
``torch/distributed/checkpoint/filesystem.py``, torch 2.13), so it gets the verified ``Metadata`` transparently;
``.metadata`` files of earlier versions (a plain pickled ``Metadata``) still load with either reader. A CRC anyone can
compute stops no attacker: both pickles are read under ``weights_only`` rules (:mod:`.unpickle`), importing only DCP's
metadata classes and ours - a ``.metadata`` that would run code is refused, naming the file, before any of it runs
(the payload so by any reader, DCP's too; a plain pickled ``Metadata`` so by ours). (Rank-local
metadata files, ``use_collectives=False``, stay DCP's own.) :class:`NvcompFileSystemReader` also checks, for every
item it reads and before opening any file: its ``relative_path`` names a file inside the checkpoint directory (no
absolute path, no ``..``), ``offset``/``length`` are non-negative ints within the data file's size, the codec is
known; after decoding, the tensor's dtype and shape must be those the metadata records for the chunk. Items stored
as plain ``torch.save`` zips (byte items such as ``step``, and tensors of plain DCP checkpoints) have every zip
CRC-32 checked before ``torch.load`` (DCP's reader checks none: a flipped byte there can change a non-tensor value
silently). Every error names the data file and the item.

Remote paths (``s3://``, ``gs://``, ``memory://``...) go through fsspec (:mod:`~lightning_nvcomp.integrations.dcp.filesystem`,
never torch's local ``FileSystem``, which would write them into a local directory named ``s3:``): each data file is
one upload that appears whole or not at all (an S3 multipart upload in parallel parts), ``.metadata`` is written last
in one put, and reads are parallel ranged reads; torch's ``FsspecReader`` reads these checkpoints too.

Telemetry: after a save, ``writer.stats`` (a :class:`~lightning_nvcomp.telemetry.stats.SaveStats`, as for every save) holds
this rank's raw and stored bytes (``file_nbytes``), the items it stored and its times: ``stage_s`` (staging),
``encode_s`` (coding, overlapped with the writes) and ``write_s`` (the rest of ``write_data``'s wall time), and for
``codec="auto"`` the ``prediction`` behind the choice (rank 0's, broadcast); ``writer.gather_stats()`` (a collective:
every rank calls it) returns the whole checkpoint's :class:`DcpCheckpointStats`, whose ``ranks[r]`` is rank ``r``'s;
the coordinator also has ``writer.totals`` (raw/stored bytes of all ranks, from the metadata, no collective).

``codec="auto"`` measures the storage with every rank writing at once (:class:`~lightning_nvcomp.auto.policy.CodecPolicy`
with ``collective=True``), decides on rank 0 and broadcasts the choice, so all ranks store the same codec.

The package (imported as :mod:`lightning_nvcomp.dcp`): ``writer`` (:class:`NvcompFileSystemWriter`), ``staging``
(compression while ``dcp.async_save`` stages), ``reader`` (:class:`NvcompFileSystemReader`), ``metadata`` (the checked
``.metadata``, :class:`NvcompStorageInfo`, checkpoint ids and the checks of an item's storage info), ``unpickle``
(``.metadata`` read under ``weights_only`` rules), ``filesystem`` (checkpoints at URLs), ``stats``
(:class:`DcpCheckpointStats`) and ``_compat``, the one module that names torch's private DCP, DTensor and
ShardedTensor internals, each with its reason and a version gate.
"""

from lightning_nvcomp.integrations.dcp.metadata import NvcompStorageInfo
from lightning_nvcomp.integrations.dcp.reader import NvcompFileSystemReader
from lightning_nvcomp.integrations.dcp.stats import DcpCheckpointStats
from lightning_nvcomp.integrations.dcp.writer import STAGE_COMPRESS, NvcompFileSystemWriter, default_policy

__all__ = [
    "STAGE_COMPRESS",
    "DcpCheckpointStats",
    "NvcompFileSystemReader",
    "NvcompFileSystemWriter",
    "NvcompStorageInfo",
    "default_policy",
]
