"""Issue 15: whatever a training pod writes into one checkpoint condemns that checkpoint only.

Each malformed checkpoint here is newer than a good one: it gets a bounded reason and
``latest_verified`` falls back to the good one instead of raising.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct

import pytest

from tests.checkpoints.builders import prefix_of, put, write_dcp, write_hf
from trainops.checkpoints.latest import MAX_SKIPPED, latest_verified
from trainops.checkpoints.store import CheckpointStore, TooManyEntries
from trainops.checkpoints.uri import S3Uri
from trainops.checkpoints.verify import MAX_REASON_CHARS, verify_checkpoint


def _commit_forged(client, bucket: str, prefix: str, manifest: bytes) -> None:
    """A manifest of the pod's choosing with a ``_COMMITTED`` that vouches for it."""
    put(client, bucket, prefix + "trainops-manifest.json", manifest)
    body = {"manifest": "trainops-manifest.json", "manifest_sha256": hashlib.sha256(manifest).hexdigest()}
    put(client, bucket, prefix + "_COMMITTED", json.dumps(body).encode())


def _safetensors_with_header(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + b"\0" * 16


_DEEP = b"[" * 100_000 + b"]" * 100_000

MANIFESTS = {
    "manifest-a-json-list": b"[1, 2, 3]",
    "files-a-string": b'{"files": "all of them"}',
    "entry-an-int": b'{"files": [7]}',
    "size-a-string": b'{"files": [{"key": "__0_0.distcp", "size": "big", "etag": "x"}]}',
    "unhashable-key": b'{"files": [{"key": ["a"], "size": 1, "etag": "x"}]}',
    "deep-nesting": b'{"files": ' + _DEEP + b"}",
}


@pytest.mark.parametrize("manifest", MANIFESTS.values(), ids=MANIFESTS.keys())
def test_a_malformed_manifest_condemns_its_checkpoint_only(client, bucket, run, manifest):
    write_dcp(client, bucket, prefix_of(run) + "step-100/")
    write_dcp(client, bucket, prefix_of(run) + "step-200/")
    _commit_forged(client, bucket, prefix_of(run) + "step-200/", manifest)

    latest = latest_verified(run)

    assert latest.checkpoint is not None and latest.checkpoint.uri == f"{run}step-100/"
    [skipped] = latest.skipped
    assert skipped.uri == f"{run}step-200/"
    assert any("trainops-manifest.json is not valid" in reason for reason in skipped.reasons), skipped.reasons


HEADERS = {
    "header-a-json-list": b"[1, 2]",
    "header-a-string": b'"weights"',
    "offsets-an-int": b'{"w": {"data_offsets": 16}}',
    "offsets-strings": b'{"w": {"data_offsets": ["0", "16"]}}',
    "deep-nesting": _DEEP,
}


@pytest.mark.parametrize("header", HEADERS.values(), ids=HEADERS.keys())
def test_a_malformed_safetensors_header_condemns_its_checkpoint_only(client, bucket, run, header):
    write_hf(client, bucket, prefix_of(run) + "checkpoint-100/", 100)
    write_hf(client, bucket, prefix_of(run) + "checkpoint-200/", 200)
    put(client, bucket, prefix_of(run) + "checkpoint-200/model.safetensors", _safetensors_with_header(header))

    latest = latest_verified(run)

    assert latest.checkpoint is not None and latest.checkpoint.uri == f"{run}checkpoint-100/"
    reasons = latest.skipped[0].reasons
    assert any("model.safetensors has an unreadable safetensors header" in r for r in reasons), reasons


def test_a_safetensors_header_of_zero_bytes_is_a_reason_not_an_s3_error(client, bucket, run):
    write_hf(client, bucket, prefix_of(run) + "checkpoint-200/", 200)
    put(client, bucket, prefix_of(run) + "checkpoint-200/model.safetensors", struct.pack("<Q", 0) + b"\0" * 8)
    result = verify_checkpoint(f"{run}checkpoint-200/")
    assert any("declares a 0-byte header" in reason for reason in result.reasons), result.reasons


def test_a_huge_reason_is_cut_short(client, bucket, run):
    """A manifest naming a 5 MB key made a 5 MB reason that reached XCom and the exception text."""
    write_dcp(client, bucket, prefix_of(run) + "step-200/")
    long_key = "k" * 5_000_000
    manifest = json.dumps({"files": [{"key": long_key, "size": 1, "etag": "x"}]}).encode()
    _commit_forged(client, bucket, prefix_of(run) + "step-200/", manifest)

    result = verify_checkpoint(f"{run}step-200/")

    assert not result.ok
    assert all(len(reason) <= MAX_REASON_CHARS for reason in result.reasons)
    assert re.fullmatch(r"k+\.\.\. \(50000\d\d characters\)", result.reasons[0]), result.reasons[0][-60:]


def test_the_skipped_list_is_bounded_yet_the_fallback_reaches_the_oldest(client, bucket, run):
    write_dcp(client, bucket, prefix_of(run) + "step-1/")
    for step in range(2, MAX_SKIPPED + 5):
        put(client, bucket, prefix_of(run) + f"step-{step}/notes.txt", b"not a checkpoint")

    latest = latest_verified(run)

    assert latest.checkpoint is not None and latest.checkpoint.uri == f"{run}step-1/"
    assert latest.skipped_count == MAX_SKIPPED + 3
    assert [r.uri for r in latest.skipped] == [f"{run}step-{s}/" for s in range(MAX_SKIPPED + 4, 4, -1)]
    assert latest.to_dict()["skipped_count"] == MAX_SKIPPED + 3


def test_a_run_path_stuffed_with_entries_is_refused_naming_it_not_held_in_memory(client, bucket, run):
    for step in range(1, 8):
        put(client, bucket, prefix_of(run) + f"step-{step}/notes.txt", b"x")
    put(client, bucket, prefix_of(run) + "heartbeat.json", b"{}")
    store = CheckpointStore(client)

    names, objects = store.list_dir(S3Uri.parse(run), limit=8)
    assert len(names) == 7 and [o.key for o in objects] == [prefix_of(run) + "heartbeat.json"]
    with pytest.raises(TooManyEntries, match=r"runs/demo/ holds more than 7 entries: delete old checkpoints"):
        store.list_dir(S3Uri.parse(run), limit=7)
