"""The fault kinds the campaign draws, and how each is injected.

Each run draws one kind from its seed.  By the phase it hits:

- before the gate (the gate must keep the node out): ``nvlink`` (a replay storm on one GPU's link, which
  then goes down under the run's traffic once the run has made progress: XID 74, ``link_fails``),
  ``slow-gpu``;
- at the claim (kept from the capacity campaign): ``api-burst``, ``killed-mid-claim`` (a 500 on one
  node's write: the claim fails halfway and gives back), ``rival-writer`` (409s), ``race`` (a second
  run claims overlapping nodes at the same time), ``quarantined-candidate`` (a node the gate chose is
  quarantined before the claim), ``sigkill-claim`` (the claiming process SIGKILLed after its first
  node: the next try finishes the same claim);
- while training, once the run has made progress: ``xid`` (79), ``ecc``, ``ib-down``,
  ``node-notready`` on a node of the gang, ``pod-crash`` (exit 137), ``hang``, ``torn-checkpoint``
  (the newest checkpoint's shard overwritten, then a pod crash: the resume must skip it),
  ``api-burst-train`` (the next two requests on the Job, pod, Workload and node paths answer
  429/5xx), ``drop-watches``, ``s3-errors`` (the next two requests of each S3 operation of the
  worker answer 503), ``sigkill-train`` (the train step's process SIGKILLed: the next try reattaches
  to the same Job), ``clear`` (the Job stopped as on_kill does, then gate, claim and train again
  with a fresh budget);
- at the return: ``sigkill-return`` (the returning process SIGKILLed halfway: the teardown's retry returns
  the rest).
"""

from __future__ import annotations

import threading

GATE = ("nvlink", "slow-gpu")
CLAIM = ("api-burst", "killed-mid-claim", "rival-writer", "race", "quarantined-candidate", "sigkill-claim")
TRAIN_NODE = ("xid", "ecc", "ib-down", "node-notready")
TRAIN = (
    *TRAIN_NODE,
    "pod-crash",
    "hang",
    "torn-checkpoint",
    "api-burst-train",
    "drop-watches",
    "s3-errors",
    "sigkill-train",
    "clear",
)
RETURN = ("sigkill-return",)
# struck once the run has made progress (``strike``): the training faults, and an NVLink storm's link going down
STRUCK = (*TRAIN_NODE, "nvlink", "pod-crash", "hang", "torn-checkpoint")
FAULTS = ("none", *GATE, *CLAIM, *TRAIN, *RETURN)

SLOW_GPU_FACTOR = 0.5  # a slowed node's GPUs run at half speed
CLAIM_BURST = ((r"/api/v1/nodes/", 503), (r"/api/v1/nodes/", 429), (r"/eviction$", 429), (r"/pods", 503))
# the train phase makes few requests (its follower watches): the next two on each path fail, so that it lands
TRAIN_BURST = ((r"/jobs", 503), (r"/pods", 429), (r"/workloads", 503), (r"/api/v1/nodes/", 500))
S3_BURST = 2  # s3-errors: the next two requests of each S3 operation answer 503, as the train API burst


def node_fault(cluster, kind: str, node: str) -> dict:
    """A hardware fault on ``node`` (training kinds kill the pods on it; gate kinds only degrade it)."""
    options = {
        "xid": ("xid", {"code": 79}),
        "ecc": ("ecc", {"uncorrectable": 2}),
        "ib-down": ("ib-down", {}),
        "node-notready": ("node-notready", {}),
        "nvlink": ("nvlink-errors", {"replay": 5000}),
        "slow-gpu": ("slow-gpu", {"factor": SLOW_GPU_FACTOR}),
    }
    fault, extra = options[kind]
    return cluster.inject(fault, node, **extra)


def link_fails(cluster, node: str, gpu: int = 0) -> dict:
    """The replaying NVLink of ``node``'s GPU ``gpu`` goes down under load: XID 74 (NVIDIA's catalog: an
    NVLink error, WORKFLOW_NVLINK_ERR), which kills the CUDA processes on that GPU and which NVIDIA's device
    plugin does not skip, so the GPU leaves allocatable until the node is repaired; the link stays down.

    A replay storm is what DCGM's NVLink health watch calls a failure (any replay delta FAILs,
    ``shared/reference/health.md`` sec. 2): sustained replays and recoveries are a link degrading, and a
    rising replay count precedes the link failure that XID 74 reports.  The campaign takes the pessimistic
    branch, every storm ends so; a link that stays up only loses bandwidth (a few tenths of a percent for a
    downtrained lane, Fluidstack's "The case of the 0.3% slower node"), which neither policy's runs here
    would show.
    """
    cluster.inject("nvlink-down", node, gpu=gpu, link=0)
    return cluster.inject("xid", node, code=74, gpu=gpu)


def api_burst(cluster, paths, **share) -> None:
    """Each of ``paths`` answers its status for a ``fraction`` of its requests, or the next ``count``."""
    for path, status in paths:
        cluster.inject("api-fault", path=path, status=status, **(share or {"fraction": 0.3}))


class S3Errors:
    """503 SlowDown on one boto3 client's requests, before they are sent (botocore's ``before-send``
    event): once ``arm(count)`` is called, the next ``count`` requests of each S3 operation (the run's
    first listing, its owner marker's write, the trigger's first heartbeat reads, ...) fail, so that the
    fault lands on every run; the client's own retries, then the caller's, must absorb them."""

    def __init__(self, client) -> None:
        self.left: dict[str, int] | None = None  # operation -> requests still to fail (None: disarmed)
        self.count, self.injected, self._lock = 0, 0, threading.Lock()
        client.meta.events.register("before-send.s3", self)

    def arm(self, count: int = S3_BURST) -> None:
        with self._lock:
            self.left, self.count, self.injected = {}, count, 0

    def disarm(self) -> None:
        with self._lock:
            self.left = None

    def __call__(self, request, event_name: str = "", **_):
        from botocore.awsrequest import AWSResponse

        operation = event_name.rpartition(".")[2]  # before-send.s3.<Operation>
        with self._lock:
            if self.left is None or self.left.setdefault(operation, self.count) <= 0:
                return None
            self.left[operation] -= 1
            self.injected += 1
        body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
        return AWSResponse(request.url, 503, {"content-type": "application/xml"}, _Raw(body))


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_):
        yield self.body

    def read(self, *_, **__):
        body, self.body = self.body, b""
        return body
