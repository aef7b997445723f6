"""Each fault's own outcome: did it land, and did the lifecycle do with it what it is for.

``check(run, seen)`` returns ``(landed, checked, failures)``: whether the fault did what it is for (a run
where it did not is counted apart, never as coverage), what was checked, and each check that failed.
A fault that landed and whose checks all hold is covered.  The checks read what a user would: the node
(its quarantine taint and evidence), the run's attempts as the cluster records them (the ledger on the
Jobs: who was kept out, where each resumed from, how each ended), the task's log, the API's answers.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.campaign import faults as kinds
from benchmarks.campaign.steps import GANG
from benchmarks.campaign.strike import AT_STEP
from trainops.conventions import QUARANTINE_EVIDENCE_ANNOTATION, QUARANTINE_TAINT

# what a quarantined node's evidence must name, per node fault
EVIDENCE = {
    "xid": "xid",
    "ecc": "ecc",
    "ib-down": "ib_state",
    "node-notready": "ready",
    "nvlink": "nvlink",
    "slow-gpu": "",
}


class Checks:
    def __init__(self) -> None:
        self.landed, self.checked, self.failures = True, [], []

    def that(self, ok: object, what: str) -> None:
        self.checked.append(what)
        if not ok:
            self.failures.append(what)

    def landed_if(self, ok: object, why_not: str) -> bool:
        if not ok:
            self.landed = False
            self.failures.append(f"did not land: {why_not}")
        return bool(ok)


def check(run, seen) -> tuple[bool, list[str], list[str]]:
    """``(landed, checked, failures)``; a fault that did not land has one "failure": why it did not."""
    checks = Checks()
    CHECKS[run.fault](run, seen, checks)
    if not checks.landed:  # what a fault that did not land "fails" is not a finding: said apart
        return False, checks.checked, [f for f in checks.failures if f.startswith("did not land")]
    return True, checks.checked, checks.failures


# ---- helpers -------------------------------------------------------------------------------------
def succeeded(run, checks: Checks, attempts: int | None = None) -> None:
    checks.that(run.result.outcome == "succeeded", f"the run succeeded ({run.result.outcome[:120]})")
    if attempts is not None:
        found = len(run.ledger.attempts)
        checks.that(found == attempts, f"{attempts} attempt(s), no needless resume (found {found})")


def node(run, name: str) -> dict:
    return run.cluster.store.find("nodes", "", name) or {}


def quarantined_with(run, name: str, word: str) -> str | None:
    """The node's quarantine evidence when it is quarantined and the evidence names ``word`` (else None)."""
    obj = node(run, name)
    tainted = any(t.get("key") == QUARANTINE_TAINT for t in obj.get("spec", {}).get("taints") or [])
    evidence = (obj.get("metadata", {}).get("annotations") or {}).get(QUARANTINE_EVIDENCE_ANNOTATION, "")
    return evidence if tainted and word in evidence.lower() else None


def audited(run, window: tuple[float, float] | None, statuses: tuple[int, ...], path: str) -> int:
    """API answers with ``statuses`` on ``path`` within ``window``."""
    if window is None:
        return 0
    start, end = window
    return sum(
        1
        for e in run.cluster.server.audit.entries()
        if e["status"] in statuses and path in e["path"] and start <= e["time"] <= (end or e["time"])
    )


def struck_landed(run, checks: Checks) -> bool:
    """The training strike found a running attempt and hit it."""
    struck = run.struck
    return checks.landed_if(
        struck and struck.landed, (struck and struck.note) or "no running attempt was struck"
    )


def resumed_after(run, checks: Checks) -> object:
    """The attempt after the struck one (None: there is none)."""
    attempts = run.ledger.attempts
    checks.that(len(attempts) >= 2, f"the run resumed ({len(attempts)} attempt(s))")
    return attempts[1] if len(attempts) >= 2 else None


# ---- per kind ------------------------------------------------------------------------------------
def none(run, seen, checks: Checks) -> None:
    succeeded(run, checks, attempts=1)


