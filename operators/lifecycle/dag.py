"""The training lifecycle as one piece that DAGs reuse: trigger-form params, docs and the task chain.

    with DAG("training_lifecycle", params=lifecycle_params(), doc_md=LIFECYCLE_DOC,
             render_template_as_native_obj=True, schedule=None):
        training_lifecycle("training_lifecycle")

health gate -> claim nodes (setup) -> gang training (each retry a resume) -> verify the final
checkpoint (outlet: an Airflow Asset) -> return capacity (teardown, runs on every path).
Everything heavy (kubernetes, boto3) is imported inside the tasks; this module parses fast.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import Asset, Param
from airflow.sdk.exceptions import AirflowFailException
from trainops.operators.capacity import ClaimNodesOperator, ReturnCapacityOperator, node_names
from trainops.operators.checkpoint import CheckpointVerifyOperator
from trainops.operators.health import NodeHealthGateOperator
from trainops.operators.training import GangTrainingOperator

from trainops.health.policy import DEFAULT_POLICY
from trainops.training.naming import DNS_1123_LABEL

MAX_RESUMES = 10  # the training task's Airflow retries; the max_resumes param lowers it per run
DEMO_BUCKET = "trainops-demo"
LOCAL_IMAGE = "devcluster.trainops.io/local"  # the devcluster runs this image's command as a local process
DEMO_COMMAND = [
    "python",
    "-m",
    "trainops_devcluster.demo.trainer",
    "--steps",
    "200",
    "--checkpoint-every",
    "20",
    "--step-seconds",
    "0.05",
]
S3_RUN_PREFIX = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"
WORKLOAD_REF = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
RUN_PATH = "{{ params.checkpoint_uri.rstrip('/') }}/{{ params.run_name }}/"

LIFECYCLE_DOC = """
# GPU training lifecycle

One DAG run is one training run on the Kubernetes GPU cluster that serves inference the rest of the time:

1. **health_gate** reads every GPU node's health report and quarantines the failing ones.
2. **claim_nodes** (setup) borrows `nodes + spare_nodes` healthy nodes from inference: drains them
   (PodDisruptionBudgets honoured), flips their mode taint to training, raises the Kueue quota.
3. **train** submits the run to Kueue as one gang and follows it. A crash on bad hardware quarantines
   the node and resumes from the last *verified* checkpoint on the spare; each retry is a resume.
4. **verify_checkpoint** verifies the final checkpoint and publishes it as an Asset for evaluation or serving.
5. **return_capacity** (teardown) always gives the nodes back to inference, even when a task failed or
   the run was marked failed by hand.

Checkpoints live under `<checkpoint_uri>/<run_name>/`. A "Clear" on **train** resumes from the
latest verified checkpoint. If **return_capacity** itself failed, run
`trainops capacity return --run <dag_id>/<run_id>`.
"""

GATE_DOC = """
Reads the health report the node probe published on each GPU node (NVML, XIDs, ECC, NVLink, InfiniBand),
applies the health policy (plus `health_policy_overrides`), quarantines failing nodes with the evidence
on the node, and chooses `nodes + spare_nodes` healthy nodes of like speed. It first checks what needs
the cluster: enough GPU nodes exist and each has `gpus_per_node` GPUs; nothing is written when it fails.

**When it fails:** the log has one line per node with its verdict and reason. Too few healthy nodes:
wait for repairs, lower `nodes`/`spare_nodes`, or set `health_wait_s` so the gate waits (deferred).
A quarantined node is released with `trainops health release <node>` after repair.
"""

CLAIM_DOC = """
Setup task. Takes the least disruptive of the gate's nodes (idle ones first), checks no other run holds
them, flips their `trainops.io/mode` taint to `training`, scales down `inference_workloads` that ran there
and evicts what is left through the Eviction API (PodDisruptionBudgets honoured), and raises the training
ClusterQueue's GPU quota. Every change is recorded on the objects so the teardown undoes exactly it.

**When it fails:** it gives back whatever it took before failing. Nodes held by another run are named in
the log; wait for that run or choose other nodes.
"""

TRAIN_DOC = """
Submits the run as one Kueue gang (an Indexed Job, one pod per node) and follows the Workload, the Job,
its pods and the run's heartbeat without polling blindly. Each try is one attempt:

