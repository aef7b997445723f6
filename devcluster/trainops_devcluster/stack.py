"""``make up`` / ``make down``: the Airflow services stack natively, as ``docker-compose.yaml`` runs it.

A throw-away PostgreSQL cluster (Debian's ``postgresql``) and Redis, the CeleryExecutor with one
worker, the API server, scheduler, dag-processor and triggerer, the devcluster and a local S3 server
(moto), all as processes of this machine, bound to loopback. Commands and environments come from
:mod:`trainops_devcluster.stack_spec`. Airflow runs from the Python environment this module runs in.
The devcluster applies ``deploy/rbac.yaml`` at its start, and each Airflow service reaches it as its
own ServiceAccount (``stack_spec.SERVICE_ACCOUNTS``), as pods of the official Helm chart do.

Everything lives in a state folder (default ``.stack``): ``pids/`` records what ``up`` started (pid
and start time), ``logs/`` has one log per service. ``up`` on a running stack only prints where it
is; ``up`` on a stopped one starts afresh; ``down`` stops exactly the recorded processes.

    python -m trainops_devcluster.stack up [--state-dir .stack] [--api-port 8080] [--nodes 8] [--dags DIR]
    python -m trainops_devcluster.stack down [--state-dir .stack]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from glob import glob
from pathlib import Path

from trainops_devcluster.local_s3 import free_port
from trainops_devcluster.stack_spec import (
    AIRFLOW_COMMANDS,
    BUCKET,
    DEFAULT_ADMIN_PASSWORD,
    Endpoints,
    airflow_environment,
    devcluster_command,
    passwords,
    s3_environment,
    service_environment,
)

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
DEPLOY = REPO / "deploy"
POSTGRES_USER = "postgres"  # PostgreSQL refuses to run as root; Debian's package creates this user
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 20.0


class StackError(RuntimeError):
    """The stack cannot start; the message says what to do."""


def up(
    state: Path,
    *,
    api_port: int = 8080,
    nodes: int = 8,
    admin_password: str | None = None,
    dags: Path = DAGS,
) -> Endpoints:
    """Start the stack under ``state`` (or find it running there); returns its endpoints.
    ``dags``: the DAG folder (default: the repository's ``dags/``; the benchmarks bring their own)."""
    state = state.resolve()
    running = _running(state)
    if running is not None:
        return running
    if state.exists() and any(state.iterdir()) and not (state / "pids").is_dir():
        raise StackError(
            f"--state-dir {state}: not empty and not a stack's folder (no pids/); name a new folder"
        )
    if nodes < 3:
        raise StackError(
            f"--nodes {nodes}: the lifecycle DAGs' defaults need at least 3 (2 to train, 1 spare)"
        )
    down(state)  # what is left of an earlier stack here, which may hold the port
    _check_port_free(api_port)
    if state.exists():
        shutil.rmtree(state)
    at = Endpoints(
        postgres=f"127.0.0.1:{free_port()}",
        redis=f"127.0.0.1:{free_port()}",
        s3_url=f"http://127.0.0.1:{free_port()}",
        devcluster_port=free_port(),
        state=str(state),
        home=str(state / "airflow"),
        dags=str(Path(dags).resolve()),
        deploy=str(DEPLOY),
        api_port=api_port,
        scheduler_health_port=free_port(),
        prometheus_port=free_port(),
        devcluster_nodes=nodes,
    )
    for folder in ("pids", "logs", "airflow", "redis"):
        (state / folder).mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)  # the postgres user reaches its data folder through it
    try:
        _start_postgres(state, at)
        _start(state, "redis", ["redis-server", *_redis_options(state, at)])
        _start(state, "s3", [_bin("moto_server"), "-H", "127.0.0.1", "-p", at.s3_url.rsplit(":", 1)[1]])
        _start(state, "devcluster", [_bin("trainops"), *devcluster_command(at)[1:]], env=_devcluster_env(at))
        _wait(state, lambda: _http_ok(f"{at.s3_url}/"), "the S3 server")
        create_bucket(at.s3_url)
        migrate = {**_local_env(), **airflow_environment(at)}
        _run([_bin("airflow"), "db", "migrate"], migrate, state / "logs" / "db-migrate.log")
        Path(at.passwords_file).write_text(passwords(admin_password or DEFAULT_ADMIN_PASSWORD))
        accounts = [Path(at.account_kubeconfig(name)) for name in AIRFLOW_COMMANDS]
        _wait(state, lambda: all(p.exists() for p in accounts), "the devcluster (RBAC and ServiceAccounts)")
        for name, command in AIRFLOW_COMMANDS.items():
            env = {**_local_env(), **service_environment(at, name)}
            _start(state, name, [_bin("airflow"), *command], env=env)
        (state / "endpoints.json").write_text(json.dumps(asdict(at)))
        _wait(state, lambda: _healthy(at), "Airflow (api-server, scheduler, dag-processor, triggerer)")
    except BaseException:
        down(state)
        raise
    return at


