"""Read a PyTorch DCP ``.metadata`` pickle without torch and without running code from the bucket.

``.metadata`` is ``pickle.dump(Metadata(...))`` (``torch/distributed/checkpoint/filesystem.py``).
The unpickler resolves only the globals torch 2.2-2.14 writes there (``ALLOWED_GLOBALS``), each to an
inert class or value of our own, never to a library class.  Their classes are sealed, so a BUILD
aimed at a class itself (which would set class attributes process-wide) fails; the value classes
check their arguments, so a stored string fed to ``torch.Size`` cannot be multiplied into a memory
bomb (``torch.Size``, the commonest call, is a C-speed lookup of checked sizes); the record classes cannot be called (REDUCE) at all.  Any other global (``os.system``,
``builtins.eval``) is refused before it can be called.  The unpickler is CPython's own, in C: what no
unpickler bounds (memory, CPU, the C stack) the sandbox bounds (``sandbox``).
"""

from __future__ import annotations

import io
import math
import pickle
from dataclasses import dataclass
from typing import Any

from trainops.errors import PermanentError

MAX_DIMS = 64  # torch's own limit on a tensor's rank
MAX_DIM = 1 << 63  # sizes and offsets are int64 in torch
MAX_PATH = 4096


class RefusedPickle(PermanentError, pickle.UnpicklingError):
    """The pickle names something other than DCP metadata classes, or misuses one."""


class _Sealed(type):
    """A class whose attributes cannot be set once defined: BUILD on the class itself fails."""

    def __setattr__(cls, name: str, value: Any) -> None:
        raise RefusedPickle(f"refused to set {cls.__name__}.{name}: classes take no state")

    def __delattr__(cls, name: str) -> None:
        raise RefusedPickle(f"refused to delete {cls.__name__}.{name}: classes take no state")


class _RecordType(_Sealed):
    """A record class: built by NEWOBJ (``cls.__new__``) and BUILD as pickle builds dataclasses, never called."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise RefusedPickle(
            f"refused to call {cls.__name__}: REDUCE calls only TorchSize, Layout, MemoryFormatEncoding "
            "and CheckpointPath"
        )


class _Record(metaclass=_RecordType):
    """An inert stand-in for one DCP dataclass: BUILD stores the pickled dict in its ``__dict__``."""


class Metadata(_Record):
    pass


class TensorStorageMetadata(_Record):
    pass


class BytesStorageMetadata(_Record):
    pass


class ChunkStorageMetadata(_Record):
    pass


class TensorProperties(_Record):
    def __setstate__(self, state: Any) -> None:
        self.state = state  # (dtype, layout, requires_grad, _MEM_FORMAT_ENCODING, pin_memory)


class StorageMeta(_Record):
    pass


class MetadataIndex(_Record):
    pass


class StorageInfo(_Record):
    pass


class _Value(metaclass=_Sealed):
    """A checked value built by REDUCE; it takes no BUILD state (nor does its class)."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise RefusedPickle(f"{type(self).__name__} takes no state")


class TorchSize(_Value, tuple):
    """``torch.Size``: pickled as ``torch.Size((d0, d1, ...))``; at most 64 non-negative int64s.
    The unpickler reaches it through ``SIZES`` (one object per distinct size, looked up in C)."""

    __slots__ = ()

    def __new__(cls, dims: Any = ()) -> TorchSize:
        if type(dims) is not tuple or len(dims) > MAX_DIMS:
            raise RefusedPickle(f"torch.Size takes a tuple of at most {MAX_DIMS} non-negative int64s")
        for dim in dims:
            if type(dim) is not int or not 0 <= dim < MAX_DIM:
                raise RefusedPickle(f"torch.Size takes a tuple of at most {MAX_DIMS} non-negative int64s")
        return tuple.__new__(cls, dims)


class TorchName(_Value, str):
    """A torch singleton kept as its name: a dtype (``float32``), layout or memory format."""

    __slots__ = ()


class Layout(TorchName):
    """``torch.serialization._get_layout("torch.strided")``: the layout, checked against torch's."""

    __slots__ = ()
    NAMES = frozenset(
        f"torch.{name}"
        for name in ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")
    ) | {"torch._mkldnn", "torch.jagged"}

    def __new__(cls, name: Any) -> Layout:
        if name not in cls.NAMES:
            raise RefusedPickle(f"{str(name)[:40]!r} is not a torch layout")
        return super().__new__(cls, name)


