"""Benchmark results as data: what each benchmark records, ``make bench``'s summary and JSON, and the
README's benchmark rows written from that JSON.

A benchmark prints its line (``bench <name>: <figures> ratio=<r> target<=<t> PASS|FAIL``) and calls
``record(name, ...)`` with the same figures as numbers; when ``benchmarks/run.py`` started it (it sets
``BENCH_RESULTS``), the record is appended to that file as one JSON line, otherwise nothing happens.
``run.py`` gathers the records into a summary table and ``benchmarks/bench.json``, stamped with the
commit (``stamp()``).

``python -m benchmarks.results [bench.json [README.md]]`` writes the README's benchmark rows from the
JSON (``written``), as ``benchmarks/campaign/readme.py`` writes the campaign's row from
``campaign.json``: each row of ``README_ROWS`` found by the start of its first cell gets its result and
target cells from the JSON; a row with no result in the JSON is left as it is; a row the README lacks
is added before the campaign's row. The rows' hand-written notes (spreads over several runs, loads)
are replaced, so run it only on a full run's JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS_ENV = "BENCH_RESULTS"
CAMPAIGN_ROW = "| fault campaign (`make campaign`)"

# README row (the start of its first cell; the whole cell when the row is added) -> the result names
README_ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "| devcluster, 4,096 nodes x 8 GPUs (+2 system nodes), 32,768 pods: paginated node list",
        ("devcluster_list_nodes", "devcluster_memory"),
    ),
    (
        "| devcluster Kueue TAS ungater, a burst of 3,000 node writes with 0, 1,000 and 5,000 finished "
        "Workloads (+4 running): its CPU per node event at 5,000 vs 0 (`bench_devcluster_ungater.py`)",
        ("devcluster_ungater", "devcluster_ungater_size"),
    ),
    ("| health gate vs its honest floor", ("health_gate", "health_gate_linear")),
    ("| node probe, 10 simulated minutes", ("probe_publish",)),
    (
        "| inference through a claim",
        ("inference_failed_requests", "inference_p99_during_vs_before", "inference_without_overflow_pool"),
    ),
    ("| claim + return 512 nodes", ("capacity_writes_per_node", "capacity_claim_return")),
    (
        "| checkpoint verify, 10,000 shards",
        ("checkpoint_verify", "checkpoint_verify_vs_list", "checkpoint_verify_vs_head"),
    ),
    ("| checkpoint verify, real DCP", ("checkpoint_real_dcp_verify_vs_torch_read",)),
    (
        "| crash -> resumed Job under `dag.test`",
        ("training-failure-seen", "training-crash-to-resumed-job", "training-steps-lost-per-crash"),
    ),
    ("| crash -> resumed pods Running on the services stack", ("services-crash-to-resumed-pods-running",)),
    ("| crash -> training again with no spare", ("elastic-resume-vs-replacement",)),
    ("| DAG file parse vs bare", ("dag_parse",)),
    ("| UI: fleet API for 4,096 nodes", ("ui_fleet", "ui_tensor_activity")),
    ("| placement: a 16-node run + 1 spare", ("placement_blocks_spanned", "placement_random_fleets")),
)


# ---- in each benchmark ----------------------------------------------------------------------------
def record(
    name: str,
    *,
    passed: bool | None = None,
    ratio: float | None = None,
    target: str | None = None,
    **values: object,
) -> bool | None:
    """One result line as data: ``passed`` None when judged by nothing, ``target`` as printed (``<=1.5``),
    ``values`` the line's figures (numbers or short strings). Returns ``passed``."""
    path = os.environ.get(RESULTS_ENV)
    if path:
        entry = {"name": name, "passed": passed, "ratio": ratio, "target": target, "values": values}
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry, default=str) + "\n")
    return passed


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---- in run.py ------------------------------------------------------------------------------------
def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()


def stamp() -> dict:
    """The commit measured and whether tracked files differed from it (untracked files are not counted)."""
    changed = git("status", "--porcelain", "--untracked-files=no").splitlines()
    return {
        "commit": git("rev-parse", "HEAD"),
        "uncommitted": bool(changed),
        "changed": [c[3:] for c in changed],
    }


