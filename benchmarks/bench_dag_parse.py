"""DAG file parse time against a bare ``import airflow.sdk``, each in fresh interpreters, in one run.

Parsing a DAG file costs at least ``import airflow.sdk``; everything above that is ours (the
operators, the lifecycle builder). Heavy libraries load inside tasks, so the ratio stays near 1.
Prints ``bench dag_parse: ... ratio=<r> target<=1.2 PASS|FAIL``; exits 1 on FAIL.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import record

DAGS = sorted(str(p) for p in (Path(__file__).resolve().parents[1] / "dags").glob("*.py"))
BASELINE = "import airflow.sdk"
PARSE = f"import runpy\nfor path in {DAGS!r}:\n    runpy.run_path(path)"
ROUNDS = 7
TARGET = 1.2


def seconds(code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-dag-parse-") as home:
        env = {**os.environ, "AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
        seconds(PARSE, env)  # warm the file cache and byte-code for both
        baseline, parse = [], []
        for _ in range(ROUNDS):  # interleaved, so machine noise hits both alike
            baseline.append(seconds(BASELINE, env))
            parse.append(seconds(PARSE, env))
    base, ours = statistics.median(baseline), statistics.median(parse)
    ratio = ours / base
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    print(
        f"bench dag_parse: {len(DAGS)} DAG files {ours * 1000:.0f} ms vs import airflow.sdk {base * 1000:.0f} ms "
        f"(median of {ROUNDS} fresh interpreters) ratio={ratio:.2f} target<={TARGET} {verdict}"
    )
    record(
        "dag_parse",
        passed=verdict == "PASS",
        ratio=round(ratio, 3),
        target=f"<={TARGET}",
        dag_files=len(DAGS),
        parse_ms=round(ours * 1000, 1),
        import_airflow_sdk_ms=round(base * 1000, 1),
    )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