def down(state: Path) -> list[str]:
    """Stop the processes ``up`` recorded under ``state``; returns their names.

    Everything but the databases stops together, then Redis and PostgreSQL (started first)."""
    pids = state.resolve() / "pids"
    records = {record: json.loads(record.read_text()) for record in pids.glob("*.json")}
    databases = {record for record in records if record.stem in ("postgres", "redis")}
    stopped = []
    for stage in (set(records) - databases, databases):
        alive = {record: records[record] for record in stage if _alive(records[record])}
        _stop(list(alive.values()))
        stopped += sorted(record.stem for record in alive)
        for record in stage:
            record.unlink()
    return stopped


def crash(state: Path, name: str) -> None:
    """SIGKILL the Airflow service ``name`` (``airflow-worker``, ``airflow-triggerer``...) with everything
    it spawned, as a node failure or the OOM killer would, and start it again as its supervisor (the
    kubelet, systemd) does: a new process with the same command and environment, and no goodbye."""
    state = state.resolve()
    record = json.loads((state / "pids" / f"{name}.json").read_text())
    _signal_group(record["pid"], signal.SIGKILL)
    _wait_gone([record])
    at = Endpoints(**json.loads((state / "endpoints.json").read_text()))
    _start(state, name, record["argv"], env={**_local_env(), **service_environment(at, name)})


def create_bucket(endpoint_url: str, name: str = BUCKET) -> None:
    """Create the lifecycle DAGs' default bucket (idempotent)."""
    import boto3

    from trainops_devcluster.local_s3 import ACCESS_KEY, REGION, SECRET_KEY

    client = boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
    )
    try:
        client.create_bucket(Bucket=name)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass


# ---- processes ---------------------------------------------------------------------------------


def _start(state: Path, name: str, argv: list[str], env: dict | None = None, user: str | None = None) -> None:
    log = open(state / "logs" / f"{name}.log", "ab")  # the child keeps its own descriptor
    process = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=state,
        user=user,
        start_new_session=True,  # its own process group: `down` stops it with everything it spawned
    )
    log.close()
    entry = {"pid": process.pid, "start": _start_time(process.pid), "argv": argv}
    (state / "pids" / f"{name}.json").write_text(json.dumps(entry))


