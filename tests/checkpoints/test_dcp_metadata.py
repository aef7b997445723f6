"""A DCP .metadata is untrusted data: it is read with a restricted unpickler that runs nothing and
changes nothing in the process, yet reads everything torch writes there."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tracemalloc

import pytest

from tests.checkpoints import torch_dcp
from tests.checkpoints.builders import put, write_dcp
from trainops.checkpoints.formats import dcp_metadata
from trainops.checkpoints.formats.dcp_metadata import (
    ALLOWED_GLOBALS,
    RefusedPickle,
    load_metadata,
    shard_requirements,
)
from trainops.checkpoints.verify import verify_checkpoint


class _RunsShell:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _Evaluates:
    def __reduce__(self):
        return (eval, ("__import__('pathlib').Path('marker').touch()",))


@pytest.fixture(scope="module")
def real() -> bytes:
    """The ``.metadata`` torch wrote for a two-rank checkpoint."""
    return (torch_dcp.checkpoint() / ".metadata").read_bytes()


def _global(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


def _str(text: str) -> bytes:
    return b"X" + len(text.encode()).to_bytes(4, "little") + text.encode()


@pytest.mark.servers
def test_torch_metadata_yields_the_size_each_shard_needs(real):
    requirements = shard_requirements(load_metadata(real))
    directory = torch_dcp.checkpoint()
    assert requirements.min_sizes == {
        name: (directory / name).stat().st_size for name in ("__0_0.distcp", "__1_0.distcp")
    }
    assert requirements.unstored_items == [] and requirements.incomplete_tensors == []


@pytest.mark.servers
def test_every_field_torch_writes_is_read(real):
    metadata = load_metadata(real)
    items = metadata.state_dict_metadata
    weight = items["layer0.weight"]  # a DTensor of 5 rows sharded over 2 ranks
    assert weight.size == (5, 3)
    assert [(chunk.offsets, chunk.sizes) for chunk in weight.chunks] == [((0, 0), (3, 3)), ((3, 0), (2, 3))]
    assert weight.properties.state == ("float32", "torch.strided", False, 0, False)
    assert items["layer0.bias"].properties.state[0] == "bfloat16"
    assert items["scale"].size == () and items["scale"].chunks[0].offsets == ()
    assert {items[f"buffers.{name}"].properties.state[0] for name in ("float8_e4m3fn", "bool", "uint16")} == {
        "float8_e4m3fn",
        "bool",
        "uint16",
    }
    assert type(items["step"]) is dcp_metadata.BytesStorageMetadata
    assert metadata.planner_data["optimizer.param_groups.0.lr"] == ("optimizer.param_groups", 0, "lr")
    assert str(metadata.storage_meta.checkpoint_id) == str(torch_dcp.checkpoint())
    assert metadata.version == "1.0.0"


@pytest.mark.servers
def test_a_chunk_without_storage_or_a_tensor_missing_a_chunk_is_reported(real):
    metadata = load_metadata(real)
    metadata.state_dict_metadata["layer0.weight"].chunks.pop()
    del metadata.storage_data[next(index for index in metadata.storage_data if index.fqn == "layer1.weight")]
    requirements = shard_requirements(metadata)
    assert requirements.incomplete_tensors == ["layer0.weight"]
    assert requirements.unstored_items == ["layer1.weight"]


@pytest.mark.servers
def test_the_reader_imports_no_torch():
    """Airflow workers and the triggerer have no torch: reading real metadata must not need it."""
    code = (
        "import sys\n"
        "from trainops.checkpoints.verify import verify_checkpoint\n"
        "from trainops.checkpoints.formats.dcp_metadata import load_metadata, shard_requirements\n"
        "requirements = shard_requirements(load_metadata(open(sys.argv[1], 'rb').read()))\n"
        "print(sorted(requirements.min_sizes), 'torch' in sys.modules)\n"
    )
    metadata = torch_dcp.checkpoint() / ".metadata"
    run = subprocess.run(
        [sys.executable, "-c", code, str(metadata)], capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "['__0_0.distcp', '__1_0.distcp'] False"


def test_malicious_metadata_in_s3_is_refused_without_running_anything(client, bucket, run, tmp_path):
    marker = tmp_path / "pwned"
    prefix = run.split("/", 3)[3] + "step-100/"
    write_dcp(client, bucket, prefix)
    put(client, bucket, prefix + ".metadata", pickle.dumps(_RunsShell(f"touch {marker}")))

    result = verify_checkpoint(f"{run}step-100/")

    assert not result.ok
    assert any("refused to load" in reason and "system" in reason for reason in result.reasons), (
        result.reasons
    )
    assert not marker.exists()


def test_eval_inside_an_allowed_container_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RefusedPickle, match="builtins.eval"):
        load_metadata(pickle.dumps({"state_dict_metadata": [_Evaluates()]}))
    assert not (tmp_path / "marker").exists()


@pytest.mark.servers
@pytest.mark.parametrize("state", [b"}" + _str("evil") + b"K\x01s", b"N}" + _str("evil") + b"K\x01s\x86"])
@pytest.mark.parametrize("module, name", sorted(ALLOWED_GLOBALS))
def test_build_on_an_allowed_global_changes_nothing(module, name, state, real):
    """BUILD aimed at the global itself (dict state or slot state) must not set attributes on it:
    issue 15 rewrote ``pathlib.PurePosixPath._flavour`` process-wide this way."""
    target = ALLOWED_GLOBALS[(module, name)]
    with pytest.raises((RefusedPickle, ValueError)):
        load_metadata(b"\x80\x02" + _global(module, name) + state + b"b.")
    assert not hasattr(target, "evil")
    assert shard_requirements(load_metadata(real)).unstored_items == []  # the reader still works


def test_allowed_globals_are_our_own_inert_classes_and_values():
    for value in ALLOWED_GLOBALS.values():
        value = getattr(value, "__self__", value)  # torch.Size: the lookup of our own checked sizes
        kind = value if isinstance(value, type) else type(value)
        assert kind.__module__ == dcp_metadata.__name__, kind


@pytest.mark.parametrize(
    "payload, error",
    [
        (_global("torch", "Size") + _str("x" * 1000) + b"\x85R.", "torch.Size takes a tuple"),
        (_global("torch", "Size") + b"(" + _str("a") + b"t\x85R.", "non-negative int64s"),
        (_global("torch", "Size") + b"(" + b"K\x01" * 65 + b"t\x85R.", "at most 64"),
        (_global("torch.serialization", "_get_layout") + _str("os.system") + b"\x85R.", "not a torch layout"),
        (
            _global("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING") + b"K\x07\x85R.",
            "0, 1 or 2",
        ),
        (_global("pathlib", "PosixPath") + b"(" + b"K\x01" + b"t" + b"R.", "takes strings"),
        (_global("pathlib", "PosixPath") + _str("x" * 5000) + b"\x85R.", "at most 4096 characters"),
        (_global("torch", "Size") + b"(\x8a\x09" + b"\x00" * 8 + b"\x01" + b"t\x85R.", "int64s"),
    ],
    ids=[
        "size-of-a-string",
        "size-of-strings",
        "size-of-65-dims",
        "layout",
        "memory-format",
        "path-of-an-int",
        "long-path",
        "size-over-int64",
    ],
)
def test_allowed_constructors_check_their_arguments(payload, error):
    """A stored string fed to torch.Size by reference N times was a memory bomb (issue 15)."""
    with pytest.raises(RefusedPickle, match=error):
        load_metadata(b"\x80\x02" + payload)


def test_one_stored_size_fed_to_torch_size_again_and_again_costs_one_object():
    """Issue 15: one stored value fed to torch.Size 100,000 times by reference was a memory bomb."""
    dims = b"(" + b"J\x00\x00\x01\x00" * 64 + b"t"  # 64 dims of 65536
    payload = b"\x80\x02](" + _global("torch", "Size") + b"q\x01" + dims + b"\x85q\x02R"
    payload += b"h\x01h\x02R" * 100_000 + b"e."
    tracemalloc.start()
    with pytest.raises(ValueError, match="holds a list, not a DCP Metadata"):
        load_metadata(payload)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * len(payload)  # a copy per reference would take over 100 times the payload


def test_shared_sizes_keep_values_that_hash_alike_apart():
    collide = 5 + 2**61 - 1  # hash(collide) == hash(5), and both fit an int64
    torch_size = ALLOWED_GLOBALS[("torch", "Size")]  # what the unpickler calls
    assert torch_size((5,)) == (5,) and type(torch_size((5,))) is dcp_metadata.TorchSize
    assert torch_size((collide,)) == (collide,)
    assert torch_size((5,)) is torch_size(tuple([5]))


def test_a_pickle_of_something_else_is_not_metadata():
    with pytest.raises(ValueError, match="not a DCP Metadata"):
        load_metadata(pickle.dumps({"a": 1}))


def test_garbage_is_unreadable_not_a_crash():
    with pytest.raises(ValueError, match="unreadable pickle"):
        load_metadata(b"\x80\x04not a pickle")


@pytest.mark.servers
def test_storage_entry_escaping_the_checkpoint_is_refused(real):
    escaping = real.replace(b"__1_0.distcp", b"../_0.distcp")  # same length: the pickle stays valid
    with pytest.raises(ValueError, match="unsafe path '../_0.distcp'"):
        shard_requirements(load_metadata(escaping))
