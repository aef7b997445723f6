"""The disruption controller: keeps every PodDisruptionBudget's status current (the maths are
``pdb.compute_status``, shared with the Eviction subresource)."""

from __future__ import annotations

from trainops_devcluster import pdb as budget
from trainops_devcluster.informer import InformerController, Key, key_of
from trainops_devcluster.store import NotFound, Store

PDBS = "poddisruptionbudgets.policy"


class DisruptionController(InformerController):
    watches = (PDBS, "pods", "deployments.apps")

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self._pods_in: dict[str, set[Key]] = {}

    def changed(self, resource: str, old: dict | None, new: dict | None) -> None:
        obj = new or old
        namespace = obj["metadata"].get("namespace", "")
        if resource == "pods":
            pods = self._pods_in.setdefault(namespace, set())
            (pods.add if new is not None else pods.discard)(key_of(obj))
        self.mark(namespace)

    def reconcile(self, namespaces: set[str]) -> None:
        """Marked keys are namespaces: every budget in them gets a look."""
        budgets = self.cache[PDBS]
        for namespace in sorted(namespaces):
            keys = [k for k in budgets if k[0] == namespace]
            if not keys:
                continue
            pods = [
                self.cache["pods"][k] for k in self._pods_in.get(namespace, ()) if k in self.cache["pods"]
            ]
            for key in keys:
                self._sync(budgets[key], pods)

    def _scale_of(self, ref: dict, namespace: str) -> int | None:
        if ref.get("kind") != "Deployment":
            return None
        deployment = self.cache["deployments.apps"].get((namespace, ref.get("name")))
        if deployment is None or deployment["metadata"]["uid"] != ref.get("uid"):
            return None
        return deployment["spec"].get("replicas", 1)

    def _sync(self, pdb: dict, pods: list[dict]) -> None:
        status = budget.compute_status(pdb, pods, self._scale_of)
        if status.get("disruptedPods"):  # look again when those entries expire
            namespace = pdb["metadata"]["namespace"]
            self.after(budget.DISRUPTED_POD_TIMEOUT.total_seconds() + 1, lambda: self.mark(namespace))
        if status == pdb.get("status"):
            return
        uid = pdb["metadata"]["uid"]

        def write(current: dict) -> None:
            if current["metadata"]["uid"] != uid:
                raise NotFound("replaced")
            current["status"] = budget.compute_status(current, pods, self._scale_of)

        try:
            self.observe(PDBS, self.store.mutate(PDBS, *key_of(pdb), write))
        except NotFound:
            pass