def verdict(passed: bool | None) -> str:
    return "–" if passed is None else ("PASS" if passed else "FAIL")


def number(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def figures(values: dict) -> str:
    return ", ".join(f"{key} {number(value)}" for key, value in values.items())


def summary(result: dict) -> str:
    """The terminal's table: one row per benchmark script, then one per result line."""
    stamped = result["stamp"]
    lines = [
        f"commit {stamped['commit'][:10]}{' (with uncommitted changes)' if stamped['uncommitted'] else ''}"
        f"  large sizes {'on' if result['large'] else 'off'}  wall {result['wall_s']:.0f} s",
        f"{'benchmark / result':<44} {'ratio':>8} {'target':>10} {'verdict':>8}  figures",
    ]
    for script in result["benchmarks"]:
        status = "ok" if script["exit"] == 0 else f"exit {script['exit']}"
        if script.get("timed_out"):
            status = "timed out"
        lines.append(f"{script['script']:<44} {'':>8} {'':>10} {'':>8}  {status}, {script['wall_s']:.0f} s")
        for line in script["results"]:
            ratio = "" if line["ratio"] is None else f"{line['ratio']:.2f}"
            lines.append(
                f"  {line['name']:<42} {ratio:>8} {line['target'] or '':>10} {verdict(line['passed']):>8}  "
                f"{figures(line['values'])}"
            )
    for name in result.get("not_run") or []:
        lines.append(f"{name:<44} {'':>8} {'':>10} {'':>8}  not run: the budget was spent")
    return "\n".join(lines)


# ---- the README -----------------------------------------------------------------------------------
def results_by_name(result: dict) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for script in result["benchmarks"]:
        for line in script["results"]:
            found.setdefault(line["name"], []).append(line)
    return found


def cell(line: dict) -> str:
    ratio = "" if line["ratio"] is None else f"{line['ratio']:.2f}x "
    missed = " **missed**" if line["passed"] is False else ""
    return f"{line['name']} {ratio}({figures(line['values'])}){missed}"


def row(first_cell: str, lines: list[dict], commit: str) -> str:
    results = "; ".join(cell(line) for line in lines) + f" (commit {commit})"
    targets = "; ".join(dict.fromkeys(line["target"] for line in lines if line["target"])) or "reported"
    return f"{first_cell} | {results} | {targets} |"


def readme_rows(result: dict) -> dict[str, str]:
    """README row prefix -> its row, for each row whose benchmarks are in ``result``."""
    found, commit = results_by_name(result), f"`{result['stamp']['commit'][:10]}`"
    if result["stamp"]["uncommitted"]:
        commit += " with uncommitted changes"
    rows = {}
    for prefix, names in README_ROWS:
        lines = [line for name in names for line in found.get(name, [])]
        if lines:
            rows[prefix] = lines
    return {prefix: row(prefix, lines, commit) for prefix, lines in rows.items()}


def written(readme: str, result: dict) -> str:
    """``readme`` with the benchmark rows ``result`` has results for."""
    lines = readme.split("\n")
    for prefix, text in readme_rows(result).items():
        at = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        if len(at) > 1:
            raise ValueError(f"the README has {len(at)} benchmark rows starting with {prefix!r}")
        if at:
            first_cell = lines[at[0]].split(" | ")[0]
            lines[at[0]] = first_cell + text[len(prefix) :] if first_cell.startswith(prefix) else text
            continue
        campaign = [i for i, line in enumerate(lines) if line.startswith(CAMPAIGN_ROW)]
        if len(campaign) != 1:
            raise ValueError(
                f"no place for a new row: the README needs one row starting with {CAMPAIGN_ROW!r}"
            )
        lines.insert(campaign[0], text)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``python -m benchmarks.results [bench.json [README.md]]``: write the README's rows from the JSON."""
    source = Path(argv[0]) if argv else REPO / "benchmarks" / "bench.json"
    target = Path(argv[1]) if len(argv) > 1 else REPO / "README.md"
    target.write_text(written(target.read_text(), json.loads(source.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
