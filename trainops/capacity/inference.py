"""The inference workloads a claim shrinks: Deployments (or the HPA that drives one) and KServe
InferenceServices; how far each may shrink (its PodDisruptionBudgets); when each is Ready again.

All objects are handled as plain dicts through ``CustomObjectsApi`` (which serves any API group),
so the three kinds share one read/patch path (``WorkloadRef``) and the loan logic of ``loans``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from trainops.capacity.loans import LOANS_ANNOTATION, Path, lend_patch, loans_of, repay_patch
from trainops.kube.client import MERGE_PATCH
from trainops.kube.guarded import Edited, edit
from trainops.kube.lists import PAGE, list_all
from trainops.kube.retry import Deadline

log = logging.getLogger(__name__)
KSERVE_STOP = "serving.kserve.io/stop"
KSERVE_LABEL = "serving.kserve.io/inferenceservice"


@dataclass(frozen=True)
class Kind:
    name: str
    group: str
    version: str
    plural: str


DEPLOYMENT = Kind("Deployment", "apps", "v1", "deployments")
HPA = Kind("HorizontalPodAutoscaler", "autoscaling", "v2", "horizontalpodautoscalers")
INFERENCE_SERVICE = Kind("InferenceService", "serving.kserve.io", "v1beta1", "inferenceservices")
LENDING_KINDS = (DEPLOYMENT, HPA, INFERENCE_SERVICE)


@dataclass(frozen=True)
class WorkloadRef:
    kind: Kind
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind.name} {self.namespace}/{self.name}"

    @classmethod
    def parse(cls, kind: Kind, text: str, field: str) -> WorkloadRef:
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise ValueError(f"{field}: {text!r} must be 'namespace/name', e.g. 'inference/llm-chat'")
        return cls(kind, namespace, name)

    def get(self, custom) -> dict:
        k = self.kind
        return custom.get_namespaced_custom_object(k.group, k.version, self.namespace, k.plural, self.name)

    def patch(self, custom, body: dict) -> dict:
        k = self.kind
        return custom.patch_namespaced_custom_object(
            k.group, k.version, self.namespace, k.plural, self.name, body, _content_type=MERGE_PATCH
        )

    def edit(self, custom, change, deadline: Deadline, current: dict | None = None) -> Edited:
        return edit(
            lambda: self.get(custom),
            lambda body: self.patch(custom, body),
            change,
            deadline,
            str(self),
            current,
        )


# ---- selectors -------------------------------------------------------------------------------
def selector_matches(selector: dict | None, labels: dict[str, str]) -> bool:
    """Whether a ``LabelSelector`` (matchLabels + matchExpressions) selects ``labels``; an empty
    selector selects everything, a missing one nothing (as for PodDisruptionBudgets)."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, op, values = expression["key"], expression["operator"], expression.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def pod_selector(kind: Kind, obj: dict) -> dict:
    """The label selector of the pods a Deployment or InferenceService runs."""
    if kind is INFERENCE_SERVICE:
        return {"matchLabels": {KSERVE_LABEL: obj["metadata"]["name"]}}
    return obj["spec"]["selector"]


# ---- how far a workload may shrink ---------------------------------------------------------
def pdb_floor(pdbs: list[dict], pod_labels: dict[str, str], expected: int) -> int:
    """The fewest healthy pods the PodDisruptionBudgets selecting ``pod_labels`` allow, with
    ``expected`` pods wanted (percentages round up, as the disruption controller does)."""
    floor = 0
    for pdb in pdbs:
        spec = pdb.get("spec") or {}
        if not selector_matches(spec.get("selector"), pod_labels):
            continue
        if "minAvailable" in spec:
            floor = max(floor, _scaled(spec["minAvailable"], expected))
        elif "maxUnavailable" in spec:
            floor = max(floor, expected - _scaled(spec["maxUnavailable"], expected))
    return max(0, min(floor, expected))


