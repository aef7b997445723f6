"""What a gang training run is: the container, its size, its queue and where its checkpoints live."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainops.training.naming import check_dns_label

DEFAULT_NAMESPACE = "training"
DEFAULT_QUEUE = "training"
DEFAULT_PRIORITY_CLASS = "training-standard"
CONTAINER_NAME = "trainer"
RESERVED_ENV = ("TRAINOPS_RUN_URI", "TRAINOPS_RESUME_FROM", "TRAINOPS_ATTEMPT", "JOB_COMPLETION_INDEX")


@dataclass(frozen=True)
class TrainingSpec:
    """One training run.  ``nodes`` pods, one per node, each asking for ``gpus_per_node`` GPUs.

    ``node_names``: run only on these nodes (the claimed set); empty means any node of the GPU pool.
    ``env`` is added to every pod; the ``TRAINOPS_*`` variables are set by trainops itself.
    """

    image: str
    command: Sequence[str]
    run_uri: str
    nodes: int = 1
    gpus_per_node: int = 8
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    namespace: str = DEFAULT_NAMESPACE
    queue: str = DEFAULT_QUEUE
    priority_class: str = DEFAULT_PRIORITY_CLASS
    node_names: Sequence[str] = ()
    cpu: str | None = None
    memory: str | None = None
    termination_grace_seconds: int = 30
    service_account: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.image, str) or not self.image.strip():
            raise ValueError("image must be a container image reference, e.g. 'registry.example/trainer:1.0'")
        if (
            isinstance(self.command, str)
            or not self.command
            or not all(isinstance(c, str) for c in self.command)
        ):
            raise ValueError("command must be a non-empty list of strings, e.g. ['python', '-m', 'train']")
        if isinstance(self.args, str):
            raise ValueError("args must be a list of strings, not one string")
        for name, value, least in (("nodes", self.nodes, 1), ("gpus_per_node", self.gpus_per_node, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if (
            not isinstance(self.run_uri, str)
            or not self.run_uri.startswith("s3://")
            or not self.run_uri[5:].split("/")[0]
        ):
            raise ValueError(
                f"run_uri must be an s3:// URI with a bucket, e.g. 's3://bucket/runs/my-run/', got {self.run_uri!r}"
            )
        for name in ("namespace", "queue", "priority_class"):
            check_dns_label(getattr(self, name), name)
        if self.node_names and len(set(self.node_names)) < self.nodes:
            raise ValueError(
                f"node_names holds {len(set(self.node_names))} distinct nodes but nodes={self.nodes}: "
                "claim at least as many nodes as the run needs"
            )
        if reserved := sorted(set(self.env) & set(RESERVED_ENV)):
            raise ValueError(f"env must not set {', '.join(reserved)}: trainops sets them for every attempt")
        if self.termination_grace_seconds < 0:
            raise ValueError("termination_grace_seconds must be >= 0")

    @property
    def run_path(self) -> str:
        """``run_uri`` in directory form (ends with '/')."""
        return self.run_uri if self.run_uri.endswith("/") else self.run_uri + "/"