def gate_fault(run, seen, checks: Checks) -> None:
    target = run.plan.target
    judged = next((n for n in run.gated.nodes if n.name == target), None) if run.gated else None
    if not checks.landed_if(judged is not None, f"the gate did not judge {target}"):
        return
    checks.that(target not in run.chosen, f"the gate kept {target} out ({judged.verdict}: {judged.reasons})")
    checks.that(target not in run.step.nodes, f"the run did not claim {target}")
    named = " ".join(judged.reasons).lower()
    if run.fault == "nvlink":
        checks.that(
            "nvlink" in named and "last seen" in named,
            f"its evidence names the burst and when: {judged.reasons}",
        )
    else:
        checks.that(judged.reasons, f"its evidence says why: {judged.reasons}")
    succeeded(run, checks, attempts=1)


def api_burst(run, seen, checks: Checks) -> None:
    answered = audited(run, run.burst, (429, 503, 500), "/")
    if checks.landed_if(answered, "no injected 429/5xx was answered during the claim"):
        checks.that(
            len(run.step.nodes) == GANG + 1, f"the claim took {GANG + 1} nodes after {answered} errors"
        )
        succeeded(run, checks, attempts=1)


def killed_mid_claim(run, seen, checks: Checks) -> None:
    failed = [f for f in run.claim_failures if "500" in f or "Internal" in f]
    if checks.landed_if(failed, f"no claim try failed on the 500 ({run.claim_failures})"):
        checks.that(len(run.step.nodes) == GANG + 1, "the retried claim took the nodes")
        succeeded(run, checks, attempts=1)


def rival_writer(run, seen, checks: Checks) -> None:
    conflicts = audited(run, run.burst, (409,), "/api/v1/nodes/")
    if checks.landed_if(conflicts, "the rival writer caused no 409 on the claim's node writes"):
        checks.that(
            len(run.step.nodes) == GANG + 1, f"the claim took {GANG + 1} nodes through {conflicts} conflicts"
        )
        succeeded(run, checks, attempts=1)


def race(run, seen, checks: Checks) -> None:
    if checks.landed_if(run.rival_outcome, "the rival never claimed"):
        if run.rival_outcome.startswith("won"):
            checks.that(
                any("held by" in f or "NodesHeld" in f or "holds" in f for f in run.claim_failures)
                or not set(run.step.nodes) & set(run.rival_nodes),
                f"the run waited for the rival or took other nodes (rival {run.rival_outcome})",
            )
        succeeded(run, checks, attempts=1)


def quarantined_candidate(run, seen, checks: Checks) -> None:
    (culprit,) = run.faulted or {""}
    if checks.landed_if(culprit in run.chosen, f"{culprit} was not among the gate's choice {run.chosen}"):
        checks.that(
            any("quarantined" in f for f in run.claim_failures), "the claim refused the quarantined node"
        )
        checks.that(culprit not in run.step.nodes, f"the run did not claim {culprit}")
        succeeded(run, checks, attempts=1)


def sigkill_claim(run, seen, checks: Checks) -> None:
    held = run.held_at_kill
    if checks.landed_if(held, "the claim was killed holding no node"):
        nodes = [n for n in held if n != "quota"]
        checks.that(set(nodes) <= set(run.step.nodes), f"the next try finished the same claim ({nodes} kept)")
        succeeded(run, checks, attempts=1)


def node_fault(run, seen, checks: Checks) -> None:
    struck = run.struck
    if not struck_landed(run, checks):
        return
    evidence = quarantined_with(run, struck.node, EVIDENCE[run.fault])
    checks.that(
        evidence, f"{struck.node} is quarantined with evidence naming {EVIDENCE[run.fault]!r}: {evidence}"
    )
    after = resumed_after(run, checks)
    if after is not None:
        checks.that(
            struck.node in after.kept_out, f"attempt 2 kept {struck.node} out: {dict(after.kept_out)}"
        )
    succeeded(run, checks)


def pod_crash(run, seen, checks: Checks) -> None:
    struck = run.struck
    if not struck_landed(run, checks):
        return
    checks.that(
        not quarantined_with(run, struck.node, ""), f"{struck.node} is not quarantined: nothing blames it"
    )
    after = resumed_after(run, checks)
    if after is not None:
        checks.that(
            after.resume_step is not None and after.resume_step <= struck.step,
            f"attempt 2 resumed from a checkpoint before the crash ({after.resume_from})",
        )
    succeeded(run, checks)


