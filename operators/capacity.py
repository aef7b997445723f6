"""Airflow operators for the taint flip: ``ClaimNodesOperator`` (setup) and ``ReturnCapacityOperator``
(teardown).  Thin: the procedure lives in ``trainops.capacity.procedure``.

    claim = ClaimNodesOperator(task_id="claim_nodes", count=3,
                               node_names="{{ ti.xcom_pull(task_ids='health_gate')['node_names'] }}",
                               inference_deployments=["inference/llm-chat"])
    train = ...
    give_back = ReturnCapacityOperator(task_id="return_capacity").as_teardown(setups=claim)
    claim >> train >> give_back
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, Literal

from airflow.sdk import BaseOperator
from trainops.provider.errors import translate_errors

from trainops.capacity.claims import NodesHeld
from trainops.capacity.coverage import check_queue
from trainops.capacity.procedure import Deadlines, claim, give_back
from trainops.conventions import GPU_RESOURCE
from trainops.kube.retry import Deadline
from trainops.placement.request import TopologyRequest

DEFAULT_CONN_ID = "kubernetes_default"


def run_key(context) -> str:
    """The claim key of the current DAG run: ``<dag_id>/<run_id>``."""
    return f"{context['dag_run'].dag_id}/{context['dag_run'].run_id}"


def _list_or_template(value: Any) -> Any:
    return value if isinstance(value, str) else list(value)


class ClaimNodesOperator(BaseOperator):
    """Claim GPU nodes from inference for this DAG run (use as a setup task).

    :param node_names: names of the candidate nodes, e.g. the health gate's ``node_names``. Templated.
    :param count: how many of ``node_names`` to claim, the least disruptive first (idle nodes, then
        those running the fewest pods a drain must move); default: all of them. Templated.
    :param cluster_queue: the training ClusterQueue whose ``nvidia.com/gpu`` quota grows by the GPUs claimed.
    :param local_queue: the Kueue LocalQueue (in ``training_namespace``) the run is submitted to: before
        anything is claimed, it must send runs to ``cluster_queue``, which must cover every one of
        ``run_resources``, else the task fails naming the fix and nothing is changed. None: not checked. Templated.
    :param training_namespace: the namespace of ``local_queue`` (and of the run's Jobs and image pulls).
    :param priority_class: the run's Kueue WorkloadPriorityClass, checked with ``local_queue`` to exist (Kueue
        makes no Workload for a job that names a missing one). Templated.
    :param run_resources: the resources each pod of the run requests (``nvidia.com/gpu``; ``cpu``, ``memory``
        when it sets them; ``extra_resources`` such as ``rdma/ib``), checked against the ClusterQueue's
        ``coveredResources``. Templated.
    :param gpus_per_node: GPUs each node adds to the quota; default: the node's allocatable ``nvidia.com/gpu``.
    :param gpu_flavor: the ClusterQueue flavor to adjust; needed only when several flavors hold GPU quota.
    :param inference_deployments: ``namespace/name`` of inference Deployments to scale down (their HPA
        when one targets them). Templated.
    :param inference_services: ``namespace/name`` of KServe InferenceServices to scale down. Templated.
    :param unsafe_inference: what the claim does with an inference workload it shrinks or moves whose pods
        lack a clean hand-off (a readinessProbe; a ``preStop`` hook, ``sleep`` or ``exec``, longer than
        ``endpoint_propagation_s``; ``terminationGracePeriodSeconds`` above it plus the server's own drain,
        e.g. vLLM's ``--shutdown-timeout``; ``trainops.capacity.handoff``): ``"drain-safely"`` (default)
        takes each of its pods out of its Services first, waits until no EndpointSlice lists it and
        ``endpoint_propagation_s`` more, then scales it away or evicts it (the eviction asked first as a
        dry run, so budgets hold); ``"refuse"`` fails before anything changes, naming each field and its fix.
    :param endpoint_propagation_s: seconds an endpoint takes to leave every proxy after its EndpointSlice
        entry goes (kube-proxy, ingress, gateways); a preStop hook must hold SIGTERM back longer. Default 5.
    :param overflow_pool: where the Deployments' displaced replicas keep serving while the run holds
        their nodes, for those without a ``trainops.io/overflow-pool`` annotation of their own, e.g.
        ``{"node_label": "type=virtual-kubelet", "taint": "virtual-kubelet.io/provider"}`` (optional
        ``min_ready``); None: they shrink. Templated.
    :param topology: where in the fabric the nodes must sit, ``{"mode": "none"|"preferred"|"required",
        "level": <node label>, "levels": [<node labels, widest first>]}`` (``trainops.placement``): the run's
        ``count - spares`` nodes in the smallest domain of the level that holds them, the spares beside them;
        ``required`` and no domain holds them fails naming the largest. None: no topology. Templated.
    :param spares: how many of ``count`` are spares (they may sit outside a required domain). Templated.
    :param prepull_image: the training image, pulled onto every claimed node once it is drained (one short
        pod per node in ``training_namespace``), so a resume onto a spare pays no pull; None: no pull. Templated.
    :param kubernetes_conn_id: Airflow ``kubernetes`` connection of the cluster.
    :param wait_for_nodes_s: when other runs hold some of the nodes: 0 fails at once naming the holders;
        > 0 waits (deferred, no worker slot) up to this many seconds for them to be returned.
    :param poll_interval_s: how often the deferred wait looks at the nodes.
    :param api_deadline_s: seconds each API step may keep retrying conflicts and 429/5xx answers.
    :param drain_deadline_s: seconds for inference pods to leave the claimed nodes (PDBs may slow it).
    :param ready_deadline_s: seconds for the replicas made in an overflow pool to be Ready (a model
        server that pulls its image and loads its weights there may need long).
    """

    template_fields: Sequence[str] = (
        "node_names",
        "count",
        "cluster_queue",
        "local_queue",
        "priority_class",
        "run_resources",
        "inference_deployments",
        "inference_services",
        "overflow_pool",
        "topology",
        "spares",
        "prepull_image",
    )

    def __init__(
        self,
        *,
        node_names: Sequence[str],
        count: int | None = None,
        cluster_queue: str = "training",
        local_queue: str | None = None,
        training_namespace: str = "training",
        priority_class: str | None = None,
        run_resources: Sequence[str] = (GPU_RESOURCE,),
        gpus_per_node: int | None = None,
        gpu_flavor: str | None = None,
        inference_deployments: Sequence[str] = (),
        inference_services: Sequence[str] = (),
        overflow_pool: dict | str | None = None,
        unsafe_inference: Literal["drain-safely", "refuse"] = "drain-safely",
        endpoint_propagation_s: float = 5.0,
        topology: Mapping[str, Any] | None = None,
        spares: int = 0,
        prepull_image: str | None = None,
        kubernetes_conn_id: str = DEFAULT_CONN_ID,
        wait_for_nodes_s: float = 0,
        poll_interval_s: float = 10,
        api_deadline_s: float = 120,
        drain_deadline_s: float = 600,
        ready_deadline_s: float = 600,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if wait_for_nodes_s < 0 or poll_interval_s <= 0:
            raise ValueError("wait_for_nodes_s must be >= 0 and poll_interval_s > 0")
        self.node_names, self.count = _list_or_template(node_names), count
        self.cluster_queue = cluster_queue
        self.local_queue, self.training_namespace = local_queue, training_namespace
        self.priority_class = priority_class
        self.run_resources = _list_or_template(run_resources)
        self.gpus_per_node = gpus_per_node
        self.gpu_flavor = gpu_flavor
        # a template string (e.g. "{{ params.workloads }}") stays whole until it is rendered
        self.inference_deployments = _list_or_template(inference_deployments)
        self.inference_services = _list_or_template(inference_services)
        self.overflow_pool = overflow_pool
        if unsafe_inference not in ("drain-safely", "refuse"):
            raise ValueError(f"unsafe_inference must be 'drain-safely' or 'refuse', got {unsafe_inference!r}")
        if not endpoint_propagation_s >= 0:
            raise ValueError(f"endpoint_propagation_s must be >= 0, got {endpoint_propagation_s!r}")
        self.unsafe_inference, self.endpoint_propagation_s = unsafe_inference, endpoint_propagation_s
        self.topology, self.spares = topology, spares
        self.prepull_image = prepull_image
        self.kubernetes_conn_id = kubernetes_conn_id
        self.wait_for_nodes_s = wait_for_nodes_s
        self.poll_interval_s = poll_interval_s
        self.deadlines = Deadlines(api_s=api_deadline_s, drain_s=drain_deadline_s, ready_s=ready_deadline_s)

    @translate_errors
    def execute(self, context) -> dict:
        deadline = time.time() + self.wait_for_nodes_s
        return self._claim_or_wait(context, deadline)

    @translate_errors
    def execute_complete(self, context, event: dict) -> dict:
        # The deadline rides in the event: dag.test() drops defer(kwargs=...) when a trigger fires.
        if event["status"] != "free":
            raise NodesHeld(event["holders"])
        return self._claim_or_wait(context, event["deadline"])

    def _claim_or_wait(self, context, deadline: float) -> dict:
        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook
        from trainops.triggers.capacity import NodesFreeTrigger

        run = run_key(context)
        kube = KubernetesClusterHook(conn_id=self.kubernetes_conn_id).kube()
        self._run, self._kube = run, kube
        if self.local_queue:  # reads only: a run Kueue cannot admit is refused before anything changes
            check_queue(
                kube,
                self.training_namespace,
                self.local_queue,
                self.run_resources,
                Deadline(self.deadlines.api_s),
                cluster_queue=self.cluster_queue,
                priority_class=self.priority_class,
            )
            self.log.info(
                "LocalQueue %s/%s -> ClusterQueue %s covers %s",
                self.training_namespace,
                self.local_queue,
                self.cluster_queue,
                ", ".join(self.run_resources),
            )
        try:
            summary = claim(
                kube,
                run,
                self.node_names,
                count=self.count,
                cluster_queue=self.cluster_queue,
                gpus_per_node=self.gpus_per_node,
                deployments=self.inference_deployments,
                inference_services=self.inference_services,
                gpu_flavor=self.gpu_flavor,
                overflow_pool=self.overflow_pool,
                unsafe_inference=self.unsafe_inference,
                endpoint_propagation_s=self.endpoint_propagation_s,
                topology=TopologyRequest.from_value(self.topology),
                spares=int(self.spares),
                image=self.prepull_image or None,
                training_namespace=self.training_namespace,
                deadlines=self.deadlines,
                log=self.log,
            )
        except NodesHeld as held:
            self._give_back_partial_claim()
            if time.time() >= deadline:
                raise
            self.log.info("%s; waiting up to %.0fs for them", held, deadline - time.time())
            self.defer(
                trigger=NodesFreeTrigger(
                    sorted(held.holders), run, self.kubernetes_conn_id, deadline, self.poll_interval_s
                ),
                method_name="execute_complete",
            )
        except Exception:
            self._give_back_partial_claim()
            raise
        self.log.info("claimed %d node(s), %d GPUs, for %s", len(summary.node_names), summary.gpus, run)
        for workload, replicas in summary.offloaded.items():
            self.log.info("%s: %d replica(s) serve from its overflow pool meanwhile", workload, replicas)
        return asdict(summary)

    def on_kill(self) -> None:
        self._give_back_partial_claim()

    def _give_back_partial_claim(self) -> None:
        """Undo a claim that did not finish: Airflow does not run a teardown whose only setup failed,
        so a failed or killed claim gives back itself what it took (nothing, if it took nothing)."""
        run, kube = getattr(self, "_run", None), getattr(self, "_kube", None)
        if run is None:
            return
        self.log.warning("claim of %s did not finish; giving back what it took", run)
        try:
            give_back(
                kube,
                run,
                cluster_queue=self.cluster_queue,
                endpoint_propagation_s=self.endpoint_propagation_s,
                deadlines=self.deadlines,
                log=self.log,
            )
        except Exception as error:  # the claim's own error matters more; the records stay for a retry
            self.log.error(
                "giving back %s failed (%s); run `trainops capacity return --run %s`", run, error, run
            )


class ReturnCapacityOperator(BaseOperator):
    """Give back everything this DAG run claimed (use as the teardown of ``ClaimNodesOperator``).

    Works from what the cluster records (node and object annotations), so it needs no XCom and is
    right after a claim that died halfway, and a retry resumes a return that stopped halfway (replicas
    coming back from an overflow pool in waves).  Returns a summary (nodes, quarantined nodes, workloads).
    First it stops the DAG run's training Jobs that are still running and waits for their pods to
    go: when the run or ``train`` is marked failed, the trigger's stop may come after this task, or
    never (a triggerer that was down).

    :param cluster_queue: the training ClusterQueue the claim raised.
    :param training_namespace: the namespace of the run's ``GangTrainingOperator`` Jobs (None: none).
    :param kubernetes_conn_id: Airflow ``kubernetes`` connection of the cluster.
    :param wave_nodes: nodes given back per wave when replicas come back from an overflow pool
        (after each wave they are Ready on the returned nodes before the overflow shrinks); None: a
        quarter of the run's nodes. Templated.
    :param endpoint_propagation_s: an overflow companion whose pods lack a clean hand-off (see
        ``ClaimNodesOperator``'s ``unsafe_inference``) has the pods its scale-down removes taken out of
        their Services first; they go this many seconds after no EndpointSlice lists them. Default 5.
    :param api_deadline_s: seconds each API step may keep retrying conflicts and 429/5xx answers.
    :param ready_deadline_s: seconds for the inference workloads to be Ready again (per wave).
    """

    template_fields: Sequence[str] = ("cluster_queue", "wave_nodes")

    def __init__(
        self,
        *,
        cluster_queue: str = "training",
        training_namespace: str | None = "training",
        kubernetes_conn_id: str = DEFAULT_CONN_ID,
        wave_nodes: int | str | None = None,
        endpoint_propagation_s: float = 5.0,
        api_deadline_s: float = 120,
        ready_deadline_s: float = 600,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if not endpoint_propagation_s >= 0:
            raise ValueError(f"endpoint_propagation_s must be >= 0, got {endpoint_propagation_s!r}")
        self.endpoint_propagation_s = endpoint_propagation_s
        self.cluster_queue = cluster_queue
        self.training_namespace = training_namespace
        self.wave_nodes = wave_nodes
        self.kubernetes_conn_id = kubernetes_conn_id
        self.deadlines = Deadlines(api_s=api_deadline_s, ready_s=ready_deadline_s)

    @translate_errors
    def execute(self, context) -> dict:
        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook

        run = run_key(context)
        kube = KubernetesClusterHook(conn_id=self.kubernetes_conn_id).kube()
        summary = give_back(
            kube,
            run,
            cluster_queue=self.cluster_queue,
            training_namespace=self.training_namespace,
            wave_nodes=self.wave_nodes,
            endpoint_propagation_s=self.endpoint_propagation_s,
            deadlines=self.deadlines,
            log=self.log,
        )
        self.log.info("%s", summary.describe())
        return asdict(summary)
