"""Inference that keeps serving while training borrows its nodes: an overflow pool per Deployment.

A Deployment opts in with the annotation ``trainops.io/overflow-pool`` (or the claim's
``overflow_pool``, for the workloads without one), JSON:
``{"node_label": "type=virtual-kubelet", "taint": "virtual-kubelet.io/provider", "min_ready": 6}``:
the pool's nodes carry ``node_label`` (``k=v[,k=v]``) and the taint ``taint`` (``key`` or
``key=value``; optional), e.g. a Virtual Kubelet node or another cloud's GPUs; ``min_ready``
(optional) is the fewest Ready replicas the workload may have, on top of its PodDisruptionBudgets;
``serve_check`` (optional), ``{"url": "http://llm-chat.inference.svc/health", "requests": 20}``:
the pool is judged by requests actually served through the Service, not its pods' Ready bit (a
Virtual Kubelet provider runs no probes: Ready and the pod IP are whatever it reports): once the
companion is Ready, the claim sends ``requests`` GETs to ``url`` (each on a new connection, so the
proxy spreads them over the endpoints, the pool's among them) and shrinks the primary only once
every one of a round answers 2xx, else the claim fails after ``ready_deadline_s`` naming the answers.

When a claim displaces replicas of such a workload, as many as the pool has room for are made first
in a *companion* Deployment, ``<name>-overflow``: the primary's pod template with the pool's node
selector and toleration, its own selector label ``trainops.io/serving-pool=overflow`` (the
Service and the PodDisruptionBudget still select its pods), the label
``trainops.io/overflow-of=<name>``, owned by the primary (deleting the primary deletes it).  Its
``spec.replicas`` is lent to the run like any loan (``loans``), so it is found and given back
exactly.  Only once the companion's replicas are Ready is the primary shrunk, its pods on the
claimed nodes first (``controller.kubernetes.io/pod-deletion-cost``): make-before-break, and no
rollout of the primary.  The return moves them back in waves (``procedure.give_back``).

Room is counted as the scheduler would: Ready, schedulable nodes whose taints the pods tolerate,
whose labels match their node selector and required node affinity, with the pods' requests free.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from decimal import Decimal

from trainops.capacity.inference import DEPLOYMENT, WorkloadRef
from trainops.capacity.loans import LOANS_ANNOTATION, loans_of
from trainops.errors import PermanentError
from trainops.placement.scheduling import node_taints, selects, untolerated

OVERFLOW_ANNOTATION = "trainops.io/overflow-pool"
OVERFLOW_OF_LABEL = "trainops.io/overflow-of"
SERVING_POOL_LABEL = "trainops.io/serving-pool"
OVERFLOW = "overflow"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
FIRST_TO_GO = str(-(2**31))  # the lowest cost there is: a scale-down removes these pods first
REPLICAS: tuple[str, ...] = ("spec", "replicas")
POOL_FIELDS = {"node_label", "taint", "min_ready", "serve_check"}
SERVE_CHECK_REQUESTS = 20


class OverflowPoolError(PermanentError, ValueError):
    """An overflow pool spec (annotation or parameter) that cannot be used; the message says how to fix it."""


@dataclass(frozen=True)
class OverflowPool:
    node_selector: dict[str, str]
    toleration: dict | None = None
    min_ready: int = 0
    serve_check: tuple[str, int] | None = None  # (url, requests)

    @classmethod
    def parse(cls, value: object, field: str) -> OverflowPool:
        """From the annotation's JSON text or the parameter's dict; ``field`` names it in errors."""
        example = '{"node_label": "type=virtual-kubelet", "taint": "virtual-kubelet.io/provider"}'
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise OverflowPoolError(f"{field}: not JSON ({value[:100]!r}); e.g. {example}") from None
        if not isinstance(value, dict) or set(value) - POOL_FIELDS or "node_label" not in value:
            raise OverflowPoolError(
                f"{field}: {str(value)[:200]!r} must be an object with node_label and optionally taint "
                f"and min_ready, e.g. {example}"
            )
        selector = {}
        for pair in str(value["node_label"]).split(","):
            key, sep, label = pair.strip().partition("=")
            if not sep or not key:
                raise OverflowPoolError(
                    f"{field}.node_label: {pair!r} is not key=value, e.g. type=virtual-kubelet"
                )
            selector[key] = label
        taint, toleration = value.get("taint"), None
        if taint is not None:
            if not isinstance(taint, str) or not taint or ":" in taint:
                raise OverflowPoolError(
                    f"{field}.taint: {taint!r} must be the pool's taint key, or key=value (any effect), "
                    "e.g. virtual-kubelet.io/provider"
                )
            key, sep, taint_value = taint.partition("=")
            toleration = (
                {"key": key, "operator": "Equal", "value": taint_value}
                if sep
                else {"key": key, "operator": "Exists"}
            )
        min_ready = value.get("min_ready", 0)
        if not isinstance(min_ready, int) or isinstance(min_ready, bool) or min_ready < 0:
            raise OverflowPoolError(f"{field}.min_ready: {min_ready!r} must be a whole number >= 0")
        return cls(selector, toleration, min_ready, _serve_check(value.get("serve_check"), field))

    @classmethod
    def of(cls, obj: dict, default: OverflowPool | None) -> OverflowPool | None:
        """The workload's own pool (its annotation) or else ``default``."""
        raw = (obj["metadata"].get("annotations") or {}).get(OVERFLOW_ANNOTATION)
        if raw is None:
            return default
        meta = obj["metadata"]
        return cls.parse(raw, f"annotation {OVERFLOW_ANNOTATION} of {meta.get('namespace')}/{meta['name']}")


