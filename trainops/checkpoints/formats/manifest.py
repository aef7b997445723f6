"""The trainops commit protocol: ``trainops-manifest.json``, then ``_COMMITTED`` (written once).

The manifest lists every file of the checkpoint with its size and S3 ETag, so metadata-level
verification is one listing plus two small reads, never a request per file.  ``_COMMITTED``
carries the SHA-256 of the manifest's bytes, so a manifest rewritten after the commit is caught.
The manifest is deterministic (sorted, no timestamps): concurrent commits of the same files
write identical bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from trainops.checkpoints.formats.base import STRUCTURAL, Checkpoint
from trainops.checkpoints.store import ObjectInfo

MANIFEST_FILE = "trainops-manifest.json"
COMMITTED_FILE = "_COMMITTED"
COMMIT_FILES = (MANIFEST_FILE, COMMITTED_FILE)
MANIFEST_VERSION = 1
COMMITTED_READ_LIMIT = 64 << 10
MANIFEST_READ_LIMIT = 64 << 20  # ~400,000 files


def build_manifest(files: Iterable[tuple[str, ObjectInfo]], step: int | None) -> bytes:
    """The manifest bytes for ``(relative key, object)`` pairs; commit files themselves are left out."""
    entries = sorted(
        (
            {"key": rel, "size": info.size, "etag": info.etag}
            for rel, info in files
            if rel not in COMMIT_FILES
        ),
        key=lambda entry: entry["key"],
    )
    document = {
        "version": MANIFEST_VERSION,
        "step": step,
        "files": entries,
        "bytes": sum(entry["size"] for entry in entries),
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def digest(manifest: bytes) -> str:
    return hashlib.sha256(manifest).hexdigest()


def build_committed(manifest: bytes) -> bytes:
    document = json.loads(manifest)
    body = {
        "manifest": MANIFEST_FILE,
        "manifest_sha256": digest(manifest),
        "files": len(document["files"]),
        "bytes": document["bytes"],
    }
    return json.dumps(body, sort_keys=True).encode()


def looks_committed(files: dict) -> bool:
    return any(name in files for name in COMMIT_FILES)


def check(checkpoint: Checkpoint, level: str) -> list[str]:
    """Reasons the checkpoint's commit is incomplete or its files differ from the manifest."""
    files = checkpoint.files
    if COMMITTED_FILE not in files:
        return [
            f"{COMMITTED_FILE} is missing: the commit did not finish ({MANIFEST_FILE} alone is not a commit)"
        ]
    if MANIFEST_FILE not in files:
        return [f"{COMMITTED_FILE} exists but {MANIFEST_FILE} is missing"]
    if level == STRUCTURAL:
        return []
    manifest = checkpoint.read(MANIFEST_FILE, limit=MANIFEST_READ_LIMIT)
    try:
        committed = json.loads(checkpoint.read(COMMITTED_FILE, limit=COMMITTED_READ_LIMIT))
        expected_digest = committed["manifest_sha256"]
    except (TypeError, ValueError, KeyError, IndexError, RecursionError):
        return [f"{COMMITTED_FILE} is not the JSON trainops writes (no manifest_sha256)"]
    if manifest is None or digest(manifest) != expected_digest:
        return [
            f"{MANIFEST_FILE} does not match the SHA-256 recorded in {COMMITTED_FILE}: changed after commit"
        ]
    try:
        entries = _entries(json.loads(manifest))
    except (ValueError, RecursionError):
        return [
            f"{MANIFEST_FILE} is not valid trainops manifest JSON (an object whose files are key/size/etag)"
        ]
    return _compare(checkpoint, entries)


def _entries(document: object) -> list[dict]:
    """The manifest's file entries, each checked to be ``{"key": str, "size": int, "etag": str}``."""
    entries = document.get("files") if type(document) is dict else None
    if type(entries) is not list:
        raise ValueError("no files list")
    for entry in entries:
        if not (
            type(entry) is dict
            and type(entry.get("key")) is str
            and type(entry.get("size")) is int
            and type(entry.get("etag")) is str
        ):
            raise ValueError("a file entry is not key/size/etag")
    return entries


def _compare(checkpoint: Checkpoint, entries: list[dict]) -> list[str]:
    reasons = []
    listed = {rel: info for rel, info in checkpoint.files.items() if rel not in COMMIT_FILES}
    for entry in entries:
        info = listed.pop(entry["key"], None)
        if info is None:
            reasons.append(checkpoint.missing(entry["key"], f"listed in {MANIFEST_FILE}"))
        elif info.size != entry["size"]:
            reasons.append(f"{entry['key']} is {info.size} bytes, the manifest says {entry['size']}")
        elif info.etag != entry["etag"]:
            reasons.append(
                f"{entry['key']} checksum mismatch: ETag {info.etag}, the manifest says {entry['etag']}"
            )
    reasons += [f"{rel} is not in {MANIFEST_FILE} (written after the commit?)" for rel in sorted(listed)]
    return reasons
