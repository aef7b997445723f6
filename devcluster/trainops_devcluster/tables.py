"""Server-side printing: the ``meta.k8s.io/v1 Table`` that ``kubectl get`` asks for, with the
columns a real API server prints for each built-in kind and the printer columns of custom kinds."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from trainops_devcluster.kinds import Kind

Cells = Callable[[dict], list]


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m" if s % 60 == 0 else f"{m}m{s % 60}s"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h" if m % 60 == 0 else f"{h}h{m % 60}m"
    if h < 48:
        return f"{h}h"
    if h < 192:
        return f"{h // 24}d" if h % 24 == 0 else f"{h // 24}d{h % 24}h"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    y = h // (24 * 365)
    return f"{y}y" if y >= 8 else f"{y}y{(h // 24) % 365}d"


def _since(stamp: str | None) -> str:
    if not stamp:
        return "<unknown>"
    then = datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return human_duration((datetime.now(UTC) - then).total_seconds())


def _age(obj: dict) -> str:
    return _since(obj["metadata"].get("creationTimestamp"))


def _condition(obj: dict, type_: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == type_), {})


def _node(obj: dict) -> list:
    ready = _condition(obj, "Ready").get("status")
    status = {"True": "Ready", "False": "NotReady"}.get(ready, "Unknown")
    if (obj.get("spec") or {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    labels = obj["metadata"].get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    if labels.get("kubernetes.io/role"):
        roles.append(labels["kubernetes.io/role"])
    st = obj.get("status") or {}
    info = st.get("nodeInfo") or {}
    addresses = {a.get("type"): a.get("address") for a in st.get("addresses") or []}
    return [
        obj["metadata"]["name"],
        status,
        ",".join(roles) or "<none>",
        _age(obj),
        info.get("kubeletVersion", ""),
        addresses.get("InternalIP", "<none>"),
        addresses.get("ExternalIP", "<none>"),
        info.get("osImage", "<unknown>"),
        info.get("kernelVersion", "<unknown>"),
        info.get("containerRuntimeVersion", "<unknown>"),
    ]


def _pod(obj: dict) -> list:
    spec, st = obj.get("spec") or {}, obj.get("status") or {}
    reason = st.get("reason") or st.get("phase") or "Unknown"
    statuses = st.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(c.get("restartCount", 0) for c in statuses)
    for c in reversed(statuses):
        state = c.get("state") or {}
        if (state.get("waiting") or {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif state.get("terminated"):
            term = state["terminated"]
            reason = term.get("reason") or (
                f"Signal:{term['signal']}" if term.get("signal") else f"ExitCode:{term.get('exitCode', 0)}"
            )
    if obj["metadata"].get("deletionTimestamp"):
        reason = "Unknown" if st.get("reason") == "NodeLost" else "Terminating"
    gates = spec.get("readinessGates") or []
    return [
        obj["metadata"]["name"],
        f"{ready}/{len(spec.get('containers') or [])}",
        reason,
        restarts,
        _age(obj),
        st.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        st.get("nominatedNodeName") or "<none>",
        f"{sum(1 for g in gates if _condition(obj, g.get('conditionType')).get('status') == 'True')}/{len(gates)}"
        if gates
        else "<none>",
    ]


def _containers(template: dict) -> list:
    containers = (template.get("spec") or {}).get("containers") or []
    return [",".join(c.get("name", "") for c in containers), ",".join(c.get("image", "") for c in containers)]


def _selector(spec: dict) -> str:
    sel = spec.get("selector") or {}
    terms = [f"{k}={v}" for k, v in (sel.get("matchLabels") or {}).items()]
    for e in sel.get("matchExpressions") or []:
        terms.append(f"{e['key']} {e['operator'].lower()} ({','.join(e.get('values') or [])})")
    return ",".join(terms) or "<none>"


def _deployment(obj: dict) -> list:
    spec, st = obj.get("spec") or {}, obj.get("status") or {}
    return [
        obj["metadata"]["name"],
        f"{st.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
        st.get("updatedReplicas", 0),
        st.get("availableReplicas", 0),
        _age(obj),
        *_containers(spec.get("template") or {}),
        _selector(spec),
    ]


def _job(obj: dict) -> list:
    spec, st = obj.get("spec") or {}, obj.get("status") or {}
    status = "Running"
    for type_ in ("Failed", "Complete", "FailureTarget", "SuccessCriteriaMet", "Suspended"):
        if _condition(obj, type_).get("status") == "True":
            status = type_
            break
    completions = spec.get("completions")
    done = (
        f"{st.get('succeeded', 0)}/{completions}"
        if completions is not None
        else (f"{st.get('succeeded', 0)}/1 of {spec.get('parallelism', 1)}")
    )
    duration = ""
    if st.get("startTime"):
        start = datetime.strptime(st["startTime"][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
        end = datetime.now(UTC)
        if st.get("completionTime"):
            end = datetime.strptime(st["completionTime"][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
        duration = human_duration((end - start).total_seconds())
    return [
        obj["metadata"]["name"],
        status,
        done,
        duration,
        _age(obj),
        *_containers(spec.get("template") or {}),
        _selector(spec),
    ]


def _pdb(obj: dict) -> list:
    spec, st = obj.get("spec") or {}, obj.get("status") or {}
    return [
        obj["metadata"]["name"],
        str(spec.get("minAvailable", "N/A")),
        str(spec.get("maxUnavailable", "N/A")),
        st.get("disruptionsAllowed", 0),
        _age(obj),
    ]


def _event(obj: dict) -> list:
    involved = obj.get("involvedObject") or {}
    last = obj.get("lastTimestamp") or obj.get("eventTime") or obj["metadata"].get("creationTimestamp")
    return [
        _since(last),
        obj.get("type", ""),
        obj.get("reason", ""),
        f"{(involved.get('kind') or '').lower()}/{involved.get('name', '')}",
        obj.get("message", ""),
    ]


def _daemon_set(obj: dict) -> list:
    spec, st = obj.get("spec") or {}, obj.get("status") or {}
    selector = ((spec.get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
    return [
        obj["metadata"]["name"],
        st.get("desiredNumberScheduled", 0),
        st.get("currentNumberScheduled", 0),
        st.get("numberReady", 0),
        st.get("updatedNumberScheduled", 0),
        st.get("numberAvailable", 0),
        ",".join(f"{k}={v}" for k, v in selector.items()) or "<none>",
        _age(obj),
        *_containers(spec.get("template") or {}),
        _selector(spec),
    ]


def _col(name: str, type_: str = "string", priority: int = 0, fmt: str = "") -> dict:
    return {"name": name, "type": type_, "format": fmt, "description": "", "priority": priority}


_NAME = _col("Name", fmt="name")
#: the ``-o wide`` columns of every workload kind, filled by ``_containers`` and ``_selector``
_WORKLOAD_WIDE = [_col("Containers", priority=1), _col("Images", priority=1), _col("Selector", priority=1)]
_BUILTIN: dict[str, tuple[list[dict], Cells]] = {
    "Node": (
        [
            _NAME,
            _col("Status"),
            _col("Roles"),
            _col("Age"),
            _col("Version"),
            _col("Internal-IP", priority=1),
            _col("External-IP", priority=1),
            _col("OS-Image", priority=1),
            _col("Kernel-Version", priority=1),
            _col("Container-Runtime", priority=1),
        ],
        _node,
    ),
    "Pod": (
        [
            _NAME,
            _col("Ready"),
            _col("Status"),
            _col("Restarts", "string"),
            _col("Age"),
            _col("IP", priority=1),
            _col("Node", priority=1),
            _col("Nominated Node", priority=1),
            _col("Readiness Gates", priority=1),
        ],
        _pod,
    ),
    "Namespace": (
        [_NAME, _col("Status"), _col("Age")],
        lambda o: [o["metadata"]["name"], (o.get("status") or {}).get("phase", "Active"), _age(o)],
    ),
    "Deployment": (
        [
            _NAME,
            _col("Ready"),
            _col("Up-to-date", "integer"),
            _col("Available", "integer"),
            _col("Age"),
            *_WORKLOAD_WIDE,
        ],
        _deployment,
    ),
    "Job": (
        [
            _NAME,
            _col("Status"),
            _col("Completions"),
            _col("Duration"),
            _col("Age"),
            *_WORKLOAD_WIDE,
        ],
        _job,
    ),
    "PodDisruptionBudget": (
        [
            _NAME,
            _col("Min Available"),
            _col("Max Unavailable"),
            _col("Allowed Disruptions", "integer"),
            _col("Age"),
        ],
        _pdb,
    ),
    "Event": ([_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")], _event),
    "ConfigMap": (
        [_NAME, _col("Data", "integer"), _col("Age")],
        lambda o: [o["metadata"]["name"], len(o.get("data") or {}) + len(o.get("binaryData") or {}), _age(o)],
    ),
    "Secret": (
        [_NAME, _col("Type"), _col("Data", "integer"), _col("Age")],
        lambda o: [o["metadata"]["name"], o.get("type", "Opaque"), len(o.get("data") or {}), _age(o)],
    ),
    "ServiceAccount": (
        [_NAME, _col("Secrets", "integer"), _col("Age")],
        lambda o: [o["metadata"]["name"], len(o.get("secrets") or []), _age(o)],
    ),
    "DaemonSet": (
        [
            _NAME,
            _col("Desired", "integer"),
            _col("Current", "integer"),
            _col("Ready", "integer"),
            _col("Up-to-date", "integer"),
            _col("Available", "integer"),
            _col("Node Selector"),
            _col("Age"),
            *_WORKLOAD_WIDE,
        ],
        _daemon_set,
    ),
}


def _path_value(obj: dict, path: str) -> object:
    value: object = obj
    for part in path.strip(".").split("."):
        if "[?" in part:  # conditions[?type==Admitted]
            field, _, cond = part.partition("[?")
            key, _, wanted = cond.rstrip("]").partition("==")
            value = value.get(field) if isinstance(value, dict) else None
            value = next((i for i in value or [] if isinstance(i, dict) and i.get(key) == wanted), None)
        else:
            value = value.get(part) if isinstance(value, dict) else None
    return value


def _custom(kind: Kind) -> tuple[list[dict], Cells]:
    columns = [_NAME] + [
        _col(c.name, "string" if c.type == "date" else c.type, c.priority, c.type if c.type == "date" else "")
        for c in kind.columns
    ]

    def cells(obj: dict) -> list:
        row: list = [obj["metadata"]["name"]]
        for c in kind.columns:
            value = _path_value(obj, c.path)
            row.append(_since(value) if c.type == "date" and isinstance(value, str) else value)
        return row

    return columns, cells


def columns_and_cells(kind: Kind) -> tuple[list[dict], Cells]:
    return _BUILTIN.get(kind.kind) or _custom(kind)


def row(obj: dict, cells: Cells, include: str) -> dict:
    """One Table row; ``include`` is the ``includeObject`` parameter (None, Metadata, Object)."""
    entry: dict = {"cells": cells(obj)}
    if include == "Object":
        entry["object"] = obj
    elif include != "None":
        entry["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }
    return entry
