"""Whether an inference workload's pods can be taken away without failing requests, and the safe
way to take away those of one that cannot.

On a cluster, deleting a pod (a scale-down, an eviction) withdraws its EndpointSlice entry and
sends its containers SIGTERM at the same moment; every node's kube-proxy (and any ingress or
gateway) drops the endpoint only when it catches up.  So a pod is handed off cleanly only when:

* it has a ``readinessProbe``: without one a model server is Ready, and sent traffic, as soon as
  its process runs, before its model has loaded (vLLM answers ``/health`` only once it has);
* it has a ``preStop`` hook (``sleep``, or ``exec`` of ``sleep N``) longer than the endpoint
  takes to leave every proxy (``endpoint_propagation_s``, 5 s by default: kube-proxy's and the
  EndpointSlice controller's lag on a busy cluster), so new connections stop before SIGTERM;
* its ``terminationGracePeriodSeconds`` (default 30) is above the preStop sleep plus the server's
  own drain after SIGTERM (vLLM ``--shutdown-timeout``, 0 by default: in-flight requests are
  aborted on SIGTERM, vllm-project/vllm#36666; Triton ``--exit-timeout-secs``, 30 by default),
  else the kubelet SIGKILLs it mid-drain.

``check_workload`` reads a Deployment's pod template or an InferenceService's predictor and says
what is missing, each finding naming the field and the documented fix for the server it runs.

The safe way (``detach`` then ``wait_detached``) for a workload that lacks them: take the pod out
of its Services first, by removing from the pod a label each Service selects on (the pod keeps
running and finishes what it has in flight), wait until no EndpointSlice lists it and then
``endpoint_propagation_s`` more (the proxies catch up), and only then let it be deleted (scale-down
or eviction).  Taking a pod out of its Service is a disruption: the drain asks the Eviction API
first, as a dry run, whether the pod's PodDisruptionBudget allows it, so budgets keep their meaning.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Literal

from trainops.errors import PermanentError
from trainops.kube.retry import Deadline, DeadlineExceeded

log = logging.getLogger(__name__)
DEFAULT_PROPAGATION_S = 5.0
DEFAULT_GRACE_S = 30  # the API's default terminationGracePeriodSeconds
TRITON_DEFAULT_EXIT_TIMEOUT_S = 30
DETACHED_ANNOTATION = "trainops.io/detached-from-service"
UnsafeInference = Literal["drain-safely", "refuse"]
UNSAFE_CHOICES = ("drain-safely", "refuse")

FIXES = {
    "vllm": {
        "readiness": "add readinessProbe: {httpGet: {path: /health, port: 8000}} (vLLM answers it once the "
        "model is loaded)",
        "prestop": "add lifecycle.preStop: {sleep: {seconds: N}} with N above the endpoint propagation "
        "(vLLM's Kubernetes guide: preStop sleep, then --shutdown-timeout)",
        "drain": "start vLLM with --shutdown-timeout=S (default 0 aborts in-flight requests on SIGTERM) "
        "and set terminationGracePeriodSeconds > preStop sleep + S",
    },
    "kserve": {
        "readiness": "give the predictor container a readinessProbe on the model server's health path",
        "prestop": "set the predictor's lifecycle.preStop sleep (KServe's LLMInferenceService templates "
        "use /bin/sleep 15, kserve/kserve#5496)",
        "drain": "set the predictor's terminationGracePeriodSeconds above preStop + the server's drain "
        "(KServe: 60 s with vLLM --shutdown-timeout = grace - 15)",
    },
    "triton": {
        "readiness": "add readinessProbe: {httpGet: {path: /v2/health/ready, port: 8000}}",
        "prestop": "add lifecycle.preStop: {sleep: {seconds: N}} with N above the endpoint propagation",
        "drain": "set terminationGracePeriodSeconds > preStop sleep + tritonserver --exit-timeout-secs "
        "(default 30: Triton waits that long for in-flight inferences after SIGTERM)",
    },
    "generic": {
        "readiness": "add a readinessProbe on the server's health path, passing only once the model is loaded",
        "prestop": "add lifecycle.preStop: {sleep: {seconds: N}} with N above the endpoint propagation",
        "drain": "set terminationGracePeriodSeconds > preStop sleep + the server's own drain after SIGTERM",
    },
}


class UnsafeHandoff(PermanentError):
    """Inference workloads whose pods would fail requests when taken away, with ``unsafe_inference="refuse"``."""


@dataclass(frozen=True)
class Finding:
    workload: str
    field: str  # the field path that is missing or too small
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.workload}: {self.field}: {self.problem}; fix: {self.fix}"


# ---- the check ---------------------------------------------------------------------------------
def server_of(container: dict, kserve: bool = False) -> str:
    """Which documented server a container runs: ``vllm``, ``triton``, ``kserve`` or ``generic``."""
    words = " ".join(
        str(x)
        for x in [
            container.get("image", ""),
            *(container.get("command") or []),
            *(container.get("args") or []),
        ]
    ).lower()
    if "vllm" in words:
        return "vllm"
    if "tritonserver" in words or "triton" in container.get("image", "").lower():
        return "triton"
    return "kserve" if kserve else "generic"


def _flag(container: dict, name: str) -> float | None:
    """The value of ``--name=V`` / ``--name V`` in the container's command and args (a shell
    string included), or None."""
    text = " ".join(str(x) for x in [*(container.get("command") or []), *(container.get("args") or [])])
    match = re.search(rf"--{re.escape(name)}(?:=|\s+)(\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


def server_drain_s(container: dict, server: str) -> float:
    """How long the server keeps going after SIGTERM (its own drain)."""
    if server == "vllm":
        return _flag(container, "shutdown-timeout") or 0.0
    if server == "triton":
        value = _flag(container, "exit-timeout-secs")
        return TRITON_DEFAULT_EXIT_TIMEOUT_S if value is None else value
    return 0.0


def prestop_s(container: dict) -> float | None:
    """Seconds the container's preStop hook holds SIGTERM back: its ``sleep.seconds``, or N of an
    ``exec`` running ``sleep N``; ``None`` when it has no hook; ``inf`` for a hook of its own whose
    length cannot be read (an exec script, an httpGet): trusted to wait for the endpoint itself."""
    hook = (container.get("lifecycle") or {}).get("preStop")
    if not hook:
        return None
    if "sleep" in hook:
        return float((hook.get("sleep") or {}).get("seconds", 0))
    command = " ".join(str(x) for x in (hook.get("exec") or {}).get("command") or [])
    match = re.search(r"\bsleep\s+(\d+(?:\.\d+)?)", command)
    if match:
        return float(match.group(1))
    return float("inf") if command or "httpGet" in hook else None


def check_pod_spec(
    workload: str,
    pod_spec: dict,
    *,
    kserve: bool = False,
    propagation_s: float = DEFAULT_PROPAGATION_S,
    path: str = "spec.template.spec",
) -> list[Finding]:
    """What keeps pods of ``pod_spec`` from a clean hand-off (empty: nothing).  Every container
    that serves a port is checked (none: every container)."""
    containers = pod_spec.get("containers") or []
    serving = [c for c in containers if c.get("ports")] or containers
    findings: list[Finding] = []
    grace = pod_spec.get("terminationGracePeriodSeconds")
    grace_s = DEFAULT_GRACE_S if grace is None else float(grace)
    for index, container in enumerate(containers):
        if container not in serving:
            continue
        server = server_of(container, kserve)
        fixes = FIXES[server]
        where = f"{path}.containers[{index}]"
        name = container.get("name", index)
        if not container.get("readinessProbe"):
            findings.append(
                Finding(
                    workload,
                    f"{where}.readinessProbe",
                    f"container {name} has none, so it is Ready (and sent requests) before its model has loaded",
                    fixes["readiness"],
                )
            )
        sleep = prestop_s(container)
        if sleep is None or sleep <= propagation_s:
            problem = (
                "no preStop hook: SIGTERM comes while proxies still send it new connections"
                if sleep is None
                else f"preStop holds SIGTERM back {sleep:g}s, not more than the {propagation_s:g}s the "
                "endpoint takes to leave every proxy"
            )
            findings.append(Finding(workload, f"{where}.lifecycle.preStop", problem, fixes["prestop"]))
        drain = server_drain_s(container, server)
        needed = (0.0 if sleep is None or sleep == float("inf") else sleep) + drain
        if grace_s <= needed:
            findings.append(
                Finding(
                    workload,
                    f"{path}.terminationGracePeriodSeconds",
                    f"{grace_s:g}s is not above preStop {0 if sleep is None else sleep:g}s + the server's "
                    f"drain {drain:g}s: the kubelet SIGKILLs it mid-drain",
                    fixes["drain"],
                )
            )
        elif server == "vllm" and drain == 0:
            findings.append(
                Finding(
                    workload,
                    f"{where}.args",
                    "vLLM without --shutdown-timeout aborts its in-flight requests on SIGTERM",
                    fixes["drain"],
                )
            )
    return findings


def check_workload(kind: str, obj: dict, propagation_s: float = DEFAULT_PROPAGATION_S) -> list[Finding]:
    """``check_pod_spec`` of a Deployment's pod template or an InferenceService's predictor.

    An InferenceService's ``predictor.model`` takes its probes and ``lifecycle`` from its
    ServingRuntime (or ClusterServingRuntime), which this does not read: it cannot be judged, and
    is treated as clean (no findings: neither refused nor taken out of its Service first), with a
    warning naming the runtime to check by hand."""
    meta = obj.get("metadata") or {}
    workload = f"{kind} {meta.get('namespace')}/{meta.get('name')}"
    spec = obj.get("spec") or {}
    if kind == "InferenceService":
        predictor = dict(spec.get("predictor") or {})
        model = predictor.get("model")
        if model:
            runtime = model.get("runtime") or "chosen for its modelFormat"
            log.warning(
                "%s: cannot judge its hand-off: the probes and preStop come from its ServingRuntime %s "
                "(not read); treated as clean",
                workload,
                runtime,
            )
            return []
        return check_pod_spec(
            workload, predictor, kserve=True, propagation_s=propagation_s, path="spec.predictor"
        )
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    return check_pod_spec(workload, pod_spec, propagation_s=propagation_s)


def refusal(findings: list[Finding]) -> UnsafeHandoff:
    lines = "\n  ".join(str(f) for f in findings)
    return UnsafeHandoff(
        f"{len(findings)} hand-off problem(s) in the inference workloads this claim would shrink or move, "
        f"and unsafe_inference='refuse'; nothing was changed:\n  {lines}\n"
        "Fix the workloads, or claim with unsafe_inference='drain-safely' (each pod is taken out of its "
        "Service before it gets SIGTERM)."
    )


def check_choice(value: str) -> str:
    if value not in UNSAFE_CHOICES:
        raise ValueError(f"unsafe_inference must be one of {UNSAFE_CHOICES}, got {value!r}")
    return value


# ---- the safe way ------------------------------------------------------------------------------
def services_selecting(services: list[dict], pod: dict) -> list[dict]:
    labels = pod["metadata"].get("labels") or {}
    return [
        s
        for s in services
        if s["metadata"].get("namespace") == pod["metadata"]["namespace"]
        and (selector := (s.get("spec") or {}).get("selector"))
        and all(labels.get(k) == v for k, v in selector.items())
    ]


def detach_keys(services: list[dict], pod: dict, keep: set[str] = frozenset()) -> list[str]:
    """Labels to remove from ``pod`` so that none of ``services`` selects it: per Service one key,
    one outside ``keep`` (the owner's selector: removing those orphans the pod) where it can."""
    keys: list[str] = []
    for service in services_selecting(services, pod):
        selector = sorted(service["spec"]["selector"])
        if any(k in keys for k in selector):
            continue
        keys.append(next((k for k in selector if k not in keep), selector[0]))
    return keys


def detach_patch(keys: list[str]) -> dict:
    """The merge patch that takes a pod out of its Services (the removed labels recorded on it)."""
    return {
        "metadata": {
            "labels": {k: None for k in keys},
            "annotations": {DETACHED_ANNOTATION: ",".join(keys)},
        }
    }


def is_detached(pod: dict) -> bool:
    return DETACHED_ANNOTATION in (pod["metadata"].get("annotations") or {})


def listed(slices: list[dict], pod: dict) -> bool:
    """Whether an EndpointSlice still lists ``pod`` (by uid, else name)."""
    meta = pod["metadata"]
    for piece in slices:
        if piece["metadata"].get("namespace") != meta["namespace"]:
            continue
        for entry in piece.get("endpoints") or []:
            ref = entry.get("targetRef") or {}
            if ref.get("kind", "Pod") == "Pod" and (
                (meta.get("uid") and ref.get("uid") == meta.get("uid")) or ref.get("name") == meta["name"]
            ):
                return True
    return False


@dataclass
class SafeDrain:
    """Take pods out of their Services before they get SIGTERM (see the module docstring).  Reaches
    the cluster through ``kube`` (``trainops.kube.client.Kube``)."""

    kube: object
    propagation_s: float = DEFAULT_PROPAGATION_S
    log: logging.Logger = log

    def __post_init__(self) -> None:
        if not self.propagation_s >= 0:
            raise ValueError(f"endpoint_propagation_s must be >= 0 seconds, got {self.propagation_s!r}")
        self._gone_at: dict[tuple[str, str], float] = {}  # pod -> when no EndpointSlice listed it

    def _services(self, namespace: str, deadline: Deadline) -> list[dict]:
        from trainops.kube.client import SERVICES

        return self.kube.list(SERVICES, namespace, deadline=deadline)

    def _slices(self, namespace: str, deadline: Deadline) -> list[dict]:
        from trainops.kube.client import Kind

        return self.kube.list(Kind("discovery.k8s.io", "v1", "endpointslices"), namespace, deadline=deadline)

    def detach(self, pods: list[dict], deadline: Deadline, keep: set[str] = frozenset()) -> list[dict]:
        """Take ``pods`` out of their Services (a pod already out, or gone, needs nothing); returns
        the pods as patched."""
        from trainops.kube.client import PODS

        done = []
        services: dict[str, list[dict]] = {}
        for pod in pods:
            meta = pod["metadata"]
            if is_detached(pod):
                done.append(pod)
                continue
            if meta["namespace"] not in services:
                services[meta["namespace"]] = self._services(meta["namespace"], deadline)
            keys = detach_keys(services[meta["namespace"]], pod, keep)
            patched = self.kube.patch(
                PODS, meta["name"], detach_patch(keys), meta["namespace"], deadline=deadline
            )
            if patched is not None:
                self.log.info(
                    "pod %s/%s: out of its Service(s) (labels %s removed) before it gets SIGTERM",
                    meta["namespace"],
                    meta["name"],
                    ", ".join(keys) or "none: no Service selects it",
                )
                done.append(patched)
        return done

    def ready(self, pod: dict, deadline: Deadline, slices: list[dict] | None = None) -> bool:
        """Whether ``pod`` may be deleted now: no EndpointSlice lists it, since ``propagation_s``
        (``slices``: its namespace's, when already listed)."""
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        if slices is None:
            slices = self._slices(meta["namespace"], deadline)
        if listed(slices, pod):
            self._gone_at.pop(key, None)
            return False
        since = self._gone_at.setdefault(key, time.monotonic())
        return time.monotonic() - since >= self.propagation_s

    def wait_detached(self, pods: list[dict], deadline: Deadline) -> None:
        """Wait until every one of ``pods`` may be deleted (``ready``): a round every 0.5 s, each
        listing the EndpointSlices of a namespace once for all its pods."""
        pending = list(pods)
        while pending:
            slices = {
                ns: self._slices(ns, deadline) for ns in sorted({p["metadata"]["namespace"] for p in pending})
            }
            pending = [p for p in pending if not self.ready(p, deadline, slices[p["metadata"]["namespace"]])]
            if not pending:
                return
            try:
                deadline.sleep(0.5, "pods out of their Services")
            except DeadlineExceeded:
                names = ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pending)
                raise DeadlineExceeded(
                    f"pods still listed by an EndpointSlice {deadline.seconds:g}s after they were taken "
                    f"out of their Services: {names}"
                ) from None
