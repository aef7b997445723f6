"""Hot spares: the training image pulled onto every claimed node before training, so a resume onto a
spare after a node fault starts at once (no claim, drain, gate or image pull left to pay for).

One short pod per node, in the training namespace (its Pod Security level applies), pinned by the
node's hostname label, tolerating the training taint, asking for next to nothing, running ``true`` in
the image: once its container got past the pull (the pod left ``Pending``) the image is on the node,
whatever the command did; then the pod is deleted.  A pull the kubelet reports failing
(``ErrImagePull``, ``ImagePullBackOff``, ``InvalidImageName``) is reported, not retried: the run's own
pods will say the same.  The pods are named by run and node, so a retried claim finds its own; one a
killed worker left behind ends by its ``activeDeadlineSeconds`` and holds nothing after.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable

from trainops.conventions import MODE_TAINT, MODE_TRAINING
from trainops.kube.client import PODS, Kube
from trainops.kube.retry import Deadline, DeadlineExceeded

PREPULL_LABEL = "trainops.io/prepull"  # value: the run's hash
PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
PULL_DEADLINE_S = 600

module_log = logging.getLogger(__name__)


def run_hash(run: str) -> str:
    return hashlib.sha256(run.encode()).hexdigest()[:10]


def prepull_pod(run: str, node: str, image: str) -> dict:
    """The pod that pulls ``image`` onto ``node`` for ``run``."""
    digest = hashlib.sha256(node.encode()).hexdigest()[:8]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"prepull-{run_hash(run)}-{digest}",
            "labels": {PREPULL_LABEL: run_hash(run)},
            "annotations": {"trainops.io/dag-run": run, "trainops.io/node": node},
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "activeDeadlineSeconds": PULL_DEADLINE_S,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [
                {"key": MODE_TAINT, "operator": "Equal", "value": MODE_TRAINING, "effect": "NoSchedule"}
            ],
            "containers": [
                {
                    "name": "prepull",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["true"],
                    "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}},
                }
            ],
        },
    }


def pull_state(pod: dict) -> str | None:
    """``pulled``, ``failed: <reason>``, or None while the pull is under way."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded", "Failed"):
        return "pulled"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in PULL_FAILURES:
            return f"failed: {waiting['reason']}: {str(waiting.get('message') or '')[:300]}"
    return None


def prepull(
    kube: Kube,
    run: str,
    nodes: Iterable[str],
    image: str,
    *,
    namespace: str,
    deadline: Deadline,
    log: logging.Logger = module_log,
) -> dict[str, str]:
    """Pull ``image`` onto ``nodes`` for ``run``; returns node -> ``pulled`` / ``failed: ...`` /
    ``not pulled by the deadline``.  The pods are deleted whatever happens."""
    pods = {node: {**prepull_pod(run, node, image)} for node in nodes}
    for pod in pods.values():
        pod["metadata"]["namespace"] = namespace
    by_name = {pod["metadata"]["name"]: node for node, pod in pods.items()}
    states: dict[str, str] = {}
    try:
        for pod in pods.values():  # one that exists is a retried claim's own
            kube.create(pod, PODS, read_back=False, deadline=deadline)
        while len(states) < len(pods):
            for pod in kube.list(
                PODS, namespace, labels=f"{PREPULL_LABEL}={run_hash(run)}", deadline=deadline
            ):
                node = by_name.get(pod["metadata"]["name"])
                if node and node not in states and (state := pull_state(pod)):
                    states[node] = state
                    log.info("node %s: image %s %s", node, image, state)
            if len(states) < len(pods):
                deadline.sleep(0.2, "image pulls")
    except DeadlineExceeded:
        for node in pods:
            states.setdefault(node, "not pulled by the deadline")
    finally:
        for name in by_name:
            kube.delete(PODS, name, namespace)
    return states
