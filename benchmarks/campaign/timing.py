"""The production intervals the campaign's policies run with, scaled by one stated factor.

The campaign compresses time: its trainer takes 0.02 s a step and its node probe publishes every second
where a real one publishes every 60 s.  Every interval that decides how long a failure costs (how soon it
is seen, when a try is retried) is its production default
divided by ``scale`` (production seconds per campaign second, 60 by default: the probe's own ratio), so
that both policies keep their real proportions.  ``tests/capacity/test_campaign_timing.py`` checks each
production value against the code or the configuration it comes from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Production defaults, seconds, and where each comes from.
PRODUCTION = {
    "nccl_timeout_s": 600.0,  # torch ProcessGroupNCCL's collective timeout (kProcessGroupNCCLDefaultTimeout)
    # training_lifecycle(retry_delay=5 s): every trainops task's retry delay, and the baseline task's (a skilled
    # user sets it as the lifecycle DAG does, not Airflow's 300 s default; bench_training keeps them equal too)
    "retry_delay_s": 5.0,
    "task_heartbeat_timeout_s": 300.0,  # Airflow [scheduler] task_instance_heartbeat_timeout: a dead worker seen
    "triggerer_health_check_s": 30.0,  # Airflow [triggerer] triggerer_health_check_threshold: a dead triggerer's
    # triggers go to another triggerer
    "job_poll_interval_s": 10.0,  # KubernetesJobOperator(job_poll_interval=10)
    "evidence_wait_s": 150.0,  # GangTrainingOperator(evidence_wait_s=150): two node-probe rounds and a margin
    "node_probe_s": 60.0,  # the node probe DaemonSet publishes every 60 s (the devcluster's every 1 s)
    "termination_grace_s": 30.0,  # a stopped pod's terminationGracePeriodSeconds (Kubernetes' and trainops' default)
    "save_timeout_s": 1800.0,  # HangPolicy.save_timeout: how long a save may keep the heartbeat silent
    "hang_floor_s": 30.0,  # HangPolicy.floor: the least silence called a hang
    "startup_timeout_s": 600.0,  # HangPolicy.startup_timeout: from pods running to the first heartbeat
}
# Kept above their scaled values on a shared, noisy machine, and said so in the report: each only makes
# trainops slower to call a hang (0.5 s and 10 s at 1/60 would call a trainer the machine stalled hung).
KEPT = {"hang_floor_s": 3.0, "startup_timeout_s": 30.0}


@dataclass(frozen=True)
class Timing:
    """Campaign seconds for each production interval at ``scale`` production seconds per campaign second."""

    scale: float = 60.0

    def __post_init__(self) -> None:
        if not self.scale >= 1:
            raise ValueError(
                f"scale must be >= 1 (production seconds per campaign second), got {self.scale!r}"
            )

    def __getattr__(self, name: str) -> float:
        if name in KEPT:
            return KEPT[name]
        if name in PRODUCTION:
            return PRODUCTION[name] / self.scale
        raise AttributeError(name)

    def to_dict(self) -> dict:
        """What the report records: the scale, and each interval in production and campaign seconds."""
        return {
            **asdict(self),
            "intervals": {
                name: {
                    "production_s": value,
                    "campaign_s": round(getattr(self, name), 3),
                    "kept": name in KEPT,
                }
                for name, value in PRODUCTION.items()
            },
        }
