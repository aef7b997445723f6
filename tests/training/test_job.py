"""The gang Job: what Kueue and the scheduler see, and what the trainer gets in its environment."""

import pytest

from trainops.conventions import GPU_RESOURCE, KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL, MODE_TAINT
from trainops.training.job import build_job, build_service
from trainops.training.naming import DNS_1123_LABEL, MAX_JOB_NAME, job_name
from trainops.training.spec import TrainingSpec


def spec(**changes) -> TrainingSpec:
    values = dict(
        image="devcluster.trainops.io/local", command=["python", "-m", "train"], run_uri="s3://b/runs/r1"
    )
    values.update(changes)
    return TrainingSpec(**values)


def built(**changes) -> dict:
    return build_job(
        spec(**changes.pop("spec", {})),
        name="train-x-a1",
        dag_id="lifecycle",
        run_id="manual__2025-01-01",
        attempt=2,
        resume_from=changes.pop("resume_from", "s3://b/runs/r1/step-40/"),
        excluded_nodes=changes.pop("excluded", {"gpu-node-003": "XID 79"}),
    )


def env_of(job: dict) -> dict:
    return {e["name"]: e for e in trainer(job)["env"]}


def trainer(job: dict) -> dict:
    return next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "trainer")


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
    env = env_of(built(spec={"env": {"LR": "0.1"}}))
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


def test_every_rank_finds_rank_zero_through_the_headless_service():
    job = built(spec={"nodes": 4, "namespace": "research", "master_port": 23456})
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == "train-x-a1"
    env = env_of(job)
    assert (
        env["MASTER_ADDR"]["value"]
        == env["PET_MASTER_ADDR"]["value"]
        == "train-x-a1-0.train-x-a1.research.svc"
    )
    assert env["MASTER_PORT"]["value"] == env["PET_MASTER_PORT"]["value"] == "23456"
    assert env["WORLD_SIZE"]["value"] == env["PET_NNODES"]["value"] == "4"
    assert env["PET_NPROC_PER_NODE"]["value"] == "1"
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    for rank in ("NODE_RANK", "PET_NODE_RANK", "RANK"):
        assert env[rank]["valueFrom"]["fieldRef"]["fieldPath"] == index

    created = {**job, "metadata": {**job["metadata"], "uid": "0b5e-uid"}}
    service = build_service(spec(master_port=23456), created)
    assert service["metadata"]["name"] == pod["subdomain"]
    assert service["metadata"]["namespace"] == "research"
    assert service["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train-x-a1", "uid": "0b5e-uid"}
    ]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": "train-x-a1"}
    assert service["spec"]["ports"][0]["port"] == 23456


def test_torchrun_processes_per_node_make_the_world_size_and_leave_rank_to_torchrun():
    env = env_of(built(spec={"nodes": 2, "procs_per_node": 8}))
    assert env["WORLD_SIZE"]["value"] == "16"
    assert env["PET_NPROC_PER_NODE"]["value"] == "8"
    assert "RANK" not in env and "NODE_RANK" in env


def test_dev_shm_is_memory_backed_with_a_configurable_limit_or_left_out():
    job = built(spec={"shm_size": "64Gi"})
    pod = job["spec"]["template"]["spec"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in trainer(job)["volumeMounts"]
    bare = built(spec={"shm_size": None})
    assert "volumes" not in bare["spec"]["template"]["spec"]
    assert "volumeMounts" not in trainer(bare)


def test_rdma_devices_capabilities_node_labels_and_volumes():
    job = built(
        spec={
            "extra_resources": {"rdma/ib": 1, "nvidia.com/hostdev": "8"},
            "capabilities": ["IPC_LOCK"],
            "node_selector": {"network.example/fabric": "ib"},
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "corpus"}}],
            "volume_mounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
        }
    )
    pod, container = job["spec"]["template"]["spec"], trainer(job)
    resources = container["resources"]
    assert resources["requests"] == {"nvidia.com/gpu": "8", "rdma/ib": "1", "nvidia.com/hostdev": "8"}
    assert resources["limits"] == resources["requests"]
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert pod["nodeSelector"] == {"trainops.io/gpu-pool": "true", "network.example/fabric": "ib"}
    assert [v["name"] for v in pod["volumes"]] == ["dshm", "data"]
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/dev/shm", "/data"]


