"""The campaign's result as text: the terminal table, and the README's section and benchmark row.

The README's numbers are written from ``benchmarks/campaign.json`` only (``make campaign`` does it;
``python -m benchmarks.campaign.readme`` again from the JSON): between ``BEGIN`` and ``END``, and the
benchmark table's row that starts with ``ROW``.  ``disagreements`` says where the README, the JSON
and the code's fault kinds differ (``tests/capacity/test_campaign_fresh.py``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BEGIN = "<!-- campaign:begin (written by `make campaign` from benchmarks/campaign.json) -->"
END = "<!-- campaign:end -->"
ROW = "| fault campaign (`make campaign`)"


def lost(row: dict, policy: str) -> str:
    value = (row.get(policy) or {}).get("lost_per_1000")
    return "–" if value is None else f"{value:g}"


def table_rows(result: dict) -> list[str]:
    coverage = result["coverage"]
    lines = [
        "| faults | runs | landed / covered | trainops | baseline | lost GPU-h, trainops / baseline | goal |",
        "|---|---|---|---|---|---|---|",
    ]

    def line(name: str, row: dict, landed: str) -> str:
        ratio = row.get("ratio")
        return (
            f"| {name} | {row['runs']} | {landed} | {lost(row, 'trainops')} | {lost(row, 'baseline')} | "
            f"{'–' if ratio is None else f'{ratio:g}'} | {row.get('goal', '–')} |"
        )

    total_landed = sum(c["landed"] for c in coverage.values())
    total_covered = sum(c["covered"] for c in coverage.values())
    lines.append(line("**all runs**", result["overall"], f"{total_landed} / {total_covered}"))
    lines.append(line("infrastructure (goal: ≤ 0.5)", result["infrastructure"], ""))
    for kind, row in result["by_kind"].items():
        lines.append(line(kind, row, f"{coverage[kind]['landed']} / {coverage[kind]['covered']}"))
    return lines


def where(account: dict) -> str:
    causes = ", ".join(
        f"{cause} {value:g}" for cause, value in account["lost_by_cause_gpu_s"].items() if value
    )
    return (
        f"held {account['held_gpu_s']:g} = useful {account['useful_gpu_s']:g} + fault-free set-up "
        f"{account['setup_gpu_s']:g} + lost {account['lost_gpu_s']:g} ({causes})"
    )


def setups(result: dict) -> str:
    return "; ".join(
        f"{policy} {s['total_gpu_s']:g} GPU-s a run ("
        + ", ".join(f"{phase} {v:g}" for phase, v in s["by_phase_gpu_s"].items())
        + f"; the mean of {s['runs']} fault-free runs)"
        for policy, s in result["setup"].items()
    )


def elapsed(bound: dict | None) -> list[str]:
    """The elapsed-time bound's paragraph (none without a fault-free run)."""
    if not bound:
        return []
    longest = bound["longest"]
    return [
        f"Elapsed time is bounded: a run under trainops holding more than {bound['bound']:g}x the GPU-seconds of a "
        f"fault-free run ({bound['fault_free_held_gpu_s']:g} GPU-s) is a violation; {len(bound['over'])} were over, "
        f"the longest held {longest['ratio']:g}x (run {longest['run']}, {longest['fault']}).",
        "",
    ]


def defaults(row: dict | None) -> list[str]:
    """The "defaults" baseline's line, beside the headline (derived from the runs, not run)."""
    if not row:
        return []

    def ratio(r: dict) -> str:
        return "–" if r["ratio"] is None else f"{r['ratio']:g}"

    return [
        "",
        f'Beside it, not the headline: a "defaults" baseline, the same one at Airflow\'s default retry delay '
        f"({row['retry_delay_s']:g} s), derived from these runs and not run: each of its "
        f"{row['overall']['retries']} retries holds its pool of {row['pool_gpus']} GPUs "
        f"{row['wait_per_retry_s']:g} campaign-s longer. trainops lost {ratio(row['infrastructure'])} of its "
        f"GPU-hours on the infrastructure faults, {ratio(row['overall'])} on all runs.",
    ]


def projected(scale: dict | None) -> list[str]:
    """The projection to a realistic scale (``scale.py``), labelled as one."""
    if not scale:
        return []
    kinds = ", ".join(f"{kind} {row['ratio']:g}" for kind, row in scale["by_kind"].items())
    return [
        "",
        f"At scale, a projection from these runs and not a run (`benchmarks/campaign/scale.py`): a job of "
        f"{scale['gpus']:,} GPUs failing at Llama 3's rate (one failure every {scale['mtbf_h']:g} h; "
        f"{scale['modelled']}, split over the training faults by cause), saving for {scale['save_s']:g} s every "
        f"{scale['interval_s'] / 60:.0f} min (Young–Daly), each failure costing what the gang stood still in "
        "these runs plus the share of an interval it redid: GPU-hours lost to failures per 1,000 held, trainops "
        f"{scale['lost_per_1000']['trainops']:g}, baseline {scale['lost_per_1000']['baseline']:g}: "
        f"{scale['ratio']:g} of the baseline's (by kind: {kinds}).",
    ]