def _serve_check(check: object, field: str) -> tuple[str, int] | None:
    if check is None:
        return None
    url = check.get("url") if isinstance(check, dict) else None
    requests = check.get("requests", SERVE_CHECK_REQUESTS) if isinstance(check, dict) else None
    if (
        not isinstance(url, str)
        or not url.startswith(("http://", "https://"))
        or set(check) - {"url", "requests"}
        or not isinstance(requests, int)
        or isinstance(requests, bool)
        or requests < 1
    ):
        raise OverflowPoolError(
            f"{field}.serve_check: {str(check)[:200]!r} must be "
            '{"url": "http://<service>.<namespace>.svc/health", "requests": 20} (requests optional, >= 1)'
        )
    return url, requests


# ---- judged by requests served ----------------------------------------------------------------
def serve_round(url: str, requests: int, deadline=None, timeout_s: float = 5.0) -> list[str]:
    """Send ``requests`` GETs to ``url``, each on a new connection and never past ``deadline`` (a
    ``Deadline``; each waits at most ``timeout_s``); what went wrong with each that did not answer
    2xx, those the deadline left unsent included (empty: all were served).  No proxy: a cluster
    Service's address goes to the Service, whatever ``HTTP(S)_PROXY`` says."""
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    failed = []
    for sent in range(requests):
        remaining = timeout_s if deadline is None else min(timeout_s, deadline.remaining())
        if remaining <= 0:
            failed += ["not sent before the deadline"] * (requests - sent)
            break
        try:
            with opener.open(url, timeout=remaining) as answer:
                answer.read()
                if not 200 <= answer.status < 300:
                    failed.append(f"HTTP {answer.status}")
        except urllib.error.HTTPError as error:
            failed.append(f"HTTP {error.code}")
        except OSError as error:
            failed.append(type(error).__name__)
    return failed


def wait_serving(url: str, requests: int, deadline, log) -> None:
    """Wait until a round of ``serve_round`` is served whole; ``DeadlineExceeded`` naming the last
    round's failures otherwise."""
    from trainops.kube.retry import DeadlineExceeded

    while True:
        failed = serve_round(url, requests, deadline)
        if not failed:
            log.info("overflow pool: %d of %d requests through %s served", requests, requests, url)
            return
        try:
            deadline.sleep(1.0, f"requests through {url} served")
        except DeadlineExceeded:
            counts = {why: failed.count(why) for why in sorted(set(failed))}
            raise DeadlineExceeded(
                f"overflow pool Ready but not serving: {len(failed)} of {requests} requests through {url} "
                f"failed ({counts}) after {deadline.seconds:g}s; the pool's provider may report Ready pods "
                "it cannot serve from (a Virtual Kubelet runs no probes)"
            ) from None


# ---- room, as the scheduler counts it ----------------------------------------------------------
def _quantity(value) -> Decimal:
    from kubernetes.utils import parse_quantity

    return parse_quantity(value)


def pod_requests(pod_spec: dict) -> dict[str, Decimal]:
    """What a pod of ``pod_spec`` reserves on a node (containers summed, a limit standing in for a
    missing request, at least the largest init container), plus one of the node's ``pods``."""

    def of(container: dict) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: _quantity(value) for name, value in merged.items()}

    total: dict[str, Decimal] = {"pods": Decimal(1)}
    for container in pod_spec.get("containers") or []:
        for name, value in of(container).items():
            total[name] = total.get(name, Decimal(0)) + value
    for container in pod_spec.get("initContainers") or []:
        for name, value in of(container).items():
            total[name] = max(total.get(name, Decimal(0)), value)
    return total