def test_a_run_adds_capabilities_only_for_rdma_so_it_meets_pod_security_baseline():
    assert "securityContext" not in trainer(built(spec={"extra_resources": {"nvidia.com/hostdev": "8"}}))
    rdma = trainer(built(spec={"extra_resources": {"rdma/ib": 1}}))
    assert rdma["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}


def test_pod_template_merges_under_what_trainops_owns():
    from kubernetes import client

    template = {
        "metadata": {"labels": {"team": "llm"}, "annotations": {"k8s.v1.cni.cncf.io/networks": "ib-sriov"}},
        "spec": {
            "priorityClassName": "high",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "trainer",
                    "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}],
                    "resources": {"limits": {"memory": "900Gi"}},
                    "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}},
                },
                {"name": "log-shipper", "image": "fluent-bit:3"},
            ],
        },
    }
    as_object = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels={"team": "llm"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="log-shipper", image="fluent-bit:3")]),
    )
    for given in (template, as_object):
        job = built(spec={"pod_template": given, "capabilities": ["IPC_LOCK"]})
        meta, pod = job["spec"]["template"]["metadata"], job["spec"]["template"]["spec"]
        assert meta["labels"]["team"] == "llm" and meta["labels"]["trainops.io/attempt"] == "2"
        assert [c["name"] for c in pod["containers"]] == ["trainer", "log-shipper"]
        assert pod["restartPolicy"] == "Never" and pod["subdomain"] == "train-x-a1"
    job = built(spec={"pod_template": template, "capabilities": ["IPC_LOCK"]})
    pod, container = job["spec"]["template"]["spec"], trainer(job)
    assert job["spec"]["template"]["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "ib-sriov"}
    assert pod["priorityClassName"] == "high"
    assert [t["key"] for t in pod["tolerations"]] == [MODE_TAINT, "nvidia.com/gpu"]
    assert env_of(job)["NCCL_SOCKET_IFNAME"]["value"] == "eth0"
    assert env_of(job)["TRAINOPS_RESUME_FROM"]["value"] == "s3://b/runs/r1/step-40/"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "memory": "900Gi"}
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK", "SYS_PTRACE"]
    assert container["image"] == "devcluster.trainops.io/local"


@pytest.mark.parametrize(
    "template, field",
    [
        (
            {"spec": {"containers": [{"name": "trainer", "image": "other:1"}]}},
            r"containers\[name=trainer\]\.image",
        ),
        (
            {
                "spec": {
                    "containers": [{"name": "trainer", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]
                }
            },
            r"requests\.nvidia\.com/gpu",
        ),
        (
            {"spec": {"containers": [{"name": "trainer", "env": [{"name": "MASTER_ADDR", "value": "x"}]}]}},
            "MASTER_ADDR",
        ),
        ({"spec": {"restartPolicy": "OnFailure"}}, r"spec\.restartPolicy"),
        ({"spec": {"nodeSelector": {"trainops.io/gpu-pool": "false"}}}, "gpu-pool"),
        (
            {
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}
                        }
                    }
                }
            },
            "nodeAffinity",
        ),
        (
            {"spec": {"volumes": [{"name": "dshm", "hostPath": {"path": "/dev/shm"}}]}},
            r"volumes\[name=dshm\]",
        ),
        ({"spec": {"subdomain": "mine"}}, "subdomain"),
        ({"spec": {"nodeName": "gpu-node-001"}}, "nodeName"),
        ({"spec": {"tolerations": [{"key": "trainops.io/mode", "value": "inference"}]}}, "trainops.io/mode"),
        ({"spec": {"tolerations": [{"operator": "Exists"}]}}, "every taint"),
        ({"metadata": {"labels": {"trainops.io/run": "other"}}}, "trainops.io/run"),
        ({"kind": "Pod", "spec": {}}, "kind"),
        ("spec: {}", "pod_template"),
    ],
)
def test_pod_template_conflicts_are_refused_naming_the_field(template, field):
    with pytest.raises(ValueError, match=field) as raised:
        spec(pod_template=template)
    assert "pod_template" in str(raised.value)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"master_port": 0}, "master_port"),
        ({"master_port": 70000}, "master_port"),
        ({"procs_per_node": 0}, "procs_per_node"),
        ({"shm_size": "lots"}, "shm_size"),
        ({"extra_resources": {"rdma ib": "1"}}, "extra_resources"),
        ({"extra_resources": {"rdma/ib": "one"}}, "extra_resources"),
        ({"capabilities": "IPC_LOCK"}, "capabilities"),
        ({"volumes": [{"emptyDir": {}}]}, "volumes"),
        ({"volume_mounts": [{"name": "data"}]}, "volume_mounts"),
        ({"node_selector": {"trainops.io/gpu-pool": "false"}}, "gpu-pool"),
        ({"env": {"WORLD_SIZE": "8"}}, "env"),
        ({"nodes": 3, "min_nodes": 4}, "min_nodes must be an integer from 1 to nodes \\(3\\), got 4"),
        ({"nodes": 3, "min_nodes": 0}, "min_nodes"),
        ({"nodes": 3, "min_nodes": "2"}, "min_nodes"),
        ({"elastic_wait_s": -1}, "elastic_wait_s"),
    ],
)
def test_bad_multi_node_fields_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        spec(**changes)


