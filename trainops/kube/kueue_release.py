"""Which Kueue release runs the cluster, and whether its Topology Aware Scheduling (TAS) keeps a
resume off the nodes trainops keeps out.

Under TAS Kueue, not the kube-scheduler, picks each pod's node.  It honours the pods' tolerations
(since 0.10, kueue#3678) and nodeSelector (0.12.0 #4989; 0.11.4, 0.10.5) when the Topology's lowest
level is ``kubernetes.io/hostname``, but their required node affinity only from 0.15.0 (#7899),
backported to 0.13.10 (#7936) and 0.14.5 (#7937) (kueue#7728).  trainops keeps a resume off the nodes
it blames, and inside the claimed nodes, with that affinity (a quarantined culprit also with its
taint), so 0.13.0-0.13.9 and 0.14.0-0.14.4 with a TAS flavor may place an attempt on a kept-out node,
where its pod stays Pending until waitForPodsReady requeues it, maybe again and again.  No release
reads pod anti-affinity.

The version is read from the controller's Deployment (Kueue's release manifests and its Helm chart
with release name ``kueue``): its ``app.kubernetes.io/version`` label, else its image tag.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from trainops.kube.client import DEPLOYMENTS, is_denied

#: where Kueue's release manifests and Helm chart (release name ``kueue``) run its controller
CONTROLLER = ("kueue-system", "kueue-controller-manager")
#: per release line before 0.15, the first patch whose TAS honours required node affinity (kueue#7728)
AFFINITY_FIXED = {(0, 13): 10, (0, 14): 5}
UPGRADE = (
    "upgrade Kueue to v0.13.10 or later (0.13 line), v0.14.5 or later (0.14 line), or v0.15.0 or later; "
    "or remove topologyName from the ResourceFlavors to admit by quota alone (the kube-scheduler honours "
    "the affinity)"
)


def release_of(version: str | None) -> tuple[int, int, int] | None:
    """``v0.13.10`` (also an image tag such as ``v0.14.5-rc.1``) -> ``(0, 13, 10)``; None otherwise."""
    found = re.match(r"v?(\d+)\.(\d+)\.(\d+)", str(version or ""))
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def tas_honours_node_affinity(release: tuple[int, int, int]) -> bool:
    """Whether Kueue's TAS checks the pods' required node affinity: 0.13.10+, 0.14.5+, 0.15.0+."""
    first = AFFINITY_FIXED.get(release[:2])
    return release >= (0, 15, 0) or (first is not None and release[2] >= first)


def controller_version(kube, deadline=None) -> tuple[str | None, str]:
    """(Kueue's version as its controller's Deployment names it, or None; where it was read or why not).
    ``kube``: a ``trainops.kube.client.Kube``; a Deployment it may not read is "not readable"."""
    namespace, name = CONTROLLER
    where = f"Deployment {namespace}/{name}"
    try:
        deployment = kube.get(DEPLOYMENTS, name, namespace, deadline=deadline)
    except Exception as error:
        if is_denied(error):
            return None, f"{where} not readable ({error.status})"
        raise
    if deployment is None:
        return None, f"no {where}"
    return version_of(deployment), where


def version_of(deployment: Mapping) -> str | None:
    """The version the controller's Deployment names: its ``app.kubernetes.io/version`` label, else the
    tag of its ``manager`` container's image (else any container's)."""
    labelled = ((deployment.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/version")
    if release_of(labelled):
        return labelled
    containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers"
    ) or []
    for container in sorted(containers, key=lambda c: c.get("name") != "manager"):
        tag = str(container.get("image") or "").split("@")[0].rpartition(":")[2]
        if release_of(tag):
            return tag
    return None


def ignores_affinity(version: str | None, where: str, flavors: list[str]) -> str | None:
    """Why Kueue ``version`` cannot keep kept-out nodes out under TAS flavors ``flavors`` (None: it can,
    there is no TAS flavor, or the version is unknown)."""
    release = release_of(version)
    if release is None or not flavors or tas_honours_node_affinity(release):
        return None
    return (
        f"Kueue {version} ({where}) places pods by Topology Aware Scheduling (ResourceFlavor "
        f"{', '.join(flavors)}) but ignores their required node affinity (kueue#7728, fixed in 0.13.10, "
        "0.14.5 and 0.15.0): a resume may be placed on a node trainops keeps out of the run, or outside "
        "the run's claimed nodes, where its pod stays Pending until waitForPodsReady requeues it, "
        "maybe again and again"
    )