class MemoryFormatEncoding(_Value, int):
    """``_MEM_FORMAT_ENCODING(n)``, the enum ``TensorProperties`` pickles for its memory format."""

    __slots__ = ()

    def __new__(cls, value: Any) -> MemoryFormatEncoding:
        if type(value) is not int or value not in (0, 1, 2):
            raise RefusedPickle("_MEM_FORMAT_ENCODING takes 0, 1 or 2")
        return super().__new__(cls, value)


class CheckpointPath(_Value, tuple):
    """``StorageMeta.checkpoint_id``, pickled as ``PosixPath(*parts)``: kept as its parts."""

    __slots__ = ()

    def __new__(cls, *parts: Any) -> CheckpointPath:
        return PATHS[parts]

    @classmethod
    def checked(cls, parts: tuple) -> CheckpointPath:
        if not all(type(part) is str for part in parts) or sum(map(len, parts)) + len(parts) > MAX_PATH:
            raise RefusedPickle(f"a checkpoint path takes strings of at most {MAX_PATH} characters in all")
        return tuple.__new__(cls, parts)

    def __str__(self) -> str:
        return "/".join(self).replace("//", "/")


class _Interned(dict):
    """One checked value per distinct argument: ``make(argument)`` builds it (or raises RefusedPickle) the
    first time, later lookups find it in C.  The unpickler calls ``SIZES.__getitem__(dims)`` for each
    ``torch.Size``, the commonest call of a DCP pickle, so most run no Python at all; and a pickle feeding
    one stored tuple to ``torch.Size`` a million times (a memory bomb in issue 15) gets one object back,
    not a million copies.  At most ``INTERNED_MAX`` values are kept (the sandbox reads each ``.metadata``
    in a fresh child, so one read never sees another's): keys that hash alike (ints that differ by 2**61-1 do) cost at most that many comparisons per lookup, and the
    sandbox's CPU limit bounds the rest.
    """

    def __init__(self, make: Any) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, argument: Any) -> Any:
        value = self.make(argument)
        if len(self) >= INTERNED_MAX:
            self.clear()
        self[argument] = value
        return value


INTERNED_MAX = 4096
SIZES = _Interned(TorchSize)
PATHS = _Interned(CheckpointPath.checked)

_DTYPES = frozenset(
    "bfloat16 bool complex128 complex32 complex64 float16 float32 float64 float4_e2m1fn_x2 float8_e4m3fn "
    "float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu int8 int16 int32 int64 uint8 uint16 "
    "uint32 uint64 int1 int2 int3 int4 int5 int6 int7 uint1 uint2 uint3 uint4 uint5 uint6 uint7 "
    "qint8 qint32 quint8 quint4x2 quint2x4 bits1x8 bits2x4 bits4x2 bits8 bits16".split()
)  # dtype.__reduce__() names: a dtype pickles as the bare global torch.<name>
_MEMORY_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")

_DCP = "torch.distributed.checkpoint"
_SHARD_2_2 = "torch.distributed._shard.sharded_tensor.metadata"  # torch 2.2 names
ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        (f"{_DCP}.metadata", cls.__name__): cls
        for cls in (
            Metadata,
            TensorStorageMetadata,
            BytesStorageMetadata,
            ChunkStorageMetadata,
            TensorProperties,
            StorageMeta,
            MetadataIndex,
        )
    },
    (f"{_DCP}.metadata", "_MEM_FORMAT_ENCODING"): MemoryFormatEncoding,
    (_SHARD_2_2, "TensorProperties"): TensorProperties,
    (_SHARD_2_2, "MEM_FORMAT_ENCODING"): MemoryFormatEncoding,
    (f"{_DCP}.filesystem", "_StorageInfo"): StorageInfo,
    ("torch", "Size"): SIZES.__getitem__,
    ("torch.serialization", "_get_layout"): Layout,
    **{
        (module, name): CheckpointPath
        for module in ("pathlib", "pathlib._local")
        for name in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")
    },
    **{("torch", name): TorchName(name) for name in _DTYPES},
    **{("torch._utils", f"torch.{name}"): TorchName(name) for name in _MEMORY_FORMATS},
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return ALLOWED_GLOBALS[(module, name)]
        raise RefusedPickle(f"refused to load {module}.{name}: it is not a DCP metadata class")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("refused a persistent id: DCP metadata has none")


