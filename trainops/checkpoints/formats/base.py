"""What a format check sees: one checkpoint's listing, its parent's files, and bounded reads."""

from __future__ import annotations

import re
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field

from trainops.checkpoints.store import CheckpointStore, ObjectInfo
from trainops.checkpoints.uri import S3Uri

STRUCTURAL, METADATA, DEEP = "structural", "metadata", "deep"
LEVELS = (STRUCTURAL, METADATA, DEEP)
METADATA_READ_LIMIT = 16 << 20  # JSON metadata; kinds that need more pass their own limit
TRACKER_READ_LIMIT = 4096

_STEP_PATTERNS = [
    re.compile(r"^step-(\d+)$"),  # trainops, torchtitan
    re.compile(r"^checkpoint-(\d+)$"),  # Hugging Face Trainer
    re.compile(r"^iter_(\d+)$"),  # Megatron-LM
    re.compile(r"^global_step(\d+)$"),  # DeepSpeed default tag
    re.compile(r"(?:^|[-_])step=(\d+)"),  # NeMo / Lightning
]


def step_from_name(name: str) -> int | None:
    """The training step a checkpoint directory name encodes, or None for other names."""
    for pattern in _STEP_PATTERNS:
        if match := pattern.search(name):
            return int(match.group(1))
    return None


@dataclass
class Checkpoint:
    """One checkpoint directory: its objects (keyed relative to it) and the files beside it.

    ``sibling_names`` are the names of the files in the parent directory when the caller has
    listed it already (``latest_verified`` does); otherwise each sibling asked about costs a HEAD.
    """

    store: CheckpointStore
    uri: S3Uri
    files: dict[str, ObjectInfo]
    sibling_names: set[str] | None = None
    _sibling_seen: dict[str, bool] = field(default_factory=dict, repr=False)
    _unfinished_uploads: set[str] | None = field(default=None, repr=False)
    _prefetched: dict[str, tuple[int, Future]] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.uri.name

    @property
    def step(self) -> int | None:
        return step_from_name(self.name)

    def read(self, relative_key: str, *, limit: int = METADATA_READ_LIMIT) -> bytes | None:
        prefetched = self._prefetched.pop(relative_key, None)
        if prefetched is not None and prefetched[0] == limit:
            return prefetched[1].result()
        return self.store.read(self.uri.bucket, self.uri.key(relative_key), limit=limit)

    def prefetch(self, wanted: dict[str, int], pool: Executor) -> None:
        """Start reading, all at once on ``pool``, the objects of ``wanted`` (relative key -> size limit)
        the listing has: the checks read them one after another, and ``read`` takes them from here."""
        for key, limit in wanted.items():
            if key in self.files and key not in self._prefetched:
                future = pool.submit(self.store.read, self.uri.bucket, self.uri.key(key), limit=limit)
                self._prefetched[key] = (limit, future)

    def has_sibling(self, name: str) -> bool:
        """Whether a file ``name`` exists beside the checkpoint (in its parent directory)."""
        if self.sibling_names is not None:
            return name in self.sibling_names
        if name not in self._sibling_seen:
            self._sibling_seen[name] = self.store.exists(self.uri.bucket, self.uri.parent.key(name))
        return self._sibling_seen[name]

    def read_sibling(self, name: str, *, limit: int = TRACKER_READ_LIMIT) -> bytes | None:
        """The file ``name`` beside the checkpoint, or None when there is none."""
        if not self.has_sibling(name):
            return None
        return self.store.read(self.uri.bucket, self.uri.parent.key(name), limit=limit)

    def missing(self, relative_key: str, referenced_by: str) -> str:
        """The reason text for a file that ``referenced_by`` requires and the listing lacks."""
        if self._unfinished_uploads is None:
            self._unfinished_uploads = self.store.unfinished_uploads(self.uri)
        reason = f"{relative_key} is missing ({referenced_by})"
        if self.uri.key(relative_key) in self._unfinished_uploads:
            reason += "; its multipart upload was started and never completed"
        return reason
