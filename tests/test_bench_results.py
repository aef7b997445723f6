"""``make bench``'s results as data (no servers): what a benchmark records, run.py's collection and cut-off,
the summary, and the README's benchmark rows written from a small sample of ``benchmarks/bench.json``."""

from __future__ import annotations

import json
import signal
import textwrap

from benchmarks import results
from benchmarks.run import run_one

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SAMPLE = {
    "stamp": {"commit": COMMIT, "uncommitted": False, "changed": []},
    "large": False,
    "budget_s": 1800.0,
    "partial": False,
    "only": [],
    "wall_s": 1234.5,
    "not_run": ["bench_ui.py"],
    "passed": False,
    "benchmarks": [
        {
            "script": "bench_dag_parse.py",
            "exit": 1,
            "timed_out": False,
            "wall_s": 30.2,
            "results": [
                {
                    "name": "dag_parse",
                    "passed": False,
                    "ratio": 1.31,
                    "target": "<=1.2",
                    "values": {"dag_files": 3, "parse_ms": 1310.0, "import_airflow_sdk_ms": 1000.0},
                }
            ],
        },
        {
            "script": "bench_devcluster_ungater.py",
            "exit": 0,
            "timed_out": False,
            "wall_s": 6.1,
            "results": [
                {
                    "name": "devcluster_ungater_size",
                    "passed": None,
                    "ratio": None,
                    "target": None,
                    "values": {"finished_workloads": 5000, "cpu_per_node_event_us": 4.2},
                },
                {
                    "name": "devcluster_ungater",
                    "passed": True,
                    "ratio": 1.04,
                    "target": "<=1.5",
                    "values": {"cpu_per_node_event_us_at_0": 4.1, "cpu_per_node_event_us_at_5000": 4.2},
                },
            ],
        },
    ],
}
README = """\
| benchmark | result | target |
|---|---|---|
| DAG file parse vs bare `import airflow.sdk` | 0.98-1.09x | <= 1.2x |
| UI: fleet API for 4,096 nodes vs one paginated node list | 1.35x; 1.06x | <= 1.5x |
| fault campaign (`make campaign`): 200 seeded lifecycle runs | 0 violations | 0 violations |
"""


def test_the_readme_rows_are_written_from_the_json():
    written = results.written(README, SAMPLE).split("\n")

    assert written[2] == (
        "| DAG file parse vs bare `import airflow.sdk` | dag_parse 1.31x (dag_files 3, parse_ms 1,310, "
        "import_airflow_sdk_ms 1,000) **missed** (commit `0123456789`) | <=1.2 |"
    )
    assert written[3] == README.split("\n")[3]  # no UI result in the JSON: the row is kept
    ungater = written[4]  # a row the README lacks goes before the campaign's
    assert ungater.startswith("| devcluster Kueue TAS ungater")
    assert (
        "devcluster_ungater 1.04x (cpu_per_node_event_us_at_0 4.1, cpu_per_node_event_us_at_5000 4.2)"
        in ungater
    )
    assert "devcluster_ungater_size (finished_workloads 5,000, cpu_per_node_event_us 4.2)" in ungater
    assert ungater.endswith("| <=1.5 |")
    assert written[5].startswith(results.CAMPAIGN_ROW)
    assert results.written("\n".join(written), SAMPLE) == "\n".join(written)  # idempotent


def test_a_tree_with_uncommitted_changes_says_so():
    sample = {**SAMPLE, "stamp": {**SAMPLE["stamp"], "uncommitted": True}}

    assert "(commit `0123456789` with uncommitted changes)" in results.written(README, sample)


def test_the_summary_has_every_line_and_what_did_not_run():
    text = results.summary(SAMPLE)

    assert "commit 0123456789" in text
    assert "bench_dag_parse.py" in text and "exit 1" in text
    assert "dag_parse" in text and "1.31" in text and "FAIL" in text
    assert "devcluster_ungater" in text and "PASS" in text
    assert "bench_ui.py" in text and "not run" in text


def test_record_writes_a_json_line_only_under_run_py(tmp_path, monkeypatch):
    monkeypatch.delenv(results.RESULTS_ENV, raising=False)
    assert results.record("x", passed=True) is True  # nothing to write to

    path = tmp_path / "records.jsonl"
    monkeypatch.setenv(results.RESULTS_ENV, str(path))
    results.record("x", passed=False, ratio=2.0, target="<=1.5", nodes=4)
    results.record("y", seconds=1.5)

    assert results.read_records(path) == [
        {"name": "x", "passed": False, "ratio": 2.0, "target": "<=1.5", "values": {"nodes": 4}},
        {"name": "y", "passed": None, "ratio": None, "target": None, "values": {"seconds": 1.5}},
    ]


def test_run_one_collects_a_scripts_records_and_cuts_off_an_overrun(tmp_path):
    helper = str((results.REPO / "benchmarks").resolve())
    quick = tmp_path / "bench_quick.py"
    quick.write_text(
        textwrap.dedent(f"""\
            import sys
            sys.path.insert(0, {helper!r})
            from results import record
            record("quick", passed=False, ratio=3.0, target="<=1.5", seconds=0.1)
            sys.exit(1)
            """)
    )
    slow = tmp_path / "bench_slow.py"
    slow.write_text(
        "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    raise SystemExit(130)\n"
    )

    done = run_one(quick, timeout=60)
    # this runner started as a background job (SIGINT ignored, as a shell starts one) still interrupts it; 5 s
    # is long enough for the interpreter to start and install its handler on a loaded machine
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        cut = run_one(slow, timeout=5)
    finally:
        signal.signal(signal.SIGINT, ignored)

    assert done["exit"] == 1 and not done["timed_out"]
    assert done["results"] == [
        {"name": "quick", "passed": False, "ratio": 3.0, "target": "<=1.5", "values": {"seconds": 0.1}}
    ]
    assert cut["timed_out"] and cut["exit"] == 130  # interrupted (its handler ran), not killed
    json.dumps([done, cut])  # as run.py writes them