def _scaled(value: int | str, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def shrink_fields(kind: Kind, obj: dict, running: int, displaced: int, floor: int) -> dict[Path, object]:
    """The fields to set so that ``displaced`` of ``running`` pods go away, never below ``floor``
    (the PDB's).  The scale-down itself removes the displaced pods (they are marked first to go);
    where the floor binds some must move by eviction instead, and one pod more stays, because an
    eviction needs a healthy pod to spare.

    Deployment: ``spec.replicas``.  HPA: ``maxReplicas`` down to the target and ``minReplicas`` no
    higher (at least 1, as the API requires).  InferenceService: predictor ``maxReplicas``/
    ``minReplicas`` likewise, or the ``serving.kserve.io/stop`` annotation when nothing may stay
    (KServe clamps ``minReplicas`` to 1 in Standard mode with an HPA).
    """
    spec = obj.get("spec") or {}

    def kept(total: int) -> int:
        if total - displaced >= floor:
            return total - displaced
        return min(floor + 1, total)  # one spare healthy pod, so the evictions that move the rest are allowed

    if kind is DEPLOYMENT:
        return {("spec", "replicas"): kept(spec.get("replicas", 1))}
    target = kept(running)
    if kind is HPA:
        target = max(target, 1)
        return {
            ("spec", "maxReplicas"): target,
            ("spec", "minReplicas"): min(spec.get("minReplicas", 1), target),
        }
    if target == 0:
        return {("metadata", "annotations", KSERVE_STOP): "true"}
    predictor = spec.get("predictor") or {}
    return {
        ("spec", "predictor", "maxReplicas"): target,
        ("spec", "predictor", "minReplicas"): min(predictor.get("minReplicas", 1), target),
    }


# ---- lending and repaying --------------------------------------------------------------------
def lend(
    custom, ref: WorkloadRef, run: str, fields: dict[Path, object], deadline: Deadline, current: dict
) -> Edited:
    return ref.edit(custom, lambda obj: lend_patch(obj, run, fields), deadline, current)


def repay(custom, ref: WorkloadRef, run: str, deadline: Deadline, current: dict | None = None) -> Edited:
    return ref.edit(custom, lambda obj: repay_patch(obj, run), deadline, current)


def find_loans(custom, run: str, deadline: Deadline) -> list[tuple[WorkloadRef, dict]]:
    """Every object of the lending kinds, in any namespace, that holds a loan of ``run``."""
    return loans_by_run(custom, deadline, run).get(run, [])


def loans_by_run(
    custom, deadline: Deadline, run: str | None = None
) -> dict[str, list[tuple[WorkloadRef, dict]]]:
    """The objects of the lending kinds, in any namespace, holding loans, by the runs they lent to
    (only ``run``'s, when given).  Kinds the cluster does not serve (no HPA API, no KServe) are
    skipped; so is a loan record that is not the JSON ``loans`` writes (it is logged)."""
    from kubernetes.client.exceptions import ApiException

    found: dict[str, list[tuple[WorkloadRef, dict]]] = {}
    for kind in LENDING_KINDS:
        try:
            items = list_all(
                lambda token, kind=kind: custom.list_cluster_custom_object(
                    kind.group, kind.version, kind.plural, limit=PAGE, _continue=token
                ),
                deadline,
                f"list {kind.plural}",
            )
        except ApiException as error:
            if error.status == 404:
                continue
            raise
        for obj in items:
            raw = (obj["metadata"].get("annotations") or {}).get(LOANS_ANNOTATION, "")
            if not raw or (run is not None and f'"{run}"' not in raw):
                continue
            ref = WorkloadRef(kind, obj["metadata"]["namespace"], obj["metadata"]["name"])
            try:
                runs = [r for r in loans_of(obj) if run is None or r == run]
            except (ValueError, AttributeError):
                log.warning("%s: annotation %s is not a loan record; left alone", ref, LOANS_ANNOTATION)
                continue
            for lender in runs:
                found.setdefault(lender, []).append((ref, obj))
    return found


def not_ready_reason(kind: Kind, obj: dict) -> str | None:
    """Why a workload is not Ready yet (``None`` when it is)."""
    status = obj.get("status") or {}
    if kind is DEPLOYMENT:
        wanted = obj["spec"].get("replicas", 1)
        if status.get("observedGeneration", 0) < obj["metadata"].get("generation", 0):
            return "the Deployment controller has not seen the new replica count yet"
        ready = status.get("readyReplicas", 0)
        return None if ready >= wanted else f"{ready}/{wanted} replicas ready"
    if kind is HPA:
        wanted = obj["spec"].get("minReplicas", 1)
        current = status.get("currentReplicas", 0)
        return None if current >= wanted else f"{current}/{wanted} (minReplicas) replicas running"
    if (obj["metadata"].get("annotations") or {}).get(KSERVE_STOP) == "true":
        return None
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    return (
        None
        if ready and ready.get("status") == "True"
        else f"condition Ready is {ready and ready.get('status')}"
    )


def hpa_for(custom, deployment: WorkloadRef, deadline: Deadline) -> tuple[WorkloadRef, dict] | None:
    """The HorizontalPodAutoscaler that scales ``deployment``, if any (none when HPAs are not served)."""
    from kubernetes.client.exceptions import ApiException

    try:
        hpas = list_all(
            lambda token: custom.list_namespaced_custom_object(
                HPA.group, HPA.version, deployment.namespace, HPA.plural, limit=PAGE, _continue=token
            ),
            deadline,
            f"list HPAs in {deployment.namespace}",
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    for hpa in hpas:
        target = hpa["spec"]["scaleTargetRef"]
        if target.get("kind") == "Deployment" and target.get("name") == deployment.name:
            return WorkloadRef(HPA, deployment.namespace, hpa["metadata"]["name"]), hpa
    return None
