"""Read a PyTorch DCP ``.metadata`` pickle without torch and without running code from the bucket.

``.metadata`` is ``pickle.dump(Metadata(...))`` (``torch/distributed/checkpoint/filesystem.py``).
The unpickler below resolves only the known DCP metadata class names, and resolves each to an
inert stand-in defined here; torch dtypes and layouts become plain names.  Anything else (for
example ``os.system`` or ``builtins.eval``) is refused before it can be called.
"""

from __future__ import annotations

import enum
import io
import pickle
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any


class _Record:
    """An inert stand-in for one DCP dataclass: keeps the pickled state as attributes."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = {**(state[0] or {}), **state[1]}  # (dict state, slots state)
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state  # TensorProperties pickles itself as a tuple


class Metadata(_Record):
    state_dict_metadata: dict
    storage_data: Any = None


class TensorStorageMetadata(_Record):
    chunks: list


class BytesStorageMetadata(_Record):
    pass


class ChunkStorageMetadata(_Record):
    offsets: tuple


class TensorProperties(_Record):
    pass


class StorageMeta(_Record):
    pass


class MetadataIndex(_Record):
    fqn: str
    offset: tuple | None = None


class StorageInfo(_Record):
    relative_path: str
    offset: int
    length: int


class MemFormatEncoding(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


class TorchSize(tuple):
    """``torch.Size`` is a tuple of ints; it pickles as ``torch.Size((d0, d1, ...))``."""


class TorchName(str):
    """A torch singleton such as ``torch.float32`` or ``torch.strided``, kept as its name."""


_DCP = "torch.distributed.checkpoint"
_ALLOWED: dict[tuple[str, str], Any] = {
    (f"{_DCP}.metadata", "Metadata"): Metadata,
    (f"{_DCP}.metadata", "TensorStorageMetadata"): TensorStorageMetadata,
    (f"{_DCP}.metadata", "BytesStorageMetadata"): BytesStorageMetadata,
    (f"{_DCP}.metadata", "ChunkStorageMetadata"): ChunkStorageMetadata,
    (f"{_DCP}.metadata", "TensorProperties"): TensorProperties,
    (f"{_DCP}.metadata", "StorageMeta"): StorageMeta,
    (f"{_DCP}.metadata", "MetadataIndex"): MetadataIndex,
    (f"{_DCP}.metadata", "_MEM_FORMAT_ENCODING"): MemFormatEncoding,
    (f"{_DCP}.filesystem", "_StorageInfo"): StorageInfo,
    ("torch", "Size"): TorchSize,
    ("collections", "OrderedDict"): dict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("pathlib", "PosixPath"): PurePosixPath,
    ("pathlib", "PurePosixPath"): PurePosixPath,
}
_TORCH_SINGLETON = re.compile(
    r"^(b?float\w*|u?int\d*|complex\w*|c?half|double|short|long|bool|q?u?int\w*|bits\w*|cfloat|cdouble"
    r"|strided|sparse_\w+|_mkldnn|jagged)$"
)


class RefusedPickle(pickle.UnpicklingError):
    """The pickle names something other than DCP metadata classes."""


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and _TORCH_SINGLETON.match(name):
            return TorchName(name)
        raise RefusedPickle(f"refused to load {module}.{name}: it is not a DCP metadata class")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("refused a persistent id: DCP metadata has none")


@dataclass(frozen=True)
class ShardRequirements:
    """What ``.metadata`` requires of the shard files."""

    min_sizes: dict[str, int]  # relative path -> largest offset + length referenced in it
    unstored_items: list[str]  # state-dict items with no storage entry


def load_metadata(data: bytes) -> Metadata:
    """Unpickle ``.metadata`` with the restricted unpickler; raises RefusedPickle or ValueError."""
    try:
        metadata = _RestrictedUnpickler(io.BytesIO(data)).load()
    except RefusedPickle:
        raise
    except Exception as error:  # a corrupt pickle raises many types; all mean "unreadable"
        raise ValueError(f"unreadable pickle: {type(error).__name__}: {error}") from error
    if not isinstance(metadata, Metadata):
        raise ValueError(f"holds a {type(metadata).__name__}, not a DCP Metadata")
    return metadata


def shard_requirements(metadata: Metadata) -> ShardRequirements:
    """Check the metadata's shape and return the size each shard must have at least."""
    storage = getattr(metadata, "storage_data", None)
    items = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(storage, dict) or not isinstance(items, dict):
        raise ValueError(
            "has no storage_data/state_dict_metadata dictionaries (not written by a file writer)"
        )
    min_sizes: dict[str, int] = {}
    stored: set[tuple[str, tuple | None]] = set()
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, StorageInfo):
            raise ValueError("storage_data maps something other than MetadataIndex to _StorageInfo")
        path, offset, length = info.relative_path, info.offset, info.length
        if not isinstance(path, str) or path.startswith("/") or ".." in path.split("/"):
            raise ValueError(f"storage entry names an unsafe path {path!r}")
        if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0 and length >= 0):
            raise ValueError(f"storage entry for {path} has a bad offset/length ({offset!r}, {length!r})")
        min_sizes[path] = max(min_sizes.get(path, 0), offset + length)
        stored.add((index.fqn, _offsets(getattr(index, "offset", None))))
    unstored = []
    for fqn, item in items.items():
        chunks = getattr(item, "chunks", None) if isinstance(item, TensorStorageMetadata) else [None]
        for chunk in chunks or []:
            if (fqn, _offsets(getattr(chunk, "offsets", None))) not in stored:
                unstored.append(fqn)
                break
    return ShardRequirements(min_sizes, unstored)


def _offsets(value: Any) -> tuple | None:
    return None if value is None else tuple(value)
