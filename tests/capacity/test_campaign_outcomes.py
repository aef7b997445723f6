"""Each fault's outcome check fails on the outcome it is there to catch (plain data: the run as the
checks read it), and holds on the good one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.campaign.outcomes import check
from benchmarks.campaign.strike import Strike
from benchmarks.campaign.timing import Timing
from trainops.conventions import QUARANTINE_EVIDENCE_ANNOTATION, QUARANTINE_TAINT
from trainops.training.ledger import Attempt, End, Verdict

RUN = "s3://campaign/runs/run-1/"
NODE = "gpu-3"


class Store:
    def __init__(self, nodes: dict[str, dict]) -> None:
        self.nodes = nodes

    def find(self, resource: str, namespace: str, name: str) -> dict | None:
        return self.nodes.get(name)


def quarantined(evidence: str) -> dict:
    return {
        "metadata": {"annotations": {QUARANTINE_EVIDENCE_ANNOTATION: evidence}},
        "spec": {"taints": [{"key": QUARANTINE_TAINT, "effect": "NoSchedule"}]},
    }


def run(fault: str, attempts: list[Attempt], *, node: dict | None = None, said=(), torn: str = ""):
    struck = Strike(fault, at=100.0, step=52, node=NODE, torn=torn)
    return SimpleNamespace(
        fault=fault,
        struck=struck,
        cluster=SimpleNamespace(store=Store({NODE: node or {"metadata": {}, "spec": {}}})),
        ledger=SimpleNamespace(attempts=attempts),
        result=SimpleNamespace(outcome="succeeded"),
        said=SimpleNamespace(lines=list(said)),
        timing=Timing(),
    )


def attempts(*, kept_out=None, resume=f"{RUN}step-40/", end: End | None = None) -> list[Attempt]:
    return [
        Attempt(1, "a1", end=end),
        Attempt(2, "a2", resume_from=resume, kept_out=kept_out or {}),
    ]


def killed_return(returned_after: float | None):
    """A return killed at 100.0 holding a node; given back ``returned_after`` seconds later (None: never)."""
    timing = Timing()
    return SimpleNamespace(
        fault="sigkill-return",
        held_at_kill=[NODE, "quota"],
        killed={"return": 100.0},
        returned_at=None if returned_after is None else 100.0 + returned_after,
        retried_after=lambda: timing.task_heartbeat_timeout_s + timing.retry_delay_s,
        ledger=SimpleNamespace(attempts=[]),
    )


TORN = f"{RUN}step-40/"
SKIPPED = f"skipped newer checkpoint {TORN}: rank-1.bin is 4 bytes, the manifest says 4096"
CASES = {
    "xid: quarantined, kept out": (
        run("xid", attempts(kept_out={NODE: "xid 79"}), node=quarantined("xid 79 on gpu 2")),
        [],
    ),
    "xid: not quarantined": (
        run("xid", attempts(kept_out={NODE: "xid 79"})),
        [f"{NODE} is quarantined with evidence naming 'xid'"],
    ),
    "xid: quarantined, but attempt 2 ran on it": (
        run("xid", attempts(), node=quarantined("xid 79")),
        [f"attempt 2 kept {NODE} out"],
    ),
    "xid: never resumed": (
        run("xid", attempts()[:1], node=quarantined("xid 79")),
        ["the run resumed (1 attempt(s))"],
    ),
    "pod-crash: resumed from before the crash": (run("pod-crash", attempts()), []),
    "pod-crash: its node blamed": (
        run("pod-crash", attempts(), node=quarantined("pod crash")),
        [f"{NODE} is not quarantined: nothing blames it"],
    ),
    "pod-crash: resumed from after the crash": (
        run("pod-crash", attempts(resume=f"{RUN}step-60/")),
        ["attempt 2 resumed from a checkpoint before the crash"],
    ),
    "torn: skipped with its reason": (
        run("torn-checkpoint", attempts(resume=f"{RUN}step-20/"), said=[SKIPPED], torn=TORN),
        [],
    ),
    "torn: resumed from the torn one, silently": (
        run("torn-checkpoint", attempts(resume=TORN), torn=TORN),
        [
            f"the resume skipped {TORN} and said why",
            "attempt 2 resumed from an older checkpoint",
            f"no Job resumed from {TORN}",
        ],
    ),
    "hang: seen before NCCL's watchdog": (
        run("hang", attempts(end=End("hang", Verdict.RESUME, "no heartbeat", at=105.0))),
        [],
    ),
    "sigkill-return: the teardown's retry returned it": (killed_return(6.0), []),
    "sigkill-return: nothing returned it": (
        killed_return(None),
        ["the teardown's retry returned what the killed return held"],
    ),
    "sigkill-return: returned long after Airflow's retry": (
        killed_return(60.0),
        ["once Airflow retried it: 60.0 s"],
    ),
    "hang: seen only when NCCL aborted the ranks": (
        run("hang", attempts(end=End("crash", Verdict.RESUME, "exit 134", at=110.5))),
        ["trainops judged attempt 1 hung", "the hang was seen 10.5 s after it began"],
    ),
}


def seen(faulted) -> SimpleNamespace:
    """What the store listener saw: the Jobs of the run's attempts."""
    return SimpleNamespace(jobs=[SimpleNamespace(resume_from=a.resume_from) for a in faulted.ledger.attempts])


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_outcome_check_fails_on_the_outcome_it_catches_and_holds_on_the_good_one(case):
    faulted, expected = CASES[case]

    landed, checked, failures = check(faulted, seen(faulted))

    assert landed and checked
    assert len(failures) == len(expected), failures
    for failure, start in zip(failures, expected, strict=True):
        assert failure.startswith(start), (failure, start)