def test_gang_training_operator_hands_its_multi_node_parameters_to_the_job():
    from trainops.operators.training import GangTrainingOperator

    def operator(**changes):
        values = dict(
            task_id="train",
            image="registry.example/trainer:1",
            command=["torchrun", "train.py"],
            run_uri="s3://b/runs/r1/",
            nodes=2,
            procs_per_node=8,
            master_port=23456,
            shm_size="32Gi",
            extra_resources={"rdma/rdma_shared_device_a": 1},
            capabilities=["IPC_LOCK"],
            node_selector={"network.example/fabric": "ib"},
            volumes=[{"name": "data", "emptyDir": {}}],
            volume_mounts=[{"name": "data", "mountPath": "/data"}],
            pod_template={"metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"}}},
        )
        return GangTrainingOperator(**{**values, **changes})

    job = build_job(operator().spec(), name="j", dag_id="d", run_id="r", attempt=1, resume_from=None)
    template, container = job["spec"]["template"], trainer(job)
    assert env_of(job)["WORLD_SIZE"]["value"] == "16" and env_of(job)["MASTER_PORT"]["value"] == "23456"
    assert container["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in template["spec"][
        "volumes"
    ]
    assert template["spec"]["nodeSelector"]["network.example/fabric"] == "ib"
    assert template["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "rdma-net"}
    with pytest.raises(ValueError, match=r"pod_template\.spec\.restartPolicy"):
        operator(pod_template={"spec": {"restartPolicy": "Always"}}).spec()


def test_an_elastic_resume_asks_kueue_for_the_smaller_gang_and_tells_every_rank_its_world_size():
    """The same run on 2 of its 3 nodes: the Job's completions and parallelism (Kueue's PodSet count and
    so its quota and topology request), and the environment each rank rendezvouses with."""
    run = spec(
        nodes=3,
        min_nodes=2,
        procs_per_node=4,
        topology={"mode": "required", "level": "cloud.provider.com/topology-rack"},
    )
    job = build_job(
        run, name="j", dag_id="d", run_id="r", attempt=2, resume_from="s3://b/runs/r1/step-40/", nodes=2
    )
    env = env_of(job)

    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert env["TRAINOPS_WORLD_SIZE"]["value"] == env["PET_NNODES"]["value"] == "2"
    assert env["WORLD_SIZE"]["value"] == "8"  # 2 nodes x 4 processes
    assert env["TRAINOPS_RESUME_FROM"]["value"] == "s3://b/runs/r1/step-40/"
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"kueue.x-k8s.io/podset-required-topology": "cloud.provider.com/topology-rack"}
    full = build_job(run, name="j", dag_id="d", run_id="r", attempt=1, resume_from=None)
    assert full["spec"]["completions"] == 3 and env_of(full)["WORLD_SIZE"]["value"] == "12"


def test_gang_training_operator_hands_min_nodes_to_the_run_and_refuses_a_bad_one_naming_it():
    from trainops.operators.training import GangTrainingOperator

    def operator(**changes):
        values = dict(task_id="train", image="img", command=["train"], run_uri="s3://b/runs/r1/", nodes=3)
        return GangTrainingOperator(**{**values, **changes})

    assert operator(min_nodes=2, elastic_wait_s=30).spec().sizing.elastic
    assert operator(min_nodes=2, elastic_wait_s=30).spec().sizing.wait_s == 30
    assert not operator().spec().sizing.elastic  # off unless asked for
    with pytest.raises(ValueError, match="min_nodes must be an integer from 1 to nodes"):
        operator(min_nodes=5).spec()


def test_every_attempt_tells_the_trainer_the_run_s_original_size_so_an_elastic_resume_keeps_its_global_batch():
    """TRAINOPS_ORIGINAL_NODES / TRAINOPS_ORIGINAL_WORLD_SIZE are the run's own size on every attempt
    (the same as the current size on a full one); the helper turns them into the accumulation steps."""
    from trainops.checkpoints.helper import elastic_world

    run = spec(nodes=4, min_nodes=2, procs_per_node=2)
    full = build_job(run, name="j", dag_id="d", run_id="r", attempt=1, resume_from=None)
    smaller = build_job(
        run, name="j", dag_id="d", run_id="r", attempt=2, resume_from="s3://b/runs/r1/step-40/", nodes=2
    )
    for job, nodes in ((full, "4"), (smaller, "2")):
        env = {k: v["value"] for k, v in env_of(job).items() if "value" in v}
        assert env["TRAINOPS_ORIGINAL_NODES"] == "4" and env["TRAINOPS_ORIGINAL_WORLD_SIZE"] == "8"
        assert env["TRAINOPS_WORLD_SIZE"] == nodes
        world = elastic_world({**env, "RANK": "3"})  # torchrun sets RANK in each worker
        assert world.accumulation_steps == 8 // int(env["WORLD_SIZE"]) and world.resized == (nodes == "2")
    with pytest.raises(ValueError, match="TRAINOPS_ORIGINAL_NODES"):
        spec(nodes=4, env={"TRAINOPS_ORIGINAL_NODES": "2"})  # trainops sets it
