"""The campaign's production intervals are the ones the code and the configuration it names use."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from benchmarks.campaign.timing import PRODUCTION, Timing

REPO = Path(__file__).resolve().parents[2]


def probe_interval() -> float:
    documents = yaml.safe_load_all((REPO / "deploy" / "node-probe.yaml").read_text())
    (daemonset,) = [d for d in documents if d and d["kind"] == "DaemonSet"]
    args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    return float(args[args.index("--interval") + 1])


def airflow_default(section: str, key: str) -> float:
    from airflow.configuration import conf

    return float(conf.get_default_value(section, key))


def job_poll_interval() -> float:
    from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator

    return inspect.signature(KubernetesJobOperator.__init__).parameters["job_poll_interval"].default


def lifecycle_retry_delay() -> float:
    from trainops.operators.lifecycle.dag import training_lifecycle

    return inspect.signature(training_lifecycle).parameters["retry_delay"].default.total_seconds()


def evidence_wait() -> float:
    from trainops.operators.training import EVIDENCE_WAIT_S

    return EVIDENCE_WAIT_S


def hang_policy(field: str):
    from trainops.training.progress import HangPolicy

    return lambda: getattr(HangPolicy(), field)


def termination_grace() -> float:
    from trainops.training.spec import TrainingSpec

    return TrainingSpec.__dataclass_fields__["termination_grace_seconds"].default


SOURCES = {
    "termination_grace_s": termination_grace,
    "save_timeout_s": hang_policy("save_timeout"),
    "hang_floor_s": hang_policy("floor"),
    "startup_timeout_s": hang_policy("startup_timeout"),
    "task_heartbeat_timeout_s": lambda: airflow_default("scheduler", "task_instance_heartbeat_timeout"),
    "triggerer_health_check_s": lambda: airflow_default("triggerer", "triggerer_health_check_threshold"),
    "job_poll_interval_s": job_poll_interval,
    "retry_delay_s": lifecycle_retry_delay,
    "evidence_wait_s": evidence_wait,
    "node_probe_s": probe_interval,
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_production_interval_is_the_one_its_source_uses(name, airflow_db):
    assert SOURCES[name]() == PRODUCTION[name]


def test_every_interval_but_nccls_is_checked_against_its_source():
    # NCCL's 10 minutes is ProcessGroupNCCL's C++ default; a CPU-only torch does not expose it
    assert set(PRODUCTION) - set(SOURCES) == {"nccl_timeout_s"}


def test_the_scale_divides_every_interval_and_is_recorded():
    timing = Timing(scale=60)
    assert (
        timing.nccl_timeout_s == 10
        and timing.retry_delay_s == 5 / 60
        and timing.job_poll_interval_s == 10 / 60
    )
    recorded = timing.to_dict()
    assert recorded["scale"] == 60
    assert recorded["intervals"]["nccl_timeout_s"] == {
        "production_s": 600.0,
        "campaign_s": 10.0,
        "kept": False,
    }
    assert recorded["intervals"]["hang_floor_s"] == {"production_s": 30.0, "campaign_s": 3.0, "kept": True}
    with pytest.raises(ValueError, match="scale"):
        Timing(scale=0.5)