def _start_time(pid: int) -> str | None:
    """The live process's start time in clock ticks since boot (with the pid, it names one process);
    ``None`` once it has exited."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] == "Z":  # exited; a child of this process until reaped
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return None
    return fields[19]


def _alive(entry: dict) -> bool:
    return entry.get("start") is not None and _start_time(entry["pid"]) == entry["start"]


def _stop(entries: list[dict]) -> None:
    """SIGTERM each process group (PostgreSQL: SIGINT, its fast shutdown; SIGTERM would wait for
    every client to leave) and every descendant in a session of its own (trainer pods, the checkpoint
    reader), then SIGKILL what is left of all of them. Descendants are found first: once their parent
    is gone they belong to init and no group names them."""
    tree = [*entries, *descendants(entries)]
    for entry in entries:
        _signal_group(
            entry["pid"], signal.SIGINT if Path(entry["argv"][0]).name == "postgres" else signal.SIGTERM
        )
    for entry in tree[len(entries) :]:
        _signal(entry, signal.SIGTERM)
    _wait_gone(tree)
    tree += descendants(tree)  # started while the others stopped
    for entry in entries:
        _signal_group(entry["pid"], signal.SIGKILL)
    for entry in tree:
        _signal(entry, signal.SIGKILL)
    _wait_gone(tree)  # a killed process lingers a moment; `down` returns once the ports are free


def _wait_gone(entries: list[dict]) -> None:
    """Until none of ``entries`` is alive, or ``STOP_TIMEOUT_S``."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(_alive(entry) for entry in entries) and time.monotonic() < deadline:
        time.sleep(0.1)