@dataclass(frozen=True)
class ShardRequirements:
    """What ``.metadata`` requires of the shard files."""

    min_sizes: dict[str, int]  # relative path -> largest offset + length referenced in it
    unstored_items: list[str]  # state-dict items with no storage entry for some chunk
    incomplete_tensors: list[str]  # tensors whose chunks do not cover their size


def load_metadata(data: bytes) -> Metadata:
    """Unpickle ``.metadata`` with the restricted unpickler; raises RefusedPickle or ValueError."""
    try:
        metadata = _RestrictedUnpickler(io.BytesIO(data)).load()
    except (RefusedPickle, MemoryError):  # the sandbox names the limit a MemoryError hit
        raise
    except Exception as error:  # a corrupt pickle raises many types; all mean "unreadable"
        raise ValueError(f"unreadable pickle: {type(error).__name__}: {error}") from error
    if not isinstance(metadata, Metadata):
        raise ValueError(f"holds a {type(metadata).__name__}, not a DCP Metadata")
    return metadata


def shard_requirements(metadata: Metadata) -> ShardRequirements:
    """Check the metadata's shape and return the size each shard must have at least."""
    storage = metadata.__dict__.get("storage_data")
    items = metadata.__dict__.get("state_dict_metadata")
    if type(storage) is not dict or type(items) is not dict:
        raise ValueError(
            "has no storage_data/state_dict_metadata dictionaries (not written by a file writer)"
        )
    min_sizes: dict[str, int] = {}
    stored: set[tuple[str, TorchSize | None]] = set()  # (fqn, chunk offsets) with a storage entry
    for index, info in storage.items():
        if type(index) is not MetadataIndex or type(info) is not StorageInfo:
            raise ValueError("storage_data maps something other than MetadataIndex to _StorageInfo")
        entry, key = info.__dict__, index.__dict__
        path, offset, length = entry.get("relative_path"), entry.get("offset"), entry.get("length")
        if path not in min_sizes:
            if type(path) is not str or path.startswith("/") or ".." in path.split("/"):
                raise ValueError(f"storage entry names an unsafe path {str(path)[:200]!r}")
            min_sizes[path] = 0
        if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
            raise ValueError(f"storage entry for {path} has a bad offset/length")
        if offset + length > min_sizes[path]:
            min_sizes[path] = offset + length
        fqn, chunk_offsets = key.get("fqn"), key.get("offset")
        if type(fqn) is not str or not (chunk_offsets is None or type(chunk_offsets) is TorchSize):
            raise ValueError("a storage entry's MetadataIndex has no string fqn or torch.Size offset")
        stored.add((fqn, chunk_offsets))
    unstored, incomplete = [], []
    for fqn, item in items.items():
        if type(fqn) is not str:
            raise ValueError("state_dict_metadata has a key that is not a string")
        if type(item) is BytesStorageMetadata:
            if (fqn, None) not in stored:
                unstored.append(fqn)
            continue
        if type(item) is not TensorStorageMetadata:
            raise ValueError(f"{fqn[:200]}: expected TensorStorageMetadata, found {type(item).__name__}")
        chunks, size = item.__dict__.get("chunks"), item.__dict__.get("size")
        if type(chunks) is not list or type(size) is not TorchSize:
            raise ValueError(f"{fqn[:200]} has no chunk list and torch.Size size")
        volume, all_stored = 0, True
        for chunk in chunks:
            if type(chunk) is not ChunkStorageMetadata:
                raise ValueError(f"{fqn[:200]}: expected ChunkStorageMetadata, found {type(chunk).__name__}")
            offsets, sizes = chunk.__dict__.get("offsets"), chunk.__dict__.get("sizes")
            if type(offsets) is not TorchSize or type(sizes) is not TorchSize:
                raise ValueError(f"{fqn[:200]} has a chunk whose offsets or sizes are not a torch.Size")
            if all_stored and (fqn, offsets) not in stored:
                all_stored = False
            volume += math.prod(sizes)
        if not all_stored:
            unstored.append(fqn)
        if volume != math.prod(size):
            incomplete.append(fqn)
    return ShardRequirements(min_sizes, unstored, incomplete)