- infrastructure failure (XID, node lost, NCCL timeout, eviction) or a hang: the culprit node is
  quarantined with evidence and the task fails so Airflow retries it: the retry resumes from the latest
  verified checkpoint on the other claimed nodes, at most `max_resumes` times;
- user code failure (non-zero exit, no hardware evidence): fails at once, no resume used;
- preemption by a higher-priority Workload: Kueue requeues it; it keeps waiting, no resume used.

**When it fails:** the log says attempt n of m, where each attempt resumed from and why it ended.
Fix the code (user error) or the nodes, then "Clear" this task to resume from the latest verified checkpoint.
Marking it failed stops the Job; the teardown still returns the nodes.
"""

VERIFY_DOC = """
Verifies the newest complete checkpoint under the run path by its metadata (manifest and `_COMMITTED`
marker, or the format's own index) without downloading it, and publishes it as this DAG's
`final-checkpoint` Asset: the event's extra holds `uri`, `step` and `format` for evaluation or serving DAGs.

**When it fails:** no checkpoint under the run path verifies; the log lists each one skipped and why.
"""

RETURN_DOC = """
Teardown: runs whatever happened before, also after a user marks the run failed. Lowers the training
quota, flips the nodes this run claimed back to inference (quarantined nodes keep their quarantine),
repays the inference replicas it borrowed and waits until inference is Ready again. It works from what
the cluster records, so it is safe to run twice.

**When it fails:** run `trainops capacity return --run <dag_id>/<run_id>` (the log shows the exact
command) or clear this task.
"""


def lifecycle_params(**defaults: Any) -> dict[str, Param]:
    """The trigger-form params of a lifecycle DAG; ``defaults`` replaces default values by name."""
    unknown = set(defaults) - set(_PARAM_SPECS)
    if unknown:
        raise ValueError(f"lifecycle_params: unknown params {sorted(unknown)}; known: {sorted(_PARAM_SPECS)}")
    return {
        name: Param(defaults.get(name, default), **schema) for name, (default, schema) in _PARAM_SPECS.items()
    }


def _dns(title: str, description: str) -> dict[str, Any]:
    return {
        "type": "string",
        "pattern": DNS_1123_LABEL.pattern,
        "maxLength": 63,
        "title": title,
        "description": description + " (DNS-1123 label: lower-case letters, digits and '-').",
    }


_PARAM_SPECS: dict[str, tuple[Any, dict[str, Any]]] = {
    "run_name": (
        "demo-run",
        _dns("Run name", "Names the run: its checkpoints go under checkpoint_uri/run_name/"),
    ),
    "image": (
        LOCAL_IMAGE,
        {
            "type": "string",
            "minLength": 1,
            "title": "Training image",
            "description": f"Container image of the trainer. {LOCAL_IMAGE} runs the command as a local "
            "process on the devcluster.",
        },
    ),
    "command": (
        DEMO_COMMAND,
        {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "title": "Command",
            "description": "The trainer's command and arguments. It gets TRAINOPS_RUN_URI and "
            "TRAINOPS_RESUME_FROM (empty on a fresh start).",
        },
    ),
    "nodes": (
        2,
        {
            "type": "integer",
            "minimum": 1,
            "title": "Nodes",
            "description": "GPU nodes the run trains on (one pod per node).",
        },
    ),
    "spare_nodes": (
        1,
        {
            "type": "integer",
            "minimum": 0,
            "title": "Spare nodes",
            "description": "Extra healthy nodes claimed so a resume after a node fault has somewhere to run.",
        },
    ),
    "gpus_per_node": (
        8,
        {"type": "integer", "minimum": 1, "title": "GPUs per node", "description": "GPUs each pod asks for."},
    ),
    "kueue_queue": (
        "training",
        _dns("Kueue LocalQueue", "The LocalQueue in namespace 'training' to submit to"),
    ),
    "cluster_queue": (
        "training",
        _dns(
            "Kueue ClusterQueue", "The ClusterQueue behind the LocalQueue; its GPU quota grows by the claim"
        ),
    ),
    "priority_class": (
        "training-standard",
        _dns("Priority class", "Kueue WorkloadPriorityClass of the run"),
    ),
    "checkpoint_uri": (
        f"s3://{DEMO_BUCKET}/runs/",
        {
            "type": "string",
            "pattern": S3_RUN_PREFIX,
            "title": "Checkpoint URI",
            "description": "s3://bucket/prefix under which the run's checkpoints and heartbeat live, as "
            "<prefix>/<run_name>/. The bucket is required.",
        },
    ),
    "max_resumes": (
        2,
        {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_RESUMES,
            "title": "Max resumes",
            "description": "How many times an infrastructure failure may resume the run from its last "
            "verified checkpoint.",
        },
    ),
    "hang_timeout_s": (
        None,
        {
            "type": ["null", "number"],
            "exclusiveMinimum": 0,
            "title": "Hang timeout (s)",
            "description": "Seconds without progress that count as a hang. Empty: learned from the run's "
            "own step times.",
        },
    ),
    "health_wait_s": (
        0,
        {
            "type": "number",
            "minimum": 0,
            "title": "Wait for healthy nodes (s)",
            "description": "With too few healthy nodes, the gate waits (deferred) this long; 0 fails at once.",
        },
    ),
    "inference_workloads": (
        ["inference/llm-chat", "inference/embeddings"],
        {
            "type": "array",
            "items": {"type": "string", "pattern": WORKLOAD_REF},
            "title": "Inference workloads to borrow from",
            "description": "namespace/name of the inference Deployments that may shrink while the run "
            "holds their nodes; restored by the teardown.",
        },
    ),
    "health_policy_overrides": (
        {},
        {
            "type": "object",
            "propertyNames": {"enum": [row.name for row in DEFAULT_POLICY.rows]},
            "additionalProperties": {"type": "object"},
            "title": "Health policy overrides",
            "description": 'Policy rows to change, e.g. {"xid_warn": {"verdict": "quarantine"}} '
            "(fields: threshold, verdict, if_unknown).",
        },
    ),
}


class LifecycleGateOperator(NodeHealthGateOperator):
    """The health gate, first checking the run's params against the cluster (reads only)."""

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        from trainops.conventions import GPU_RESOURCE
        from trainops.kube.nodes import list_nodes
        from trainops.kube.retry import Deadline, call

        try:
            self._spec()
        except ValueError as error:
            raise AirflowFailException(f"health_policy_overrides: {error}") from error
        params = context["params"]
        core_v1 = KubernetesHook(conn_id=self.kubernetes_conn_id).core_v1_client
        nodes = call(
            lambda: list_nodes(core_v1, label_selector=self.selector),
            Deadline(self.api_deadline_s),
            "list nodes",
        )
        wanted = params["nodes"] + params["spare_nodes"]
        if wanted > len(nodes):
            raise AirflowFailException(
                f"nodes: the run asks for {params['nodes']} node(s) + {params['spare_nodes']} spare = {wanted}, "
                f"but the cluster has {len(nodes)} GPU node(s) matching {self.selector!r}; lower nodes or "
                "spare_nodes"
            )
        most = max(int((n.get("status") or {}).get("allocatable", {}).get(GPU_RESOURCE, 0)) for n in nodes)
        if params["gpus_per_node"] > most:
            raise AirflowFailException(
                f"gpus_per_node: {params['gpus_per_node']} asked, but no node has more than {most} GPUs"
            )
        return super().execute(context)


def least_disruptive(nodes: Sequence[str], pods: Sequence[dict], count: int) -> list[str]:
    """``count`` of ``nodes``, those running the fewest pods first (an idle node costs inference nothing)."""
    from trainops.capacity.drain import must_move

    if len(nodes) < count:
        raise ValueError(f"need {count} node(s), the health gate chose {len(nodes)}: {list(nodes)}")
    busy = Counter(pod["spec"].get("nodeName") for pod in pods if must_move(pod))
    return sorted(nodes, key=lambda name: (busy[name], name))[:count]


class LifecycleClaimOperator(ClaimNodesOperator):
    """``ClaimNodesOperator`` that claims ``count`` of the gate's chosen nodes, the least busy first."""

    template_fields: Sequence[str] = (*ClaimNodesOperator.template_fields, "count")

    def __init__(self, *, count: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.count = count

    def _claim_or_wait(self, context: Any, deadline: float) -> dict:
        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook

        from trainops.capacity.drain import list_pods
        from trainops.kube.retry import Deadline

        core_v1 = KubernetesClusterHook(conn_id=self.kubernetes_conn_id).core_v1_client
        candidates = node_names(self.nodes)
        self.nodes = least_disruptive(candidates, list_pods(core_v1, Deadline(60)), int(self.count))
        self.log.info("claiming %s (of the gate's %d healthy nodes)", ", ".join(self.nodes), len(candidates))
        return super()._claim_or_wait(context, deadline)


class FinalCheckpointOperator(CheckpointVerifyOperator):
    """Verify the newest checkpoint under the run path and publish it on the outlet Assets."""

    def execute(self, context: Any) -> dict[str, Any]:
        checkpoint = super().execute(context)
        for asset in self.outlets:
            context["outlet_events"][asset].extra = {
                "uri": checkpoint["uri"],
                "step": checkpoint["step"],
                "format": checkpoint["format"],
                "dag_run": f"{context['dag_run'].dag_id}/{context['dag_run'].run_id}",
            }
        return checkpoint


def final_checkpoint_asset(dag_id: str) -> Asset:
    """The Asset a lifecycle DAG updates with each verified final checkpoint (the event's extra has the URI).

    Named, without a URI scheme: a scheme would load every provider's URI handlers (boto3 among
    them) while the DAG file is parsed."""
    return Asset(name=f"trainops/{dag_id}/final-checkpoint")


def training_lifecycle(
    dag_id: str,
    *,
    run_path: str = RUN_PATH,
    kubernetes_conn_id: str = "kubernetes_default",
    aws_conn_id: str = "aws_default",
    retry_delay: timedelta = timedelta(seconds=5),
) -> dict[str, Any]:
    """Add the lifecycle's tasks to the DAG being defined (``with DAG(...)``); returns them by task id.

    The DAG needs ``params=lifecycle_params()`` and ``render_template_as_native_obj=True``.
    ``run_path``: template of the run's S3 path (default ``<checkpoint_uri>/<run_name>/``).
    """
    gate = LifecycleGateOperator(
        task_id="health_gate",
        min_nodes="{{ params.nodes + params.spare_nodes }}",
        policy_overrides="{{ params.health_policy_overrides }}",
        wait_timeout_s="{{ params.health_wait_s }}",
        poll_interval_s=10,
        kubernetes_conn_id=kubernetes_conn_id,
        doc_md=GATE_DOC,
    )
    claim = LifecycleClaimOperator(
        task_id="claim_nodes",
        nodes=gate.output["nodes"],
        count="{{ params.nodes + params.spare_nodes }}",
        cluster_queue="{{ params.cluster_queue }}",
        inference_deployments="{{ params.inference_workloads }}",
        kubernetes_conn_id=kubernetes_conn_id,
        doc_md=CLAIM_DOC,
    )
    train = GangTrainingOperator(
        task_id="train",
        image="{{ params.image }}",
        command="{{ params.command }}",
        run_uri=run_path,
        env={"TRAINOPS_RUN_NAME": "{{ params.run_name }}"},
        nodes="{{ params.nodes }}",
        gpus_per_node="{{ params.gpus_per_node }}",
        local_queue="{{ params.kueue_queue }}",
        priority_class="{{ params.priority_class }}",
        node_names="{{ ti.xcom_pull(task_ids='claim_nodes')['nodes'] }}",
        hang_timeout="{{ params.hang_timeout_s }}",
        max_resumes="{{ params.max_resumes }}",
        retries=MAX_RESUMES,
        retry_delay=retry_delay,
        kubernetes_conn_id=kubernetes_conn_id,
        doc_md=TRAIN_DOC,
    )
    verify = FinalCheckpointOperator(
        task_id="verify_checkpoint",
        run_uri=run_path,
        aws_conn_id=aws_conn_id,
        outlets=[final_checkpoint_asset(dag_id)],
        doc_md=VERIFY_DOC,
    )
    give_back = ReturnCapacityOperator(
        task_id="return_capacity",
        cluster_queue="{{ params.cluster_queue }}",
        kubernetes_conn_id=kubernetes_conn_id,
        doc_md=RETURN_DOC,
    ).as_teardown(setups=claim)
    gate >> claim >> train >> verify >> give_back
    return {task.task_id: task for task in (gate, claim, train, verify, give_back)}
