"""The gang: one Kueue-managed Indexed Job per attempt, one pod per node.

Kueue admits all ``nodes`` pods together or none (one PodSet of ``nodes`` pods).  The Job is
created suspended; Kueue's webhook would suspend it anyway and unsuspends it on admission.
``backoffLimit: 0``: the first pod failure fails the attempt, because trainops, not the Job
controller, decides whether and where the run resumes.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainops.conventions import (
    GPU_POOL_LABEL,
    GPU_RESOURCE,
    HEALTH_LABEL,
    HEALTH_QUARANTINED,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    MODE_TAINT,
    MODE_TRAINING,
)
from trainops.training.naming import run_key
from trainops.training.spec import CONTAINER_NAME, TrainingSpec

RUN_LABEL = "trainops.io/run"
ATTEMPT_LABEL = "trainops.io/attempt"
DAG_RUN_ANNOTATION = "trainops.io/dag-run"
RESUME_ANNOTATION = "trainops.io/resume-from"
EXCLUDED_ANNOTATION = "trainops.io/excluded-nodes"
HOSTNAME_LABEL = "kubernetes.io/hostname"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def build_job(
    spec: TrainingSpec,
    *,
    name: str,
    dag_id: str,
    run_id: str,
    attempt: int,
    resume_from: str | None,
    excluded_nodes: Mapping[str, str] | None = None,
):
    """The ``V1Job`` of one attempt.  ``excluded_nodes``: node name -> why it is kept out of this run."""
    from kubernetes import client

    excluded = dict(excluded_nodes or {})
    labels = {RUN_LABEL: run_key(dag_id, run_id), ATTEMPT_LABEL: str(attempt)}
    env = [client.V1EnvVar(name=k, value=str(v)) for k, v in sorted(spec.env.items())] + [
        client.V1EnvVar(name="TRAINOPS_RUN_URI", value=spec.run_path),
        client.V1EnvVar(name="TRAINOPS_RESUME_FROM", value=resume_from or ""),
        client.V1EnvVar(name="TRAINOPS_ATTEMPT", value=str(attempt)),
        client.V1EnvVar(name="TRAINOPS_WORLD_SIZE", value=str(spec.nodes)),
    ]  # the Job controller adds JOB_COMPLETION_INDEX (the pod's rank) to every container
    requests = {GPU_RESOURCE: str(spec.gpus_per_node)}
    if spec.cpu:
        requests["cpu"] = spec.cpu
    if spec.memory:
        requests["memory"] = spec.memory
    container = client.V1Container(
        name=CONTAINER_NAME,
        image=spec.image,
        command=list(spec.command),
        args=list(spec.args) or None,
        env=env,
        resources=client.V1ResourceRequirements(
            requests=requests, limits={GPU_RESOURCE: str(spec.gpus_per_node)}
        ),
    )
    pod_spec = client.V1PodSpec(
        containers=[container],
        restart_policy="Never",
        termination_grace_period_seconds=spec.termination_grace_seconds,
        service_account_name=spec.service_account,
        node_selector={GPU_POOL_LABEL: "true"},
        tolerations=[
            client.V1Toleration(key=MODE_TAINT, operator="Equal", value=MODE_TRAINING, effect="NoSchedule")
        ],
        affinity=client.V1Affinity(
            node_affinity=_node_affinity(client, spec.node_names, excluded),
            pod_anti_affinity=client.V1PodAntiAffinity(  # one pod per node
                required_during_scheduling_ignored_during_execution=[
                    client.V1PodAffinityTerm(
                        label_selector=client.V1LabelSelector(match_labels=labels),
                        topology_key=HOSTNAME_LABEL,
                    )
                ]
            ),
        ),
    )
    annotations = {DAG_RUN_ANNOTATION: f"{dag_id}/{run_id}"}
    if resume_from:
        annotations[RESUME_ANNOTATION] = resume_from
    if excluded:
        annotations[EXCLUDED_ANNOTATION] = ",".join(sorted(excluded))
    return client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=spec.namespace,
            labels={**labels, KUEUE_QUEUE_LABEL: spec.queue, KUEUE_PRIORITY_LABEL: spec.priority_class},
            annotations=annotations,
        ),
        spec=client.V1JobSpec(
            completion_mode="Indexed",
            completions=spec.nodes,
            parallelism=spec.nodes,
            backoff_limit=0,
            suspend=True,
            template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels=labels), spec=pod_spec),
        ),
    )


def _node_affinity(client, node_names, excluded: Mapping[str, str]):
    expressions = [
        client.V1NodeSelectorRequirement(key=HEALTH_LABEL, operator="NotIn", values=[HEALTH_QUARANTINED])
    ]
    if excluded:
        expressions.append(
            client.V1NodeSelectorRequirement(key=HOSTNAME_LABEL, operator="NotIn", values=sorted(excluded))
        )
    if node_names:
        expressions.append(
            client.V1NodeSelectorRequirement(key=HOSTNAME_LABEL, operator="In", values=sorted(node_names))
        )
    return client.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=client.V1NodeSelector(
            node_selector_terms=[client.V1NodeSelectorTerm(match_expressions=expressions)]
        )
    )


def job_to_dict(job) -> dict:
    """The Job as the API takes it (camelCase keys, no nulls)."""
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(job)
