"""Issue 15: a DCP ``.metadata`` is pre-scanned, then read in a child process with CPU and memory
limits; every bomb ends as a reason and the verifying process stays small."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.checkpoints import torch_dcp
from trainops.checkpoints.formats import pickle_scan
from trainops.checkpoints.formats.dcp_metadata import RefusedPickle
from trainops.checkpoints.formats.sandbox import read_requirements


def _global(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


def _str(text: str) -> bytes:
    return b"X" + len(text.encode()).to_bytes(4, "little") + text.encode()


MERSENNE = 2**61 - 1
# Issue 15's CPU bomb: a plain dict whose int keys all hash alike (no globals at all).
CPU_BOMB = pickle.dumps({k * MERSENNE: 0 for k in range(1, 20_000)}, protocol=4)
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
SLOW = b"\x80\x02" + b"N0" * 5_000_000 + b"N."  # 10 million opcodes, each harmless

SCAN_REFUSALS = {
    "cpu-bomb": (CPU_BOMB, "an integer outside int64"),
    "build-on-a-class": (BUILD_ON_A_CLASS, "BUILD sets state only on a DCP metadata record"),
    "tuple-keys": (TUPLE_KEYS, "a dict key of kind tuple"),
    "a-set": (A_SET, "no sets"),
    "reduce-on-a-record": (REDUCE_ON_A_RECORD, "REDUCE calls only"),
    "newobj-of-a-value": (NEWOBJ_OF_A_VALUE, "NEWOBJ builds only DCP metadata records"),
    "os-system": (
        b"\x80\x02" + _global("os", "system") + _str("true") + b"\x85R.",
        "refused to load os.system",
    ),
    "truncated": (b"\x80\x02]q\x00(K\x01", "malformed pickle"),
}


@pytest.mark.parametrize("payload, message", SCAN_REFUSALS.values(), ids=SCAN_REFUSALS.keys())
def test_the_pre_scan_refuses_what_dcp_metadata_never_holds(payload, message):
    with pytest.raises(RefusedPickle, match="refused by the pre-scan") as error:
        pickle_scan.scan(payload)
    assert message in str(error.value)


def test_the_pre_scan_passes_what_torch_writes():
    pickle_scan.scan((torch_dcp.checkpoint() / ".metadata").read_bytes())
    pickle_scan.scan((torch_dcp.checkpoint(ranks=1) / ".metadata").read_bytes())


def test_a_reader_that_runs_out_of_memory_is_a_reason():
    with pytest.raises(RefusedPickle, match="ran out of its 64 MiB memory limit"):
        read_requirements(LIST_BOMB, memory=64 << 20)


def test_a_reader_past_its_cpu_limit_is_killed_and_a_reason():
    with pytest.raises(RefusedPickle, match="killed past the 1 s CPU limit"):
        read_requirements(SLOW, cpu_s=1)


def test_the_torch_size_memory_bomb_is_refused_in_the_child():
    with pytest.raises(RefusedPickle, match="torch.Size takes a tuple"):
        read_requirements(MEMORY_BOMB)


def test_the_verifying_process_survives_every_payload_under_1_gib():
    """Done-when of issue 15: every payload, one process, its own and its children's peak RSS < 1 GiB."""
    payloads = [CPU_BOMB, MEMORY_BOMB, BUILD_ON_A_CLASS, TUPLE_KEYS, LIST_BOMB, REDUCE_ON_A_RECORD]
    code = (
        "import json, pathlib, resource, sys\n"
        "from trainops.checkpoints.formats.sandbox import read_requirements\n"
        "outcomes = []\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        read_requirements(pathlib.Path(path).read_bytes(), memory=256 << 20)\n"
        "        outcomes.append('read')\n"
        "    except Exception as error:\n"
        "        outcomes.append(type(error).__name__)\n"
        "pathlib.PurePosixPath('still', 'works')\n"
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
    assert self_kib < 1 << 20 and children_kib < 1 << 20, (self_kib, children_kib)
