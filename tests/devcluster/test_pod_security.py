"""Pod Security Admission in the devcluster, as kube-apiserver's PodSecurity plugin enforces it: the
levels' checks and wording, a refused pod, and a Job whose pods are refused (the Job controller's
FailedCreate events, the Job's status as the real controller leaves it)."""

from __future__ import annotations

import json

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from trainops_devcluster.pod_security import violations

from tests.devcluster.ctrl_support import wait_for

SAFE = {
    "containers": [{"name": "trainer", "image": "train:1"}],
    "volumes": [{"name": "dshm", "emptyDir": {}}],
}
RESTRICTED_OK = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [
        {
            "name": "trainer",
            "image": "train:1",
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }
    ],
}


def container(**security) -> dict:
    return {"containers": [{"name": "trainer", "image": "train:1", "securityContext": security}]}


@pytest.mark.parametrize(
    ("spec", "baseline", "restricted"),
    [
        (SAFE, "", None),
        (RESTRICTED_OK, "", ""),
        (
            container(capabilities={"add": ["IPC_LOCK"]}),
            'non-default capabilities (container "trainer" must not include "IPC_LOCK" in '
            "securityContext.capabilities.add)",
            None,
        ),
        (
            {**SAFE, "volumes": [{"name": "infiniband", "hostPath": {"path": "/sys/class/infiniband"}}]},
            'hostPath volumes (volume "infiniband")',
            None,
        ),
        (
            container(privileged=True),
            'privileged (container "trainer" must not set securityContext.privileged=true)',
            None,
        ),
        ({**SAFE, "hostNetwork": True, "hostIPC": True}, "host namespaces (hostIPC, hostNetwork)", None),
        (
            {
                "containers": [
                    {"name": "trainer", "image": "t", "ports": [{"containerPort": 29500, "hostPort": 29500}]}
                ]
            },
            'hostPort (container "trainer" uses hostPort 29500)',
            None,
        ),
        (
            container(seccompProfile={"type": "Unconfined"}),
            'seccompProfile (container "trainer" must not set securityContext.seccompProfile.type to "Unconfined")',
            None,
        ),
    ],
)
def test_levels_check_what_kube_apiserver_checks_in_its_words(spec, baseline, restricted):
    assert violations("privileged", {}, spec) == ""
    assert violations("baseline", {}, spec) == baseline
    if restricted is not None:
        assert violations("restricted", {}, spec) == restricted


def test_restricted_names_every_missing_setting_in_order():
    assert violations("restricted", {}, SAFE) == (
        'allowPrivilegeEscalation != false (container "trainer" must set securityContext.allowPrivilegeEscalation=false), '
        'unrestricted capabilities (container "trainer" must set securityContext.capabilities.drop=["ALL"]), '
        'runAsNonRoot != true (pod or container "trainer" must set securityContext.runAsNonRoot=true), '
        'seccompProfile (pod or container "trainer" must set securityContext.seccompProfile.type to "RuntimeDefault" '
        'or "Localhost")'
    )


def test_restricted_names_who_set_a_forbidden_value():
    spec = {
        **RESTRICTED_OK,
        "securityContext": {"runAsNonRoot": False, "seccompProfile": {"type": "Unconfined"}},
    }
    assert violations("restricted", {}, spec) == (
        "runAsNonRoot != true (pod must not set securityContext.runAsNonRoot=false), "
        'seccompProfile (pod must not set securityContext.seccompProfile.type to "Unconfined")'
    )


def job(name: str, pod_spec: dict) -> dict:
    template = {"spec": {**pod_spec, "restartPolicy": "Never"}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"template": template},
    }


def test_a_pod_and_a_jobs_pods_that_violate_the_namespaces_level_are_refused(make_devcluster):
    """The devcluster's ``training`` namespace enforces baseline (deploy/namespaces.yaml)."""
    cluster = make_devcluster(nodes=2)
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    rdma = container(capabilities={"add": ["IPC_LOCK"]})
    violation = (
        'violates PodSecurity "baseline:latest": non-default capabilities (container "trainer" must not '
        'include "IPC_LOCK" in securityContext.capabilities.add)'
    )
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("training", {"metadata": {"name": "rdma"}, "spec": rdma})
    answer = json.loads(refused.value.body)
    assert (refused.value.status, answer["reason"]) == (403, "Forbidden")
    assert answer["message"] == f'pods "rdma" is forbidden: {violation}'

    _, _, headers = batch.create_namespaced_job_with_http_info("training", job("rdma", rdma))
    warning = "would " + violation.replace("violates", "violate")
    assert headers["Warning"] == '299 - "' + warning.replace('"', '\\"') + '"'  # as HTTP quotes it

    def failed_create():
        events = core.list_namespaced_event("training", field_selector="involvedObject.name=rdma").items
        return [e for e in events if e.reason == "FailedCreate"]

    event = wait_for(failed_create, "the Job controller's FailedCreate")[0]
    assert event.type == "Warning" and event.source.component == "job-controller"
    assert event.message.startswith('Error creating: pods "rdma-') and event.message.endswith(
        f" is forbidden: {violation}"
    )
    status = batch.read_namespaced_job_status("rdma", "training").status
    assert status.start_time is not None and status.active == 0 and not status.conditions
    assert core.list_namespaced_pod("training", label_selector="job-name=rdma").items == []

    batch.create_namespaced_job("training", job("plain", SAFE))
    wait_for(lambda: core.list_namespaced_pod("training", label_selector="job-name=plain").items, "its pod")
