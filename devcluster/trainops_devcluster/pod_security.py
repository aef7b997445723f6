"""Pod Security Admission, as kube-apiserver's built-in ``PodSecurity`` plugin enforces it.

A namespace's labels choose the level: ``pod-security.kubernetes.io/enforce`` (a pod that violates it
is refused: 403 ``pods "<name>" is forbidden: violates PodSecurity "baseline:latest": ...``) and
``pod-security.kubernetes.io/warn`` (a ``Warning`` header ``would violate PodSecurity ...`` on pods
and on the objects whose pod template would, such as Jobs and DaemonSets); ``...-version`` labels
(default ``latest``).  Without a label the level is ``privileged`` (kube-apiserver's default
configuration), as it is for ``kube-system`` unless someone labels it.  Levels:

- ``privileged``: anything.
- ``baseline``: no host namespaces (``hostNetwork``, ``hostPID``, ``hostIPC``), no ``privileged``
  containers, no capabilities beyond the default set (``IPC_LOCK``, ``SYS_ADMIN``, ``NET_ADMIN``...
  are not in it), no ``hostPath`` volumes, no ``hostPort``, no probe or lifecycle ``host``, no
  ``procMount`` but Default, no seccomp ``Unconfined``, only the safe sysctls.
- ``restricted``: baseline, and volumes only of the inline kinds that need no host (configMap, csi,
  downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected, secret),
  ``allowPrivilegeEscalation: false``, ``capabilities.drop: [ALL]`` (only NET_BIND_SERVICE added),
  ``runAsNonRoot: true``, no ``runAsUser: 0``, seccomp ``RuntimeDefault`` or ``Localhost``.

Each check's wording, their order and the aggregated message are those of
``k8s.io/pod-security-admission/policy``.  Not checked: AppArmor, SELinux options and Windows
``hostProcess`` (nothing trainops or its probe sets), and the exemptions an admission configuration
can name.  Updates of a pod are not checked (kube-apiserver checks only changes to fields that can
change, which these are not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from trainops_devcluster.errors import Forbidden
from trainops_devcluster.store import Store

if TYPE_CHECKING:
    from trainops_devcluster.admission import Attributes

LABEL = "pod-security.kubernetes.io/"
LEVELS = ("privileged", "baseline", "restricted")
#: the workload kinds whose pod template gets ``warn`` (kube-apiserver also checks their ``audit``)
_TEMPLATES = {"Deployment", "DaemonSet", "Job", "ReplicaSet", "StatefulSet"}
_DEFAULT_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
_INLINE_VOLUMES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)

Check = Callable[[dict, dict], "tuple[str, str] | None"]  # (pod metadata, pod spec) -> (reason, detail)


def _containers(spec: dict) -> Iterator[dict]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from (c for c in spec.get(key) or [] if isinstance(c, dict))


def _context(container: dict) -> dict:
    return container.get("securityContext") or {}


def _quote(items) -> str:
    return '"' + '", "'.join(items) + '"' if items else ""


def _plural(singular: str, plural: str, count: int) -> str:
    return singular if count == 1 else plural


def _named(what: str, names: list[str]) -> str:
    return f"{_plural(what, what + 's', len(names))} {_quote(names)}"


# ---- baseline ----------------------------------------------------------------------------------------
def _host_namespaces(meta: dict, spec: dict):
    used = sorted(n for n in ("hostIPC", "hostNetwork", "hostPID") if spec.get(n))
    return ("host namespaces", ", ".join(used)) if used else None


def _host_ports(meta: dict, spec: dict):
    bad, ports = [], set()
    for c in _containers(spec):
        found = {p.get("hostPort") for p in c.get("ports") or [] if p.get("hostPort")}
        if found:
            bad.append(c.get("name", ""))
            ports |= found
    if not bad:
        return None
    listed = ", ".join(sorted(str(p) for p in ports))
    detail = f"{_named('container', bad)} {_plural('uses', 'use', len(bad))} {_plural('hostPort', 'hostPorts', len(ports))} {listed}"
    return "hostPort", detail


def _probe_hosts(meta: dict, spec: dict):
    bad, hosts = set(), set()
    for c in _containers(spec):
        handlers = [c.get(p) or {} for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [(c.get("lifecycle") or {}).get(h) or {} for h in ("postStart", "preStop")]
        for handler in handlers:
            for action in ("httpGet", "tcpSocket"):
                host = (handler.get(action) or {}).get("host")
                if host:
                    bad.add(c.get("name", ""))
                    hosts.add(host)
    if not bad:
        return None
    names = sorted(bad)
    detail = (
        f"{_named('container', names)} {_plural('uses', 'use', len(names))} "
        f"{_plural('probe or lifecycle host', 'probe or lifecycle hosts', len(hosts))} {_quote(sorted(hosts))}"
    )
    return "probe or lifecycle host", detail


def _privileged(meta: dict, spec: dict):
    bad = [c.get("name", "") for c in _containers(spec) if _context(c).get("privileged") is True]
    return (
        ("privileged", f"{_named('container', bad)} must not set securityContext.privileged=true")
        if bad
        else None
    )


def _proc_mount(meta: dict, spec: dict):
    bad, kinds = [], set()
    for c in _containers(spec):
        mount = _context(c).get("procMount")
        if mount is not None and mount != "Default":
            bad.append(c.get("name", ""))
            kinds.add(mount)
    if not bad:
        return None
    return (
        "procMount",
        f"{_named('container', bad)} must not set securityContext.procMount to {_quote(sorted(kinds))}",
    )


def _sysctls(meta: dict, spec: dict):
    bad = [s.get("name", "") for s in (spec.get("securityContext") or {}).get("sysctls") or []]
    bad = [name for name in bad if name not in _SAFE_SYSCTLS]
    return ("forbidden sysctls", ", ".join(bad)) if bad else None


def _capabilities_baseline(meta: dict, spec: dict):
    bad, added = [], set()
    for c in _containers(spec):
        extra = {
            a
            for a in (_context(c).get("capabilities") or {}).get("add") or []
            if a not in _DEFAULT_CAPABILITIES
        }
        if extra:
            bad.append(c.get("name", ""))
            added |= extra
    if not bad:
        return None
    detail = f"{_named('container', bad)} must not include {_quote(sorted(added))} in securityContext.capabilities.add"
    return "non-default capabilities", detail


def _host_path(meta: dict, spec: dict):
    bad = [v.get("name", "") for v in spec.get("volumes") or [] if v.get("hostPath") is not None]
    return ("hostPath volumes", _named("volume", bad)) if bad else None


def _setters(spec: dict, read: Callable[[dict], object], good: Callable[[object], bool]):
    """For the pod-or-container settings: who sets a value that is not ``good`` (``pod``,
    ``container(s) "a"``), those values, and the containers that set none while the pod sets no good one."""
    pod = read(spec.get("securityContext") or {})
    setters, values, bad, unset = [], set(), [], []
    if pod is not None and not good(pod):
        setters.append("pod")
        values.add(pod)
    for c in _containers(spec):
        value = read(_context(c))
        if value is None and (pod is None or not good(pod)):
            unset.append(c.get("name", ""))
        elif value is not None and not good(value):
            bad.append(c.get("name", ""))
            values.add(value)
    if bad:
        setters.append(_named("container", bad))
    return setters, values, unset


def _seccomp(meta: dict, spec: dict, *, restricted: bool):
    """Baseline: no ``Unconfined``; restricted: ``RuntimeDefault`` or ``Localhost`` on the pod or each container."""
    setters, values, unset = _setters(
        spec,
        lambda context: (
            None if context.get("seccompProfile") is None else context["seccompProfile"].get("type", "")
        ),
        lambda kind: kind in ("RuntimeDefault", "Localhost"),
    )
    if setters:
        field = "securityContext.seccompProfile.type"
        return "seccompProfile", f"{' and '.join(setters)} must not set {field} to {_quote(sorted(values))}"
    if restricted and unset:
        must = 'must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"'
        return "seccompProfile", f"pod or {_named('container', unset)} {must}"
    return None


# ---- restricted ----------------------------------------------------------------------------------
def _privilege_escalation(meta: dict, spec: dict):
    bad = [
        c.get("name", "")
        for c in _containers(spec)
        if _context(c).get("allowPrivilegeEscalation") is not False
    ]
    detail = f"{_named('container', bad)} must set securityContext.allowPrivilegeEscalation=false"
    return ("allowPrivilegeEscalation != false", detail) if bad else None


def _capabilities_restricted(meta: dict, spec: dict):
    no_drop, adding, added = [], [], set()
    for c in _containers(spec):
        capabilities = _context(c).get("capabilities")
        if capabilities is None:
            no_drop.append(c.get("name", ""))
            continue
        if "ALL" not in (capabilities.get("drop") or []):
            no_drop.append(c.get("name", ""))
        extra = {a for a in capabilities.get("add") or [] if a != "NET_BIND_SERVICE"}
        if extra:
            adding.append(c.get("name", ""))
            added |= extra
    details = []
    if no_drop:
        details.append(f'{_named("container", no_drop)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(
            f"{_named('container', adding)} must not include {_quote(sorted(added))} in securityContext.capabilities.add"
        )
    return ("unrestricted capabilities", "; ".join(details)) if details else None


def _volume_types(meta: dict, spec: dict):
    bad, kinds = [], set()
    for volume in spec.get("volumes") or []:
        if any(volume.get(k) is not None for k in _INLINE_VOLUMES):
            continue
        bad.append(volume.get("name", ""))
        kinds.add(next((k for k in volume if k != "name"), "unknown"))
    if not bad:
        return None
    detail = (
        f"{_named('volume', bad)} {_plural('uses', 'use', len(bad))} "
        f"{_plural('restricted volume type', 'restricted volume types', len(kinds))} {_quote(sorted(kinds))}"
    )
    return "restricted volume types", detail


def _run_as_non_root(meta: dict, spec: dict):
    setters, _, unset = _setters(
        spec, lambda context: context.get("runAsNonRoot"), lambda value: value is True
    )
    if setters:
        return (
            "runAsNonRoot != true",
            f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false",
        )
    if unset:
        return (
            "runAsNonRoot != true",
            f"pod or {_named('container', unset)} must set securityContext.runAsNonRoot=true",
        )
    return None


def _run_as_user(meta: dict, spec: dict):
    setters = ["pod"] if (spec.get("securityContext") or {}).get("runAsUser") == 0 else []
    root = [c.get("name", "") for c in _containers(spec) if _context(c).get("runAsUser") == 0]
    if root:
        setters.append(_named("container", root))
    return ("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0") if setters else None


# kube-apiserver's order: the baseline checks, then either baseline's own versions of the checks that
# restricted tightens, or the restricted checks (registration order = file names, check_*.go)
_BASELINE: list[Check] = [_host_namespaces, _host_ports, _probe_hosts, _privileged, _proc_mount, _sysctls]
_BASELINE_ONLY: list[Check] = [
    _capabilities_baseline,
    _host_path,
    lambda m, s: _seccomp(m, s, restricted=False),
]
_RESTRICTED: list[Check] = [
    _privilege_escalation,
    _capabilities_restricted,
    _volume_types,
    _run_as_non_root,
    _run_as_user,
    lambda m, s: _seccomp(m, s, restricted=True),
]


def violations(level: str, pod_meta: dict, pod_spec: dict) -> str:
    """``reason (detail), reason (detail)`` for what ``pod_spec`` breaks at ``level``; empty when nothing."""
    if level == "privileged":
        return ""
    checks = _BASELINE + (_BASELINE_ONLY if level == "baseline" else _RESTRICTED)
    found = [result for check in checks if (result := check(pod_meta, pod_spec))]
    return ", ".join(f"{reason} ({detail})" if detail else reason for reason, detail in found)


def _policy(namespace: dict | None, mode: str) -> tuple[str, str]:
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    level = labels.get(LABEL + mode, "privileged")
    version = labels.get(f"{LABEL}{mode}-version", "latest")
    return (level if level in LEVELS else "privileged"), version


def _template(obj: dict) -> tuple[dict, dict] | None:
    template = ((obj.get("spec") or {}).get("template") or {}) if obj.get("kind") in _TEMPLATES else {}
    if not isinstance(template.get("spec"), dict):
        return None
    return template.get("metadata") or {}, template["spec"]


class PodSecurity:
    """The ``PodSecurity`` admission plugin over the namespaces in ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def validate(self, attrs: Attributes) -> list[str]:
        """Raise ``Forbidden`` for a pod its namespace's ``enforce`` level refuses; return the warnings."""
        if attrs.operation != "CREATE" or attrs.obj is None or attrs.sub or not attrs.kind.namespaced:
            return []
        namespace = self.store.find("namespaces", "", attrs.namespace)
        if attrs.kind.kind == "Pod":
            meta, spec = attrs.obj.get("metadata") or {}, attrs.obj.get("spec") or {}
            level, version = _policy(namespace, "enforce")
            found = violations(level, meta, spec)
            if found:
                raise Forbidden(
                    f'pods "{attrs.name}" is forbidden: violates PodSecurity "{level}:{version}": {found}',
                    resource="pods",
                    name=attrs.name,
                )
        else:
            pod = _template({"kind": attrs.kind.kind, **attrs.obj})
            if pod is None:
                return []
            meta, spec = pod
        level, version = _policy(namespace, "warn")
        found = violations(level, meta, spec)
        return [f'would violate PodSecurity "{level}:{version}": {found}'] if found else []
