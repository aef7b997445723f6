"""The fault kinds the campaign draws, and how each is injected.

Each run draws one kind from its seed.  By the phase it hits:

- before the gate (the gate must keep the node out): ``nvlink``, ``slow-gpu``;
- at the claim (kept from the capacity campaign): ``api-burst``, ``killed-mid-claim`` (a 500 on one
  node's write: the claim fails halfway and gives back), ``rival-writer`` (409s), ``race`` (a second
  run claims overlapping nodes at the same time), ``quarantined-candidate`` (a node the gate chose is
  quarantined before the claim), ``sigkill-claim`` (the claiming process SIGKILLed after its first
  node: the next try finishes the same claim);
- while training, once the run has made progress: ``xid`` (79), ``ecc``, ``ib-down``,
  ``node-notready`` on a node of the gang, ``pod-crash`` (exit 137), ``hang``, ``torn-checkpoint``
  (the newest checkpoint's shard overwritten, then a pod crash: the resume must skip it),
  ``api-burst-train`` (429/5xx on the Job, pod and Workload paths), ``drop-watches``, ``s3-errors``
  (503s on the worker's S3 requests), ``sigkill-train`` (the train step's process SIGKILLed: the next
  try reattaches to the same Job), ``clear`` (the Job stopped as on_kill does, then gate, claim and
  train again with a fresh budget);
- at the return: ``sigkill-return`` (the returning process SIGKILLed halfway: the reaper returns
  the rest).
"""

from __future__ import annotations

import random

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
FAULTS = ("none", *GATE, *CLAIM, *TRAIN, *RETURN)

SLOW_GPU_FACTOR = 0.5  # a slowed node's GPUs run at half speed
CLAIM_BURST = ((r"/api/v1/nodes/", 503), (r"/api/v1/nodes/", 429), (r"/eviction$", 429), (r"/pods", 503))
# the train phase makes few requests (its follower watches): the next two on each path fail, so that it lands
TRAIN_BURST = ((r"/jobs", 503), (r"/pods", 429), (r"/workloads", 503), (r"/api/v1/nodes/", 500))


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


def api_burst(cluster, paths, **share) -> None:
    """Each of ``paths`` answers its status for a ``fraction`` of its requests, or the next ``count``."""
    for path, status in paths:
        cluster.inject("api-fault", path=path, status=status, **(share or {"fraction": 0.3}))


class S3Errors:
    """503 SlowDown on a fraction of one boto3 client's requests, before they are sent (botocore's
    ``before-send`` event): the client's own retries, then the caller's, must absorb them."""

    def __init__(self, client, rng: random.Random, fraction: float = 0.2) -> None:
        self.rng, self.fraction, self.injected = rng, fraction, 0
        self.on = False
        client.meta.events.register("before-send.s3", self)

    def __call__(self, request, **_):
        from botocore.awsrequest import AWSResponse

        if not self.on or self.rng.random() >= self.fraction:
            return None
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