def section(result: dict) -> str:
    stamp, timing = result["stamp"], result["timing"]
    options = stamp["options"]
    kept = ", ".join(
        f"{name} {value['campaign_s']:g} s" for name, value in timing["intervals"].items() if value["kept"]
    )
    overall = result["overall"]
    advice = result.get("interval")
    recovery = result["recovery_s"]
    parts = [
        BEGIN,
        f"Seed {options['seed']}, {result['runs']} runs, {len(options['kinds'])} fault kinds, commit "
        f"`{stamp['commit'][:10]}`{' (with uncommitted changes)' if stamp['uncommitted'] else ''}; time scaled "
        f"1:{timing['scale']:g} (every production interval divided by {timing['scale']:g}: NCCL's hang timeout "
        f"{timing['intervals']['nccl_timeout_s']['campaign_s']:g} s, a dead worker seen after "
        f"{timing['intervals']['task_heartbeat_timeout_s']['campaign_s']:g} s, the retry delay of both policies "
        f"(the lifecycle DAG's 5 s) {timing['intervals']['retry_delay_s']['campaign_s']:g} s, the provider's "
        f"Job poll {timing['intervals']['job_poll_interval_s']['campaign_s']:g} s; kept above scale: {kept}).",
        "",
        "Accounting: every GPU-second held is useful or lost, once each policy's fault-free set-up (claim, "
        "start, spare, teardown; measured on the fault-free runs: those before the seeded runs, a warm-up "
        f"left out, and the seeded runs that drew no fault) is subtracted from each of its runs: {setups(result)}.",
        "",
        *elapsed(result.get("elapsed")),
        f"**{result['violations']} violations**, {result['succeeded']} of {result['runs']} runs succeeded; "
        f"{sum(c['landed'] for c in result['coverage'].values())} faults landed, "
        f"{sum(c['covered'] for c in result['coverage'].values())} of them with every check of their outcome "
        f"holding; {len(result['not_landed'])} did not land (counted apart).",
        "",
        "GPU-hours lost to faults per 1,000 GPU-hours held by each policy, on the same seeded schedule, and the "
        "ratio of the GPU-hours each lost on the same runs (the goal):",
        "",
        *table_rows(result),
        "",
        f"Where the GPU-seconds went, all runs. trainops: {where(overall['trainops'])}.",
    ]
    if "baseline" in overall:
        parts.append(f"Baseline: {where(overall['baseline'])}.")
    parts.append(
        "Median recovery (the fault to the heartbeat past the resume step), trainops / baseline: "
        + ", ".join(
            f"{kind} {recovery['trainops'][kind]} / {recovery['baseline'].get(kind)} s"
            for kind in recovery["trainops"]
            if recovery["trainops"][kind] is not None
        )
        + "."
    )
    if advice:
        parts.append(f"Checkpoint interval (Young–Daly, campaign seconds): {advice['summary']}.")
    parts += defaults(result.get("defaults_baseline"))
    parts += projected(result.get("at_scale"))
    parts.append(END)
    return "\n".join(parts)


def row(result: dict) -> str:
    infra, overall = result["infrastructure"], result["overall"]

    def ratio(r: dict) -> str:
        return "–" if r.get("ratio") is None else f"{r['ratio']:g}x"

    return (
        f"{ROW}: {result['runs']} seeded lifecycle runs, {len(result['stamp']['options']['kinds'])} fault kinds, "
        f"trainops and a competent baseline (same retry delay) | {result['violations']} violations; lost "
        f"GPU-hours against the baseline's: infrastructure faults {ratio(infra)}, all runs {ratio(overall)} | "
        "0 violations; infrastructure ≤ 0.5x, each node fault < 1x |"
    )


def written(readme: str, result: dict) -> str:
    """``readme`` with its campaign section and benchmark row as ``result`` says."""
    head, found, rest = readme.partition(BEGIN)
    if not found or END not in rest:
        raise ValueError(f"the README has no campaign section: put {BEGIN} and {END} where it goes")
    text = head + section(result) + rest.partition(END)[2]
    lines = text.split("\n")
    rows = [i for i, line in enumerate(lines) if line.startswith(ROW)]
    if len(rows) != 1:
        raise ValueError(f"the README must have one benchmark row starting with {ROW!r}, found {len(rows)}")
    lines[rows[0]] = row(result)
    return "\n".join(lines)


def disagreements(readme: str, result: dict, kinds: tuple[str, ...]) -> list[str]:
    """How ``readme`` and ``result`` disagree with each other and with the code's fault ``kinds``."""
    found = []
    ran = tuple(result["stamp"]["options"]["kinds"])
    if ran != kinds:
        found.append(f"the campaign ran {len(ran)} fault kinds {ran}; the code has {len(kinds)}: {kinds}")
    said = re.findall(r"(\d+) fault kinds", readme)
    if not said or any(int(n) != len(kinds) for n in said):
        found.append(f"the README counts {said or 'no'} fault kinds; the code has {len(kinds)}")
    if written(readme, result) != readme:
        found.append("the README's campaign section or row is not what the JSON says")
    return found


def table(result: dict) -> str:
    """The terminal's summary."""
    lines = [
        f"runs {result['runs']}  seed {result['stamp']['options']['seed']}  wall {result['wall_s']} s  "
        f"succeeded {result['succeeded']}  violations {result['violations']}",
        *table_rows(result),
    ]
    lines += ["  " + line for line in result["violation_details"]]
    lines += ["  not landed: " + line for line in result["not_landed"]]
    lines += ["  " + line for line in result["failed"]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``python -m benchmarks.campaign.readme [campaign.json [README.md]]``: write the README from the JSON."""
    source = Path(argv[0]) if argv else REPO / "benchmarks" / "campaign.json"
    target = Path(argv[1]) if len(argv) > 1 else REPO / "README.md"
    target.write_text(written(target.read_text(), json.loads(source.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