def fits_node(pod_spec: dict, node: dict) -> bool:
    """Whether pods of ``pod_spec`` may run on ``node`` at all (resources aside): Ready, schedulable,
    its taints tolerated, its labels selected (``trainops.placement.scheduling``, as kube-scheduler)."""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    if spec.get("unschedulable") or ready.get("status") != "True":
        return False
    return not untolerated(pod_spec.get("tolerations") or [], node_taints(node)) and selects(pod_spec, node)


class Room:
    """Free resources of some nodes (allocatable minus what their unfinished pods request); ``take``
    reserves room for pods as it places them, so several workloads can share one count."""

    def __init__(self, nodes: list[dict], pods: list[dict]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.free: dict[str, dict[str, Decimal]] = {
            name: {k: _quantity(v) for k, v in ((n.get("status") or {}).get("allocatable") or {}).items()}
            for name, n in self.nodes.items()
        }
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node in self.free and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                for name, value in pod_requests(pod["spec"]).items():
                    self.free[node][name] = self.free[node].get(name, Decimal(0)) - value

    def take(self, pod_spec: dict, want: int) -> int:
        """Place up to ``want`` pods of ``pod_spec``, node by node; returns how many fit."""
        needs = pod_requests(pod_spec)
        placed = 0
        for name in sorted(self.nodes):
            if placed >= want or not fits_node(pod_spec, self.nodes[name]):
                continue
            free = self.free[name]
            fit = min(
                (math.floor(free.get(r, Decimal(0)) / v) for r, v in needs.items() if v > 0), default=want
            )
            count = max(0, min(fit, want - placed))
            for r, v in needs.items():
                free[r] = free.get(r, Decimal(0)) - v * count
            placed += count
        return placed


# ---- the companion Deployment ------------------------------------------------------------------
def companion_name(primary: str) -> str:
    return f"{primary}-{OVERFLOW}"


def is_companion_of(obj: dict, primary: str) -> bool:
    return (obj["metadata"].get("labels") or {}).get(OVERFLOW_OF_LABEL) == primary


def primary_of(ref: WorkloadRef, obj: dict) -> WorkloadRef | None:
    """The primary Deployment whose overflow companion ``ref`` is (None: ``ref`` is no companion)."""
    primary = (obj["metadata"].get("labels") or {}).get(OVERFLOW_OF_LABEL)
    if ref.kind is DEPLOYMENT and primary and ref.name == companion_name(primary):
        return WorkloadRef(DEPLOYMENT, ref.namespace, primary)
    return None


def pool_pod_spec(primary: dict, pool: OverflowPool) -> dict:
    """The primary's pod spec sent to the pool: its node selector, no node affinity of the primary's
    own pool, the pool's taint tolerated."""
    spec = copy.deepcopy(primary["spec"]["template"]["spec"])
    spec["nodeSelector"] = dict(pool.node_selector)
    affinity = spec.get("affinity") or {}
    affinity.pop("nodeAffinity", None)
    if affinity:
        spec["affinity"] = affinity
    else:
        spec.pop("affinity", None)
    tolerations = spec.get("tolerations") or []
    if pool.toleration and pool.toleration not in tolerations:
        spec["tolerations"] = [*tolerations, pool.toleration]
    return spec


def companion_manifest(primary: dict, pool: OverflowPool, run: str, replicas: int) -> dict:
    """A new companion of ``primary`` with ``replicas`` lent to ``run`` (the loan recorded on it)."""
    meta, spec = primary["metadata"], primary["spec"]
    template = copy.deepcopy(spec["template"])
    template.setdefault("metadata", {}).setdefault("labels", {})[SERVING_POOL_LABEL] = OVERFLOW
    template["spec"] = pool_pod_spec(primary, pool)
    selector = copy.deepcopy(spec["selector"])
    selector.setdefault("matchLabels", {})[SERVING_POOL_LABEL] = OVERFLOW
    loan = {run: [{"path": list(REPLICAS), "prior": 0, "set": replicas}]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": companion_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": {**(meta.get("labels") or {}), OVERFLOW_OF_LABEL: meta["name"]},
            "annotations": {LOANS_ANNOTATION: json.dumps(loan, sort_keys=True)},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": meta["name"], "uid": meta["uid"]}
            ],
        },
        "spec": {
            "replicas": replicas,
            "selector": selector,
            "template": template,
            **{k: copy.deepcopy(spec[k]) for k in ("strategy", "minReadySeconds") if k in spec},
        },
    }


def lent(obj: dict, run: str, path: tuple[str, ...] = REPLICAS) -> int:
    """How much of the integer field ``path`` is still lent to ``run`` (``|set - prior|``; 0: none)."""
    entry = next((e for e in loans_of(obj).get(run) or [] if tuple(e["path"]) == path), None)
    if entry is None or not all(isinstance(entry[k], int) for k in ("prior", "set")):
        return 0
    return abs(entry["set"] - entry["prior"])