def hang(run, seen, checks: Checks) -> None:
    struck = run.struck
    if not struck_landed(run, checks):
        return
    first = run.ledger.attempts[0]
    end = first.end
    checks.that(
        end is not None and end.kind == "hang", f"trainops judged attempt 1 hung ({end and end.kind})"
    )
    if end is not None and end.at is not None:
        seen_after = end.at - struck.at
        checks.that(
            seen_after < run.timing.nccl_timeout_s,
            f"the hang was seen {seen_after:.1f} s after it began, before NCCL's watchdog ({run.timing.nccl_timeout_s:g} s)",
        )
    resumed_after(run, checks)
    succeeded(run, checks)


def torn_checkpoint(run, seen, checks: Checks) -> None:
    struck = run.struck
    if not checks.landed_if(struck and struck.torn, (struck and struck.note) or "nothing was torn"):
        return
    torn = struck.torn
    skipped = [line for line in run.said.lines if line.startswith(f"skipped newer checkpoint {torn}:")]
    checks.that(skipped, f"the resume skipped {torn} and said why")
    after = resumed_after(run, checks)
    if after is not None:
        checks.that(
            after.resume_from
            and after.resume_from != torn
            and after.resume_step < int(torn.rstrip("/").rpartition("-")[2]),
            f"attempt 2 resumed from an older checkpoint ({after.resume_from}), not {torn}",
        )
    checks.that(not any(j.resume_from == torn for j in seen.jobs), f"no Job resumed from {torn}")
    succeeded(run, checks)


def api_burst_train(run, seen, checks: Checks) -> None:
    answered = audited(run, run.burst, (429, 503, 500), "/")
    if checks.landed_if(answered, "no injected 429/5xx was answered while training"):
        succeeded(run, checks, attempts=1)


def drop_watches(run, seen, checks: Checks) -> None:
    if checks.landed_if(
        run.struck and run.struck.at, "no attempt was running past step 50 to drop watches under"
    ):
        succeeded(run, checks, attempts=1)


def s3_errors(run, seen, checks: Checks) -> None:
    injected = run.world.s3_errors.injected
    if checks.landed_if(injected, "no S3 request was answered 503"):
        run.result.notes.append(f"{injected} S3 requests answered 503")
        succeeded(run, checks, attempts=1)


def sigkill_train(run, seen, checks: Checks) -> None:
    if checks.landed_if(
        run.step_at_kill >= AT_STEP, f"the worker died at step {run.step_at_kill}, before {AT_STEP}"
    ):
        # the Job trained on without its worker: the next try took it over, no resume needed
        succeeded(run, checks, attempts=1)


def clear(run, seen, checks: Checks) -> None:
    attempts = run.ledger.attempts
    stopped = attempts[0].end if attempts else None
    live = run.cleared_at is not None and stopped is not None and stopped.kind == "stopped"
    if not checks.landed_if(live, f"the Clear found no attempt running ({stopped and stopped.kind})"):
        return
    after = resumed_after(run, checks)
    if after is not None:
        fresh = after.spent
        checks.that(
            after.began_by_try == run.cleared_try + 1
            and fresh is not None
            and fresh.since_try == run.cleared_try + 1,
            f"attempt 2 was begun by try {after.began_by_try} with a budget since try {fresh and fresh.since_try}",
        )
        checks.that(fresh is not None and fresh.resumes == 0, f"a fresh budget: {fresh}")
    succeeded(run, checks)


def sigkill_return(run, seen, checks: Checks) -> None:
    if not checks.landed_if(run.held_at_kill, "the return was killed holding nothing"):
        return
    checks.that(run.returned_at is not None, "the teardown's retry returned what the killed return held")
    if run.returned_at is not None:
        bound = run.retried_after() + 30
        took = run.returned_at - run.killed["return"]
        checks.that(took <= bound, f"once Airflow retried it: {took:.1f} s <= {bound:.1f} s after the kill")


CHECKS: dict[str, Callable] = {
    "none": none,
    **dict.fromkeys(kinds.GATE, gate_fault),
    "api-burst": api_burst,
    "killed-mid-claim": killed_mid_claim,
    "rival-writer": rival_writer,
    "race": race,
    "quarantined-candidate": quarantined_candidate,
    "sigkill-claim": sigkill_claim,
    **dict.fromkeys(kinds.TRAIN_NODE, node_fault),
    "pod-crash": pod_crash,
    "hang": hang,
    "torn-checkpoint": torn_checkpoint,
    "api-burst-train": api_burst_train,
    "drop-watches": drop_watches,
    "s3-errors": s3_errors,
    "sigkill-train": sigkill_train,
    "clear": clear,
    "sigkill-return": sigkill_return,
}
