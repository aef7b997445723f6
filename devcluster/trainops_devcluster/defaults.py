"""The defaults the API server fills in when an object is written (as its defaulting functions and
default admission plugins do), so clients read back what a real cluster would give them."""

from __future__ import annotations

import base64
import secrets

from trainops_devcluster.kinds import Kind

_DEFAULT_TOLERATIONS = [
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
]


def pod_spec(spec: dict) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        if not isinstance(container, dict):
            continue
        image = container.get("image") or ""
        tagged = ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest")
        container.setdefault("imagePullPolicy", "IfNotPresent" if tagged or "@" in image else "Always")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
        for port in container.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")


def _tolerations(spec: dict) -> None:
    """DefaultTolerationSeconds admission: tolerate not-ready/unreachable for 300 s."""
    tolerations = spec.setdefault("tolerations", [])
    for default in _DEFAULT_TOLERATIONS:
        if not any(
            t.get("key") == default["key"] and t.get("effect") in (None, "NoExecute") for t in tolerations
        ):
            tolerations.append(dict(default))


def _template(spec: dict) -> None:
    template = spec.get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        pod_spec(template["spec"])


def apply(kind: Kind, obj: dict, *, creating: bool) -> None:
    """Fill in defaults in place (``creating``: also the ones only set at creation)."""
    spec = obj.get("spec")
    if kind.kind == "Namespace":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"].get(
            "name", ""
        )
    if kind.kind == "Secret":
        _secret(obj)
    if not isinstance(spec, dict):
        return
    if kind.kind == "Pod":
        pod_spec(spec)
        if creating:
            _tolerations(spec)
    elif kind.kind == "Job":
        _job(spec, obj["metadata"], creating)
    elif kind.kind == "Deployment":
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        spec.setdefault(
            "strategy",
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
        )
        _template(spec)
    elif kind.kind == "Service":
        _service(spec, creating)
    elif kind.kind == "DaemonSet":
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault(
            "updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
        )
        _template(spec)
    elif kind.kind == "ValidatingAdmissionPolicy":
        spec.setdefault("failurePolicy", "Fail")
        _match_resources(spec.get("matchConstraints"))
    elif kind.kind == "ValidatingAdmissionPolicyBinding":
        _match_resources(spec.get("matchResources"))
    elif kind.kind == "Workload":
        spec.setdefault("active", True)
    elif kind.kind == "ClusterQueue":
        spec.setdefault("queueingStrategy", "BestEffortFIFO")


def _match_resources(match: dict | None) -> None:
    """SetDefaults_MatchResources: Equivalent matching, empty selectors, rules of any scope."""
    if not isinstance(match, dict):
        return
    match.setdefault("matchPolicy", "Equivalent")
    match.setdefault("namespaceSelector", {})
    match.setdefault("objectSelector", {})
    for rule in (match.get("resourceRules") or []) + (match.get("excludeResourceRules") or []):
        if isinstance(rule, dict):
            rule.setdefault("scope", "*")


def _secret(obj: dict) -> None:
    """``stringData`` is write-only: merged into ``data`` base64-encoded; ``type`` defaults to Opaque."""
    obj.setdefault("type", "Opaque")
    plain = obj.pop("stringData", None)
    if isinstance(plain, dict) and plain:
        data = obj.setdefault("data", {})
        for key, value in plain.items():
            data[key] = base64.b64encode(str(value).encode()).decode()


def _job(spec: dict, meta: dict, creating: bool) -> None:
    if "completions" not in spec and "parallelism" not in spec:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 2147483647 if spec.get("backoffLimitPerIndex") is not None else 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault(
        "podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed"
    )
    _template(spec)  # restartPolicy Always, which validation then rejects for a Job, as on a real server
    if creating and not spec.get("manualSelector") and meta.get("uid"):
        uid, name = meta["uid"], meta.get("name", "")
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        if not isinstance(spec.get("template"), dict):
            return  # validation reports the missing template
        labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
        labels.update(
            {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": uid,
                "job-name": name,
            }
        )


def _service(spec: dict, creating: bool) -> None:
    """A ClusterIP Service gets a virtual IP (a headless one keeps ``clusterIP: None``)."""
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    for port in spec.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
    if creating and spec["type"] != "ExternalName" and not spec.get("clusterIP"):
        spec["clusterIP"] = f"10.96.{secrets.randbelow(256)}.{1 + secrets.randbelow(254)}"
    if spec.get("clusterIP"):
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
