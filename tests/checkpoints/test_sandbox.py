"""Issue 15: a DCP ``.metadata`` is read in a child process with CPU and memory limits, forked per item
from a warm reader; every bomb ends as a reason, the next read is unharmed and the verifying process
stays small."""

from __future__ import annotations

import functools
import json
import os
import pathlib
import pickle
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.checkpoints import torch_dcp
from trainops.checkpoints.formats import sandbox
from trainops.checkpoints.formats.dcp_metadata import RefusedPickle
from trainops.checkpoints.formats.sandbox import read_requirements


def _global(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


def _str(text: str) -> bytes:
    return b"X" + len(text.encode()).to_bytes(4, "little") + text.encode()


def _colliding_dict(keys: int) -> bytes:
    """A pickled dict whose int keys all hash alike, written directly (building it would take the
    quadratic time it costs its reader)."""
    mersenne = 2**61 - 1
    items = []
    for k in range(1, keys):
        key = (k * mersenne).to_bytes(12, "little", signed=True)
        items.append(b"\x8a\x0c" + key + b"K\x00")  # LONG1 of 12 bytes, the value 0
    return b"\x80\x04}(" + b"".join(items) + b"u."


# Issue 15's CPU bomb: a plain dict whose int keys all hash alike (no globals at all): quadratic inserts.
CPU_BOMB = _colliding_dict(20_000)
LONG_CPU_BOMB = _colliding_dict(60_000)  # ~20 s of CPU
# Issue 15's memory bomb: one stored string fed to torch.Size by reference again and again.
MEMORY_BOMB = (
    b"\x80\x02]("
    + _global("torch", "Size")
    + b"q\x01"
    + _str("x" * 1000)
    + b"\x85q\x02R"
    + b"h\x01h\x02R" * 100_000
    + b"e."
)
# Issue 15: BUILD on an allowed class rewrote pathlib.PurePosixPath._flavour process-wide.
BUILD_ON_A_CLASS = b"\x80\x02" + _global("pathlib", "PurePosixPath") + b"}" + _str("_flavour") + b"K\x01sb."
TUPLE_KEYS = pickle.dumps({(1, 2): 0}, protocol=4)
A_SET = pickle.dumps({"fqn": {1, 2}}, protocol=4)
REDUCE_ON_A_RECORD = b"\x80\x02" + _global("torch.distributed.checkpoint.metadata", "Metadata") + b")R."
NEWOBJ_OF_A_VALUE = b"\x80\x02" + _global("torch", "Size") + b")\x81."
LIST_BOMB = b"\x80\x02(" + b"]" * 3_000_000 + b"l."  # 3 MB asking for ~200 MB of lists
MEMO_BOMB = b"\x80\x02Nr" + struct.pack("<I", 0xFFFFFFF0) + b"."  # one PUT at index 4 billion: 64 GiB of memo
HUGE_BYTES = b"\x80\x04\x8e" + struct.pack("<Q", 1 << 62) + b"x."  # BINBYTES8 announcing 4 EiB
DEEP_KEY = b"\x80\x02}N" + b"\x85" * 2_000_000 + b"Ns."  # a key nested 2 million tuples deep: hashing it
# recurses in C past the stack

# What DCP metadata never holds, and the bombs that need it, end as a reason: refused (RefusedPickle)
# or not DCP metadata (ValueError); the reader of the next checkpoint is unharmed.
REFUSALS = {
    "cpu-bomb": (CPU_BOMB, ValueError, "holds a dict, not a DCP Metadata"),
    "memory-bomb": (MEMORY_BOMB, RefusedPickle, "torch.Size takes a tuple"),
    "build-on-a-class": (BUILD_ON_A_CLASS, ValueError, "unreadable pickle"),
    "tuple-keys": (TUPLE_KEYS, ValueError, "holds a dict, not a DCP Metadata"),
    "a-set": (A_SET, ValueError, "holds a dict, not a DCP Metadata"),
    "reduce-on-a-record": (REDUCE_ON_A_RECORD, RefusedPickle, "refused to call Metadata: REDUCE calls only"),
    "newobj-of-a-value": (NEWOBJ_OF_A_VALUE, ValueError, "NEWOBJ class argument must be a type"),
    "os-system": (
        b"\x80\x02" + _global("os", "system") + _str("true") + b"\x85R.",
        RefusedPickle,
        "refused to load os.system",
    ),
    "persistent-id": (b"\x80\x02X\x01\x00\x00\x00aQ.", RefusedPickle, "refused a persistent id"),
    "truncated": (b"\x80\x02]q\x00(K\x01", ValueError, "unreadable pickle"),
    "memo-bomb": (MEMO_BOMB, RefusedPickle, "ran out of its 1024 MiB memory limit"),
    "huge-bytes": (HUGE_BYTES, RefusedPickle, "ran out of its 1024 MiB memory limit"),
    "deep-key": (DEEP_KEY, RefusedPickle, "its reader died of signal SIGSEGV"),
}


@pytest.mark.servers  # torch_dcp_metadata(): a real checkpoint from two torch ranks
@pytest.mark.parametrize("payload, error, message", REFUSALS.values(), ids=REFUSALS.keys())
def test_what_dcp_metadata_never_holds_ends_as_a_reason_in_the_child(payload, error, message):
    with pytest.raises(error) as raised:
        read_requirements(payload)
    assert message in str(raised.value)
    assert pathlib.PurePosixPath("still", "works").parts == ("still", "works")
    assert read_requirements(torch_dcp_metadata()).unstored_items == []  # the next read is unharmed


@functools.cache
def torch_dcp_metadata() -> bytes:
    return (torch_dcp.checkpoint() / ".metadata").read_bytes()


@pytest.mark.servers
def test_the_reader_reads_what_torch_writes():
    for ranks in (1, 2):
        directory = torch_dcp.checkpoint(ranks=ranks)
        requirements = read_requirements((directory / ".metadata").read_bytes())
        assert requirements.min_sizes == {
            path.name: path.stat().st_size for path in directory.iterdir() if path.suffix == ".distcp"
        }


def test_a_reader_that_runs_out_of_memory_is_a_reason():
    with pytest.raises(RefusedPickle, match="ran out of its 64 MiB memory limit"):
        read_requirements(LIST_BOMB, memory=64 << 20)


def test_a_reader_past_its_cpu_limit_is_killed_and_a_reason():
    with pytest.raises(RefusedPickle, match="killed past the 1 s CPU limit"):
        read_requirements(LONG_CPU_BOMB, cpu_s=1)


def test_the_verifying_process_survives_every_payload_under_1_gib():
    """Done-when of issue 15: every payload, one process, its own and its children's peak RSS < 1 GiB."""
    payloads = [CPU_BOMB, MEMORY_BOMB, BUILD_ON_A_CLASS, TUPLE_KEYS, LIST_BOMB, MEMO_BOMB, DEEP_KEY]
    code = (
        "import json, pathlib, resource, sys\n"
        "from trainops.checkpoints.formats.sandbox import read_requirements, stop_reader\n"
        "outcomes = []\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        read_requirements(pathlib.Path(path).read_bytes(), memory=256 << 20)\n"
        "        outcomes.append('read')\n"
        "    except Exception as error:\n"
        "        outcomes.append(type(error).__name__)\n"
        "pathlib.PurePosixPath('still', 'works')\n"
        "stop_reader()  # its children's peak is counted once it is waited for\n"
        "self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "children_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(json.dumps([outcomes, self_kib, children_kib]))\n"
    )
    with tempfile.TemporaryDirectory() as directory:
        paths = []
        for index, payload in enumerate(payloads):
            paths.append(Path(directory) / f"{index}.metadata")
            paths[-1].write_bytes(payload)
        run = subprocess.run(
            [sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True, check=True
        )
    outcomes, self_kib, children_kib = json.loads(run.stdout)
    assert len(outcomes) == len(payloads) and set(outcomes) <= {"RefusedPickle", "ValueError"}, outcomes
    assert self_kib < 1 << 20 and 0 < children_kib < 1 << 20, (self_kib, children_kib)


@pytest.mark.servers  # torch_dcp_metadata(): a real checkpoint from two torch ranks
def test_a_reader_that_died_between_reads_is_replaced():
    """Killed by an operator or the OOM killer while idle: the next read starts another, and reads."""
    read_requirements(torch_dcp_metadata())
    reader = sandbox._READER.process
    os.killpg(reader.pid, signal.SIGKILL)
    reader.wait()
    assert read_requirements(torch_dcp_metadata()).unstored_items == []
    assert sandbox._READER.process.pid != reader.pid
