"""The gang Job: what Kueue and the scheduler see, and what the trainer gets in its environment."""

import pytest

from trainops.conventions import GPU_RESOURCE, KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL, MODE_TAINT
from trainops.training.job import build_job, job_to_dict
from trainops.training.naming import DNS_1123_LABEL, MAX_JOB_NAME, job_name
from trainops.training.spec import TrainingSpec


def spec(**changes) -> TrainingSpec:
    values = dict(
        image="devcluster.trainops.io/local", command=["python", "-m", "train"], run_uri="s3://b/runs/r1"
    )
    values.update(changes)
    return TrainingSpec(**values)


def built(**changes) -> dict:
    job = build_job(
        spec(**changes.pop("spec", {})),
        name="train-x-a1",
        dag_id="lifecycle",
        run_id="manual__2025-01-01",
        attempt=2,
        resume_from=changes.pop("resume_from", "s3://b/runs/r1/step-40/"),
        excluded_nodes=changes.pop("excluded", {"gpu-node-003": "XID 79"}),
    )
    return job_to_dict(job)


def test_gang_is_one_indexed_job_with_one_pod_per_node():
    job = built(spec={"nodes": 4, "gpus_per_node": 8})
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["suspend"] is True
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["containers"][0]["resources"]["requests"][GPU_RESOURCE] == "8"
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == job["spec"]["template"]["metadata"]["labels"]


def test_queue_priority_toleration_and_node_rules():
    job = built(spec={"queue": "research", "priority_class": "training-urgent", "node_names": ["n1", "n2"]})
    labels = job["metadata"]["labels"]
    assert labels[KUEUE_QUEUE_LABEL] == "research" and labels[KUEUE_PRIORITY_LABEL] == "training-urgent"
    pod = job["spec"]["template"]["spec"]
    assert {"key": MODE_TAINT, "operator": "Equal", "value": "training", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["nodeSelector"] == {"trainops.io/gpu-pool": "true"}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    expressions = terms[0]["matchExpressions"]
    assert {"key": "trainops.io/health", "operator": "NotIn", "values": ["quarantined"]} in expressions
    assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-node-003"]} in expressions
    assert {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1", "n2"]} in expressions


def test_trainer_env_says_where_to_resume_and_which_attempt():
    env = {
        e["name"]: e
        for e in built(spec={"env": {"LR": "0.1"}})["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["TRAINOPS_RUN_URI"]["value"] == "s3://b/runs/r1/"
    assert env["TRAINOPS_RESUME_FROM"]["value"] == "s3://b/runs/r1/step-40/"
    assert env["TRAINOPS_ATTEMPT"]["value"] == "2"
    assert env["LR"]["value"] == "0.1"
    assert env["TRAINOPS_WORLD_SIZE"]["value"] == "1"


def test_fresh_start_has_empty_resume_and_no_exclusions():
    job = built(resume_from=None, excluded={})
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TRAINOPS_RESUME_FROM"] == ""
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    expressions = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"
    ]
    assert [e["key"] for e in expressions] == ["trainops.io/health"]


@pytest.mark.parametrize(
    "dag_id, run_id",
    [
        ("training_lifecycle", "manual__2025-06-01T10:00:00.123456+00:00"),
        ("A" * 250, "scheduled__" + "9" * 200),
        ("___", "+++"),
    ],
)
def test_job_names_are_dns_labels_deterministic_and_distinct(dag_id, run_id):
    names = [job_name(dag_id, run_id, attempt) for attempt in (1, 2, 10)]
    assert all(len(n) <= MAX_JOB_NAME and DNS_1123_LABEL.match(n) for n in names)
    assert len(set(names)) == 3
    assert names[0] == job_name(dag_id, run_id, 1)
    assert job_name(dag_id, run_id + "x", 1) != names[0]


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"nodes": 0}, "nodes"),
        ({"nodes": -2}, "nodes"),
        ({"run_uri": "s3:///runs"}, "run_uri"),
        ({"run_uri": "/tmp/run"}, "run_uri"),
        ({"queue": "Training_Queue"}, "queue"),
        ({"command": "python train.py"}, "command"),
        ({"env": {"TRAINOPS_RESUME_FROM": "x"}}, "env"),
        ({"nodes": 3, "node_names": ["a", "b"]}, "node_names"),
    ],
)
def test_bad_spec_names_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        spec(**changes)
