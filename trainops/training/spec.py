"""What a gang training run is: the container, its size, its queue, where its checkpoints live, and
what its pods need for multi-node training (rendezvous port, /dev/shm, devices, a pod template)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainops.placement.request import TopologyRequest
from trainops.training.decide import Sizing
from trainops.training.job import build_job
from trainops.training.naming import check_dns_label
from trainops.training.podtemplate import normalize

DEFAULT_NAMESPACE = "training"
DEFAULT_QUEUE = "training"
DEFAULT_PRIORITY_CLASS = "training-standard"
DEFAULT_MASTER_PORT = 29500  # torchrun's static rendezvous default
DEFAULT_SHM_SIZE = "16Gi"
# set by trainops (and the Job controller) in every pod: the user's env must not set them
TORCH_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
)
RESERVED_ENV = (
    "TRAINOPS_RUN_URI",
    "TRAINOPS_RESUME_FROM",
    "TRAINOPS_ATTEMPT",
    "TRAINOPS_WORLD_SIZE",
    "JOB_COMPLETION_INDEX",
    *TORCH_ENV,
)
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?([mkMGTPE]|[KMGTPE]i)?$")
_RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_CAPABILITY = re.compile(r"^[A-Z][A-Z0-9_]*$")


def check_min_nodes(min_nodes: Any, nodes: int) -> None:
    """An elastic run's ``min_nodes``: None (off) or an integer from 1 to ``nodes``; else a ValueError
    naming the field and the fix."""
    if min_nodes is not None and (
        not isinstance(min_nodes, int) or isinstance(min_nodes, bool) or not 1 <= min_nodes <= nodes
    ):
        raise ValueError(
            f"min_nodes must be an integer from 1 to nodes ({nodes}), got {min_nodes!r}: the fewest nodes "
            "a resume may train on (leave it empty to always resume on all nodes)"
        )


@dataclass(frozen=True)
class TrainingSpec:
    """One training run.  ``nodes`` pods, one per node, each asking for ``gpus_per_node`` GPUs.

    ``node_names``: run only on these nodes (the claimed set); empty means any node of the GPU pool.
    ``env`` is added to every pod; the ``TRAINOPS_*`` and torch launch variables are set by trainops.
    ``procs_per_node``: processes per pod (torchrun's ``--nproc-per-node``); ``WORLD_SIZE`` is
    ``nodes * procs_per_node``.  ``master_port``: rank 0's rendezvous port.
    ``shm_size``: size limit of the memory-backed ``/dev/shm`` (None: no such volume).
    ``extra_resources``: more devices for the trainer container, e.g. ``{"rdma/ib": "1"}``.
    ``capabilities``: Linux capabilities added to it (an ``rdma/`` device adds ``IPC_LOCK`` itself).
    ``node_selector``: more node labels the pods require.  ``volumes`` / ``volume_mounts``: pod
    volumes and the trainer container's mounts, in API form (camelCase keys).
    ``pod_template``: anything else a pod may have (a dict or ``V1PodTemplateSpec``), merged under
    what trainops sets; a field both set differently is refused (see ``podtemplate``).
    ``topology``: where in the fabric Kueue places the pods (``TopologyRequest`` or its ``to_dict()``;
    ``trainops.placement``): its PodSet annotation goes on the pod template; kept as the dict.
    ``min_nodes``: the fewest nodes a resume may train on when fewer than ``nodes`` are free (None:
    ``nodes``, never fewer); ``elastic_wait_s``: how long such a resume waits for nodes before it does
    (``trainops.training.decide.Sizing``).
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
    procs_per_node: int = 1
    master_port: int = DEFAULT_MASTER_PORT
    shm_size: str | None = DEFAULT_SHM_SIZE
    extra_resources: Mapping[str, str | int] = field(default_factory=dict)
    capabilities: Sequence[str] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    volumes: Sequence[Mapping[str, Any]] = ()
    volume_mounts: Sequence[Mapping[str, Any]] = ()
    pod_template: Any = None
    topology: Mapping[str, Any] | None = None
    min_nodes: int | None = None
    elastic_wait_s: float = 0.0

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
        for name, value, least, most in (
            ("nodes", self.nodes, 1, None),
            ("gpus_per_node", self.gpus_per_node, 0, None),
            ("procs_per_node", self.procs_per_node, 1, None),
            ("master_port", self.master_port, 1, 65535),
        ):
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or value < least
                or (most and value > most)
            ):
                bounds = f">= {least}" if most is None else f"from {least} to {most}"
                raise ValueError(f"{name} must be an integer {bounds}, got {value!r}")
        check_min_nodes(self.min_nodes, self.nodes)
        if (
            isinstance(self.elastic_wait_s, bool)
            or not isinstance(self.elastic_wait_s, int | float)
            or self.elastic_wait_s < 0
        ):
            raise ValueError(f"elastic_wait_s must be a number of seconds >= 0, got {self.elastic_wait_s!r}")
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
        self._check_pod_fields()
        object.__setattr__(self, "pod_template", normalize(self.pod_template))
        topology = TopologyRequest.from_value(self.topology)
        object.__setattr__(self, "topology", topology.to_dict() if topology.active else None)
        # a trial build finds template conflicts now, before anything is submitted
        build_job(self, name="check", dag_id="check", run_id="check", attempt=1, resume_from=None)

    def _check_pod_fields(self) -> None:
        if self.shm_size is not None and not _QUANTITY.match(str(self.shm_size)):
            raise ValueError(
                f"shm_size must be a quantity such as '16Gi' (or None for no /dev/shm), got {self.shm_size!r}"
            )
        if not isinstance(self.extra_resources, Mapping):
            raise ValueError("extra_resources must map resource names to quantities, e.g. {'rdma/ib': '1'}")
        for name, quantity in self.extra_resources.items():
            if not isinstance(name, str) or len(name) > 253 or not _RESOURCE_NAME.match(name):
                raise ValueError(f"extra_resources: {name!r} is not a resource name such as 'rdma/ib'")
            if not _QUANTITY.match(str(quantity)):
                raise ValueError(
                    f"extra_resources[{name!r}] must be a quantity such as '1', got {quantity!r}"
                )
        if isinstance(self.capabilities, str) or not all(
            isinstance(c, str) and _CAPABILITY.match(c) for c in self.capabilities
        ):
            raise ValueError(
                f"capabilities must be a list of names such as ['IPC_LOCK'], got {self.capabilities!r}"
            )
        if not isinstance(self.node_selector, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.node_selector.items()
        ):
            raise ValueError("node_selector must map label keys to label values (strings)")
        for name, items, keys in (
            ("volumes", self.volumes, ("name",)),
            ("volume_mounts", self.volume_mounts, ("name", "mountPath")),
        ):
            if isinstance(items, Mapping | str) or not all(
                isinstance(i, Mapping) and all(isinstance(i.get(k), str) and i.get(k) for k in keys)
                for i in items
            ):
                raise ValueError(
                    f"{name} must be a list of mappings, each with {' and '.join(keys)} (API form)"
                )

    @property
    def sizing(self) -> Sizing:
        """How many nodes an attempt trains on (elastic when ``min_nodes`` is below ``nodes``)."""
        return Sizing(self.nodes, self.min_nodes, float(self.elastic_wait_s))

    @property
    def run_path(self) -> str:
        """``run_uri`` in directory form (ends with '/')."""
        return self.run_uri if self.run_uri.endswith("/") else self.run_uri + "/"
