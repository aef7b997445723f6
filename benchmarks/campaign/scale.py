"""The campaign's training faults carried to a realistic scale: a projection from the measured runs, labelled so.

The campaign's runs are short (100 steps, a checkpoint every 24 production seconds) and every seeded run
draws a fault, so what a fault costs is mostly its timers (detection, the retry, the restart) and little is
work done again. A real job is long, checkpoints every half hour or so and fails at a rate. Here each
policy's measured cost of each training fault is carried to a job of ``GPUS`` GPUs:

- its failures: Llama 3's rate, one per ~50.7K GPU-hours (``LLAMA3_GPU_HOURS_PER_FAILURE``), so one every
  ``M`` = that / ``GPUS`` hours, split over the campaign's kinds by Llama 3's causes (``MIX``, arXiv:2407.21783
  §3.3.4 table 5, as ``shared/reference/resilience.md`` lists them; the 26 of 419 it maps to no kind, silent
  data corruption among them, are left out);
- its checkpoints: a blocking save of ``SAVE_S`` (``resilience.md``'s C for a sync save) every Young–Daly
  interval ``daly_interval(SAVE_S, M)``, the same for both policies;
- each failure of a kind costs a policy the time its GPUs stood still in the campaign's runs of that kind (the
  GPU-seconds lost but not to steps done again or to the spare, per gang GPU, times the time scale: assumed
  not to grow with the job, which favours neither policy), plus the share of a checkpoint interval it did
  again (the steps it did again over the campaign's ``CHECKPOINT_EVERY``: counted in steps, since a step's
  wall time here is noise that the interval at scale would multiply; the campaign strikes mid-interval,
  where a fault at a random time lands on average) times the interval at scale.

A policy's GPU-hours lost per 1,000 held is then ``1000 x sum(rate of kind x its cost)``; every input is in
the JSON's ``per_run`` and ``at_scale``.
"""

from __future__ import annotations

import statistics

from benchmarks.campaign.steps import CHECKPOINT_EVERY, GANG
from trainops.checkpoints.interval import LLAMA3_GPU_HOURS_PER_FAILURE, daly_interval

GPUS = 4096  # the job the projection is for (512 nodes of 8)
SAVE_S = 30.0  # a blocking save (resilience.md: the Young-Daly examples' C; async DCP blocks under a second)
# Llama 3's unexpected interruptions by cause, mapped onto the campaign's training faults by what the node shows
MIX = {
    "xid": 148 + 19 + 17,  # faulty GPU, GPU SRAM, GPU system processor: a fatal XID
    "ecc": 72,  # HBM3 memory: an uncorrectable ECC error
    "ib-down": 35 + 7,  # network switch or cable, NIC: the link goes down
    "node-notready": 32 + 2,  # host maintenance, CPU: the node goes away
    "pod-crash": 54,  # software bug: the trainer crashes
    "hang": 7,  # NCCL watchdog timeouts: the collective hangs
}
LLAMA3_UNEXPECTED = 419
NOT_STILL = ("recomputed", "spare")  # the causes that are not the gang standing still


def at_scale(per_run: list[dict], scale: float) -> dict | None:
    """The projection from the seeded runs' entries (``per_run``) at ``scale`` production seconds per campaign
    second; None when a kind of ``MIX`` has no run with both policies measured."""
    mtbf_h = LLAMA3_GPU_HOURS_PER_FAILURE / GPUS
    interval_s = daly_interval(SAVE_S, mtbf_h * 3600)
    gang_gpus = GANG * 8
    kinds, lost = {}, {"trainops": 0.0, "baseline": 0.0}
    for kind, count in MIX.items():
        runs = [
            r
            for r in per_run
            if r["fault"] == kind and r["landed"] and not r["violations"] and r.get("baseline")
        ]
        if not runs:
            return None
        rate_per_h = count / sum(MIX.values()) / mtbf_h
        row = {"runs": len(runs), "llama3_count": count, "per_hour": round(rate_per_h, 5)}
        for policy in lost:
            causes = [r[policy]["lost_by_cause_gpu_s"] for r in runs]
            still_s = (
                statistics.mean(sum(v for cause, v in c.items() if cause not in NOT_STILL) for c in causes)
                / gang_gpus
                * scale
            )
            redone = statistics.mean(r[policy]["redone_steps"] for r in runs) / CHECKPOINT_EVERY
            cost_s = still_s + redone * interval_s
            row[policy] = {
                "still_s": round(still_s, 1),
                "intervals_redone": round(redone, 3),
                "cost_s": round(cost_s, 1),
            }
            lost[policy] += rate_per_h * cost_s / 3600
        row["ratio"] = round(row["trainops"]["cost_s"] / row["baseline"]["cost_s"], 3)
        kinds[kind] = row
    return {
        "gpus": GPUS,
        "mtbf_h": round(mtbf_h, 2),
        "save_s": SAVE_S,
        "interval_s": round(interval_s, 1),
        "modelled": f"{sum(MIX.values())} of Llama 3's {LLAMA3_UNEXPECTED} unexpected interruptions",
        "by_kind": kinds,
        "lost_per_1000": {policy: round(1000 * value, 2) for policy, value in lost.items()},
        "ratio": round(lost["trainops"] / lost["baseline"], 3),
    }
