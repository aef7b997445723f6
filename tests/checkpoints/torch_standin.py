"""Write DCP ``.metadata`` pickles byte-compatible with torch's, without torch installed.

The classes mirror ``torch/distributed/checkpoint/metadata.py`` and ``filesystem.py`` (torch 2.x):
same module paths and names, same pickled state (``TensorProperties`` pickles a tuple with a
``_MEM_FORMAT_ENCODING``; ``_StorageInfo`` drops None fields; ``torch.Size`` and dtypes pickle as
torch globals).  They are registered in ``sys.modules`` only while pickling.
"""

from __future__ import annotations

import contextlib
import enum
import pickle
import sys
import types
from dataclasses import dataclass, field
from typing import Any

_METADATA = "torch.distributed.checkpoint.metadata"
_FILESYSTEM = "torch.distributed.checkpoint.filesystem"


class Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


class _Singleton:
    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self):
        return self.name


class _MEM_FORMAT_ENCODING(enum.Enum):  # noqa: N801 - torch's name
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


float32, bfloat16, strided = _Singleton("float32"), _Singleton("bfloat16"), _Singleton("strided")


@dataclass
class ChunkStorageMetadata:
    offsets: Size
    sizes: Size


@dataclass
class TensorProperties:
    dtype: Any = float32
    layout: Any = strided
    requires_grad: bool = False
    memory_format: Any = None
    pin_memory: bool = False

    def __getstate__(self):
        encoding = _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT
        return (self.dtype, self.layout, self.requires_grad, encoding, self.pin_memory)


@dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: Size
    chunks: list[ChunkStorageMetadata]


@dataclass
class BytesStorageMetadata:
    pass


@dataclass
class StorageMeta:
    checkpoint_id: Any = None
    save_id: str | None = None
    load_id: str | None = None
    modules: list[str] = field(default_factory=list)


@dataclass
class Metadata:
    state_dict_metadata: dict[str, Any]
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: StorageMeta | None = None
    version: str | None = None


@dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: Size | None = None
    index: int | None = field(hash=False, compare=False, default=None)


@dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int
    transform_descriptors: Any = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if v is not None}


@contextlib.contextmanager
def _torch_modules():
    """Make the stand-ins importable under torch's module names while pickling."""
    names = {
        "torch": {"Size": Size, "float32": float32, "bfloat16": bfloat16, "strided": strided},
        "torch.distributed": {},
        "torch.distributed.checkpoint": {},
        _METADATA: {
            cls.__name__: cls
            for cls in (
                ChunkStorageMetadata,
                TensorProperties,
                TensorStorageMetadata,
                BytesStorageMetadata,
                StorageMeta,
                Metadata,
                MetadataIndex,
                _MEM_FORMAT_ENCODING,
            )
        },
        _FILESYSTEM: {"_StorageInfo": _StorageInfo},
    }
    for module_name, members in names.items():
        module = types.ModuleType(module_name)
        for name, member in members.items():
            setattr(module, name, member)
            if isinstance(member, type):
                member.__module__ = module_name
        sys.modules[module_name] = module
    _Singleton.__module__ = "torch"
    try:
        yield
    finally:
        for module_name in names:
            del sys.modules[module_name]


def dcp_metadata(
    shards: dict[str, list[tuple[str, int, int]]], bytes_items: dict[str, tuple[str, int, int]] | None = None
) -> bytes:
    """A ``.metadata`` pickle: ``shards`` maps a shard file to ``(tensor fqn, offset, length)`` items,
    each a 1-D bf16 chunk; ``bytes_items`` maps an fqn to ``(file, offset, length)``."""
    state_dict_metadata: dict[str, Any] = {}
    storage_data: dict[MetadataIndex, _StorageInfo] = {}
    for path, items in shards.items():
        for fqn, offset, length in items:
            chunk = ChunkStorageMetadata(Size((0,)), Size((length // 2,)))
            state_dict_metadata[fqn] = TensorStorageMetadata(
                TensorProperties(bfloat16), Size((length // 2,)), [chunk]
            )
            storage_data[MetadataIndex(fqn, Size((0,)), 0)] = _StorageInfo(path, offset, length)
    for fqn, (path, offset, length) in (bytes_items or {}).items():
        state_dict_metadata[fqn] = BytesStorageMetadata()
        storage_data[MetadataIndex(fqn)] = _StorageInfo(path, offset, length)
    metadata = Metadata(
        state_dict_metadata,
        planner_data={fqn: (fqn,) for fqn in state_dict_metadata},
        storage_data=storage_data,
        storage_meta=StorageMeta(checkpoint_id="s3://bucket/ckpt", save_id="save-1"),
        version="1.0.0",
    )
    with _torch_modules():
        return pickle.dumps(metadata, protocol=pickle.DEFAULT_PROTOCOL)
