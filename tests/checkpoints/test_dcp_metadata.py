"""A DCP .metadata is untrusted data: it is read with a restricted unpickler that runs nothing."""

from __future__ import annotations

import os
import pickle

import pytest

from tests.checkpoints.builders import put, write_dcp
from tests.checkpoints.torch_standin import dcp_metadata
from trainops.checkpoints.formats.dcp_metadata import RefusedPickle, load_metadata, shard_requirements
from trainops.checkpoints.verify import verify_checkpoint


class _RunsShell:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _Evaluates:
    def __reduce__(self):
        return (eval, ("__import__('pathlib').Path('marker').touch()",))


def test_torch_metadata_yields_the_size_each_shard_needs():
    data = dcp_metadata(
        {"__0_0.distcp": [("w", 0, 64), ("b", 64, 32)], "__1_0.distcp": [("v", 0, 16)]},
        {"step": ("__1_0.distcp", 16, 8)},
    )
    requirements = shard_requirements(load_metadata(data))
    assert requirements.min_sizes == {"__0_0.distcp": 96, "__1_0.distcp": 24}
    assert requirements.unstored_items == []


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


def test_a_pickle_of_something_else_is_not_metadata():
    with pytest.raises(ValueError, match="not a DCP Metadata"):
        load_metadata(pickle.dumps({"a": 1}))


def test_garbage_is_unreadable_not_a_crash():
    with pytest.raises(ValueError, match="unreadable pickle"):
        load_metadata(b"\x80\x04not a pickle")


def test_storage_entry_escaping_the_checkpoint_is_refused():
    data = dcp_metadata({"../other-run/__0_0.distcp": [("w", 0, 64)]})
    with pytest.raises(ValueError, match="unsafe path"):
        shard_requirements(load_metadata(data))