def descendants(entries: list[dict]) -> list[dict]:
    """Every live descendant of the live processes ``entries`` names, as ``{"pid", "start"}`` records."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [entry["pid"] for entry in entries if _alive(entry)]
    while queue:
        for pid in children.get(queue.pop(), []):
            record = {"pid": pid, "start": _start_time(pid)}
            if record["start"] is not None:
                found.append(record)
                queue.append(pid)
    return found


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _signal(entry: dict, sig: int) -> None:
    """Signal the process ``entry`` records, only if it is still that process (pids are reused)."""
    if _alive(entry):
        with contextlib.suppress(ProcessLookupError):
            os.kill(entry["pid"], sig)


def _run(argv: list[str], env: dict, log: Path, user: str | None = None) -> None:
    with open(log, "ab") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, user=user, check=False)
    if done.returncode != 0:
        raise StackError(f"{' '.join(argv)} failed (exit {done.returncode}); see {log}")


def _bin(name: str) -> str:
    """A console script of this Python environment (the venv's ``airflow``, ``trainops``, ``moto_server``)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise StackError(f"{path} is missing; install the project first (make setup)")
    return str(path)


def _wait(state: Path, ready, what: str) -> None:
    """Wait for ``ready()``; fail at once when a process the stack started has exited."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        for record in (state / "pids").glob("*.json"):
            if not _alive(json.loads(record.read_text())):
                raise StackError(f"{record.stem} exited while starting; see {state}/logs/{record.stem}.log")
        if time.monotonic() > deadline:
            raise StackError(f"{what} not ready after {START_TIMEOUT_S:.0f} s; see {state}/logs/")
        time.sleep(0.5)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status < 500
    except (OSError, urllib.error.URLError):
        return False


def _healthy(at: Endpoints) -> bool:
    """Every component the API server reports on is healthy (the metadatabase and the three jobs)."""
    try:
        with urllib.request.urlopen(f"{at.api_url}/api/v2/monitor/health", timeout=2) as response:
            health = json.load(response)
    except (OSError, ValueError):
        return False
    parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
    return all((health.get(part) or {}).get("status") == "healthy" for part in parts)


def _check_port_free(port: int) -> None:
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the API server binds it
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise StackError(
                f"--api-port {port}: the port is in use; choose another (make up API_PORT=8081)"
            ) from None


# ---- PostgreSQL and Redis ----------------------------------------------------------------------


def _postgres_bin(name: str) -> str:
    found = sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(Path(p).parts[4]))
    if not found:
        raise StackError("PostgreSQL is not installed; run scripts/install-system-packages")
    return found[-1]


def _start_postgres(state: Path, at: Endpoints) -> None:
    host, port = at.postgres.split(":")
    data = state / "postgres"
    data.mkdir(mode=0o700)
    user = POSTGRES_USER if os.geteuid() == 0 else None
    if user:
        shutil.chown(data, user)
    log = state / "logs" / "postgres.log"
    _run(
        [
            _postgres_bin("initdb"),
            "-D",
            str(data),
            "-U",
            "airflow",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ],
        dict(os.environ),
        log,
        user=user,
    )
    options = ["-c", f"listen_addresses={host}", "-c", "fsync=off", "-c", "max_connections=200"]
    _start(
        state,
        "postgres",
        [_postgres_bin("postgres"), "-D", str(data), "-p", port, "-k", str(data), *options],
        user=user,
    )
    ready = [_postgres_bin("pg_isready"), "-q", "-h", host, "-p", port]
    _wait(state, lambda: subprocess.run(ready, check=False).returncode == 0, "PostgreSQL")
    _run(
        [_postgres_bin("createdb"), "-h", host, "-p", port, "-U", "airflow", "airflow"], dict(os.environ), log
    )


def _redis_options(state: Path, at: Endpoints) -> list[str]:
    if not shutil.which("redis-server"):
        raise StackError("redis-server is not installed; run scripts/install-system-packages")
    host, port = at.redis.split(":")
    return ["--bind", host, "--port", port, "--save", "", "--appendonly", "no", "--dir", str(state / "redis")]


def _local_env() -> dict[str, str]:
    """This environment less any Airflow settings of its own (only the stack's apply), with this
    venv's scripts first on PATH."""
    inherited = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return {**inherited, "PATH": path}


def _devcluster_env(at: Endpoints) -> dict[str, str]:
    """The devcluster's environment, which its trainer pods inherit: S3 and this venv's ``python``."""
    return {**_local_env(), **s3_environment(at)}


def _running(state: Path) -> Endpoints | None:
    """The endpoints of the stack running under ``state``, when every recorded process is alive."""
    pids = list((state / "pids").glob("*.json")) if (state / "pids").is_dir() else []
    if not pids or not (state / "endpoints.json").exists():
        return None
    if not all(_alive(json.loads(p.read_text())) for p in pids):
        return None
    try:
        return Endpoints(**json.loads((state / "endpoints.json").read_text()))
    except TypeError:  # started by an older version of this module: `up` starts it afresh
        return None


def _print_where(at: Endpoints) -> None:
    print(f"Airflow UI: http://127.0.0.1:{at.api_port}")
    print("Login (local only): user admin, password admin unless TRAINOPS_ADMIN_PASSWORD was set")
    print(
        f"devcluster kubeconfig: {at.kubeconfig} (admin; each Airflow service has its ServiceAccount's beside it)"
    )
    print(f"S3 endpoint: {at.s3_url} (bucket {BUCKET})")
    print(f"Logs: {Path(at.state) / 'logs'}; stop with: make down")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainops_devcluster.stack", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start the stack (or show the running one)")
    start.add_argument("--state-dir", type=Path, default=Path(".stack"))
    start.add_argument("--api-port", type=int, default=8080)
    start.add_argument("--nodes", type=int, default=8, help="devcluster GPU nodes (default 8)")
    start.add_argument("--dags", type=Path, default=DAGS, help="the DAG folder (default: dags/)")
    stop = commands.add_parser("down", help="stop what `up` started")
    stop.add_argument("--state-dir", type=Path, default=Path(".stack"))
    bucket = commands.add_parser("bucket", help=f"create the demo bucket {BUCKET} on an S3 endpoint")
    bucket.add_argument("--endpoint", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            at = up(
                args.state_dir,
                api_port=args.api_port,
                nodes=args.nodes,
                admin_password=os.environ.get("TRAINOPS_ADMIN_PASSWORD"),
                dags=args.dags,
            )
            _print_where(at)
        elif args.command == "down":
            stopped = down(args.state_dir)
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        else:
            create_bucket(args.endpoint)
    except StackError as error:
        print(f"stack: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
