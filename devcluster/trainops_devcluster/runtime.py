"""The simulated kubelet of every node: runs bound pods, reports their status, stops deleted ones.

Two container runtimes:

* **process** — a container whose image is ``LOCAL_IMAGE`` runs its ``command`` + ``args`` as a
  local subprocess (own session, fresh working directory) with the pod's env over the
  devcluster's ``process_env``; its output goes to ``PodLogs``; its exit code is the
  container's; a process killed by signal N exits 128+N like a crashed container.  Cluster DNS
  names in its address variables become ``127.0.0.1`` with per-Service ports (``loopback``).
* **simulated** — any other image "runs" on timers driven by pod annotations:
  ``devcluster.trainops.io/start-seconds`` (default 0.05) until Running and Ready,
  ``devcluster.trainops.io/run-seconds`` (absent: until deleted) and
  ``devcluster.trainops.io/exit-code`` (default 0).  No thread per pod.

Graceful deletion as a kubelet does it: a pod that gets ``deletionTimestamp`` has its containers
sent SIGTERM (a process container's ``preStop`` ``sleep``, or ``exec`` of ``sleep N``, holds it
back that long first; other hooks are not run), SIGKILL after the grace period; its final status
is written and the object removed.  ``restartPolicy`` Always/OnFailure restarts containers in place with back-off.
The kubelet also hands out GPU indices per node (as the device plugin does: the process sees
them as ``NVIDIA_VISIBLE_DEVICES``, and the speed of the slowest of them, a slowed GPU's fault, as
``DEVCLUSTER_GPU_SPEED``: the demo trainer's steps take that much longer) and tells the node's
telemetry when its GPUs are busy.  A GPU the device plugin reported Unhealthy (``gpu_unhealthy``,
after a fatal XID) is handed out no more and leaves ``status.allocatable`` (``status.capacity``
keeps it, as the kubelet's device manager reports them) until ``restore_node`` (the node repaired).
While a node's fabric port is down (``fabric_down``), a GPU container that starts there dies
``NCCL_ABORT_S`` after it starts with the NCCL error (see ``faults``).  A
Virtual-Kubelet-like node (label ``type=virtual-kubelet``) runs its pods without GPU devices: its
GPUs are another provider's, so no indices are handed out and no telemetry is told.

Readiness: a process container with a ``readinessProbe`` (``httpGet`` or ``tcpSocket``, on one of
its ``containerPort``s) is Ready only while the probe passes, probed from a thread of its own with
the probe's delay, period, timeout and thresholds; without one it is Ready once it runs.

Images: the first pod on a node that uses an image pulls it first, ``image_pull_s`` seconds (default
0) per image not yet on the node, one at a time (the kubelet's serialized pulls), with the kubelet's
``Pulling``/``Pulled`` events; the node's ``status.images`` then lists it, and later pods find it
"already present on machine".  The pod stays Pending meanwhile.
"""

from __future__ import annotations

import http.client
import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from trainops_devcluster.conditions import set_condition
from trainops_devcluster.events import EventRecorder
from trainops_devcluster.informer import InformerController, Key, key_of
from trainops_devcluster.logs import PodLogs
from trainops_devcluster.loopback import Loopback
from trainops_devcluster.podutil import DEFAULT_GRACE_SECONDS, gpu_count, is_deleting, node_of, phase
from trainops_devcluster.store import Conflict, NotFound, Store, StoreError, now_iso

LOCAL_IMAGE = "devcluster.trainops.io/local"
START_SECONDS = "devcluster.trainops.io/start-seconds"
RUN_SECONDS = "devcluster.trainops.io/run-seconds"
EXIT_CODE = "devcluster.trainops.io/exit-code"
DEFAULT_START_SECONDS = 0.05
RESTART_BACKOFF_S = (0.05, 5.0)  # first and longest wait before restarting a container (real: 10 s, 5 min)
VIRTUAL_NODE_LABEL, VIRTUAL_NODE_VALUE = "type", "virtual-kubelet"  # Virtual Kubelet's node label
GPU_SPEED_ENV = "DEVCLUSTER_GPU_SPEED"  # the slowest of the container's GPUs, as a fraction of full speed
PORT_ENV = "DEVCLUSTER_PORT_"  # + containerPort: the local port a process binds for it
GPU_RESOURCE = "nvidia.com/gpu"
NCCL_ABORT_S = 0.2  # a GPU container on a node whose fabric port is down dies this long after it starts


class PodNotRunning(NotFound):
    """A fault named a pod this kubelet is not running."""


@dataclass(frozen=True)
class Exit:
    code: int
    reason: str = ""
    message: str = ""

    @property
    def shown_reason(self) -> str:
        return self.reason or ("Completed" if self.code == 0 else "Error")


@dataclass
class Container:
    spec: dict
    started_at: str = ""
    finished_at: str = ""
    restarts: int = 0
    exit: Exit | None = None
    last_exit: dict | None = None  # the previous run's ``terminated`` state
    waiting: str = ""  # a back-off before a restart
    forced: Exit | None = None  # how a fault says the running process ends
    process: subprocess.Popen | None = None
    generation: int = 0  # bumped per (re)start so stale timers and exits are ignored
    probe_ready: bool = True  # the readiness probe's verdict (True when it has none)

    @property
    def local(self) -> bool:
        return self.spec.get("image") == LOCAL_IMAGE

    @property
    def running(self) -> bool:
        return self.generation > 0 and self.exit is None and not self.waiting

    @property
    def ready(self) -> bool:
        return self.running and self.probe_ready

    @property
    def probe(self) -> dict | None:
        """The readiness probe the kubelet runs (process containers, httpGet or tcpSocket)."""
        probe = self.spec.get("readinessProbe") or {}
        return probe if self.local and ("httpGet" in probe or "tcpSocket" in probe) else None


@dataclass
class PodRun:
    key: Key
    uid: str
    node: str
    containers: list[Container]
    pod_ip: str = ""
    host_ip: str = ""
    start_time: str = ""
    gpus: list[int] = field(default_factory=list)
    workdir: str = ""
    started: bool = False
    hung: bool = False
    deleting: bool = False


class PodRuntime(InformerController):
    """The kubelets of all nodes, as one controller."""

    watches = ("pods", "nodes")

    def __init__(
        self,
        store: Store,
        logs: PodLogs,
        telemetry: Mapping | None = None,
        process_env=None,
        image_pull_s: float = 0.0,
    ) -> None:
        super().__init__(store)
        self.image_pull_s = image_pull_s
        self._images: dict[str, dict[str, float]] = {}  # node -> image -> when its pull ends (monotonic)
        self._pulled_at: dict[str, float] = {}  # node -> when its pulls in progress end
        self.logs = logs
        self.telemetry = telemetry or {}
        self.process_env = dict(process_env or {})
        self.events = EventRecorder(store, "kubelet")
        self.loopback = Loopback(store)
        self._runs: dict[Key, PodRun] = {}
        self._gpu_users: dict[str, dict[int, Key]] = {}
        self._unhealthy: dict[str, set[int]] = {}  # node -> GPU indices its device plugin reported Unhealthy
        self._fabric_down: dict[str, str] = {}  # node -> the NCCL error its GPU containers die with
        self._ips = itertools.count(2)
        self._closed = threading.Event()

    # ---- pod changes -------------------------------------------------------------------
    def changed(self, resource: str, old: dict | None, new: dict | None) -> None:
        if resource == "nodes":
            return  # only read from the cache
        key = key_of(old or new)
        run = self._runs.get(key)
        if run is not None and (new is None or new["metadata"]["uid"] != run.uid):
            self._abandon(run)  # removed without waiting for us (grace period 0), or replaced
            run = None
        if new is None:
            self.logs.forget(*key)
            return
        if not node_of(new):
            return
        if is_deleting(new):
            if run is None:
                self._remove(new)
            elif not run.deleting:
                self._terminate(run, new)
            return
        if run is None and phase(new) == "Pending":
            self._admit(new)

    def _admit(self, pod: dict) -> None:
        key = key_of(pod)
        run = PodRun(
            key, pod["metadata"]["uid"], node_of(pod), [Container(c) for c in pod["spec"]["containers"]]
        )
        self._runs[key] = run
        try:
            delay = _annotation_seconds(pod, START_SECONDS, DEFAULT_START_SECONDS)
        except ValueError as error:
            message = str(error)
            self.after(0, lambda: self._start(run, error=message))
            return
        self.after(self._pull(pod, run.node) + delay, lambda: self._start(run))

    def _pull(self, pod: dict, node: str) -> float:
        """Pull the pod's images the node lacks (serially, after the pulls under way); seconds until all
        are there (an image another pod is pulling now is waited for)."""
        have = self._images.setdefault(node, {})
        wanted = dict.fromkeys(c.get("image", "") for c in pod["spec"].get("containers") or [])
        now = time.monotonic()
        done = max(now, self._pulled_at.get(node, now))
        ready, pulling = now, False
        for image in wanted:
            if image in have:
                ready = max(ready, have[image])
                if have[image] <= now:
                    self.events.record(
                        pod, "Pulled", f'Container image "{image}" already present on machine', host=node
                    )
                continue
            self.events.record(pod, "Pulling", f'Pulling image "{image}"', host=node)
            done += self.image_pull_s
            have[image], pulling = done, True
            self.after(done - now, lambda image=image: self._pulled(pod, node, image))
        if pulling:  # this pod's pulls queue behind those under way
            self._pulled_at[node] = done
            ready = max(ready, done)
        return ready - now

    def _pulled(self, pod: dict, node: str, image: str) -> None:
        self.events.record(
            pod, "Pulled", f'Successfully pulled image "{image}" in {self.image_pull_s:.3f}s', host=node
        )

        def record(n: dict) -> None:
            images = n.setdefault("status", {}).setdefault("images", [])
            if not any(image in (entry.get("names") or []) for entry in images):
                images.append({"names": [image], "sizeBytes": 10 << 30})

        try:
            self.store.mutate("nodes", "", node, record)
        except NotFound:
            pass

    def _current(self, run: PodRun) -> bool:
        return self._runs.get(run.key) is run

    # ---- starting ----------------------------------------------------------------------
    def _start(self, run: PodRun, error: str = "") -> None:
        if not self._current(run) or run.deleting:
            return
        pod = self.cache["pods"].get(run.key)
        if pod is None or pod["metadata"]["uid"] != run.uid:
            return
        node = self.cache["nodes"].get(("", run.node)) or {}
        run.host_ip = next(
            (
                a["address"]
                for a in (node.get("status") or {}).get("addresses") or []
                if a.get("type") == "InternalIP"
            ),
            "",
        )
        ip = next(self._ips)
        run.pod_ip = f"10.{128 + (ip >> 16) % 128}.{(ip >> 8) % 256}.{ip % 256}"
        run.start_time = now_iso()
        run.gpus = self._allocate_gpus(run, node, gpu_count(pod))
        run.started = True
        for index in range(len(run.containers)):
            self._start_container(run, pod, index, error)
        self._report(run)

    def _start_container(self, run: PodRun, pod: dict, index: int, error: str = "") -> None:
        container = run.containers[index]
        container.generation += 1
        container.exit, container.forced, container.waiting = None, None, ""
        container.started_at, container.finished_at = now_iso(), ""
        container.probe_ready = container.probe is None
        generation = container.generation

        def finish(exit: Exit) -> Callable[[], None]:
            return lambda: self._exited(run, index, generation, exit)

        if error:
            self.after(0, finish(Exit(128, "StartError", error)))
            return
        if container.local:
            try:
                self._spawn(run, pod, index, generation)
            except (OSError, ValueError) as failure:
                self.after(
                    0,
                    finish(
                        Exit(
                            128,
                            "StartError",
                            f"failed to start container {container.spec['name']!r}: {failure}",
                        )
                    ),
                )
                return
            if container.probe is not None:
                threading.Thread(
                    target=self._probe_loop,
                    args=(run, index, generation),
                    name=f"probe-{run.key[1]}",
                    daemon=True,
                ).start()
        else:
            try:
                seconds = _annotation_seconds(pod, RUN_SECONDS, None)
                code = int((pod["metadata"].get("annotations") or {}).get(EXIT_CODE, 0))
            except ValueError as failure:
                self.after(0, finish(Exit(128, "StartError", str(failure))))
                return
            if seconds is not None:
                self.after(seconds, lambda: run.hung or finish(Exit(code))())
        self.events.record(pod, "Started", f"Started container {container.spec['name']}", host=run.node)
        message = self._fabric_down.get(run.node)
        if message and run.gpus:  # NCCL finds its HCA port down at init and aborts the process
            self.after(NCCL_ABORT_S, lambda: self._abort(run, index, generation, Exit(1, "Error", message)))

    def _spawn(self, run: PodRun, pod: dict, index: int, generation: int) -> None:
        container = run.containers[index]
        if not run.workdir:
            run.workdir = tempfile.mkdtemp(prefix=f"devcluster-{run.key[1]}-")
        base = {**self.process_env, GPU_SPEED_ENV: str(self._gpu_speed(run))}
        env = self.loopback.rewrite(container_env(pod, container.spec, run, base), run.key[0])
        for port in container.spec.get("ports") or []:
            number = port["containerPort"]
            env[f"{PORT_ENV}{number}"] = str(self.loopback.pod_port(run.uid, number))
        argv = [
            expand(part, env)
            for part in (container.spec.get("command") or []) + (container.spec.get("args") or [])
        ]
        if not argv:
            raise ValueError("the local image has no entrypoint: set the container's command")
        process = subprocess.Popen(
            argv,
            cwd=run.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        container.process = process
        threading.Thread(
            target=self._pump, args=(run, index, generation, process), name=f"pod-{run.key[1]}", daemon=True
        ).start()

    def _pump(self, run: PodRun, index: int, generation: int, process: subprocess.Popen) -> None:
        """Copy a process's output to the pod log, then report its exit (runs on its own thread)."""
        for line in iter(process.stdout.readline, b""):
            self.logs.append(run.key[0], run.key[1], line.decode(errors="replace"))
        process.stdout.close()
        code = process.wait()
        exit = Exit(code if code >= 0 else 128 - code)
        self.after(0, lambda: self._exited(run, index, generation, exit))

    # ---- readiness ---------------------------------------------------------------------
    def _probe_loop(self, run: PodRun, index: int, generation: int) -> None:
        """Run one container's readiness probe until it ends; tell the controller thread each change."""
        container = run.containers[index]
        probe = container.probe
        period = max(1, int(probe.get("periodSeconds", 10)))
        needed = {True: int(probe.get("successThreshold", 1)), False: int(probe.get("failureThreshold", 3))}
        streak, verdict = (None, 0), False
        if self._closed.wait(float(probe.get("initialDelaySeconds", 0))):
            return
        while container.generation == generation and container.exit is None and not run.deleting:
            ok = self._probe_once(run, container.spec, probe)
            streak = (ok, streak[1] + 1 if streak[0] == ok else 1)
            if ok != verdict and streak[1] >= needed[ok]:
                verdict = ok
                self.after(0, lambda ok=ok: self._probed(run, index, generation, ok))
            if self._closed.wait(period):
                return

    def _probe_once(self, run: PodRun, spec: dict, probe: dict) -> bool:
        action = probe.get("httpGet") or probe.get("tcpSocket")
        port = action.get("port")
        if isinstance(port, str):  # a named container port
            port = next((p["containerPort"] for p in spec.get("ports") or [] if p.get("name") == port), None)
        local = self.loopback.pod_port_of(run.uid, port) if isinstance(port, int) else None
        if local is None:
            return False
        timeout = float(probe.get("timeoutSeconds", 1))
        connection = http.client.HTTPConnection("127.0.0.1", local, timeout=timeout)
        try:
            if "tcpSocket" in probe:
                connection.connect()
                return True
            connection.request("GET", action.get("path") or "/")
            return 200 <= connection.getresponse().status < 400
        except (OSError, http.client.HTTPException):
            return False
        finally:
            connection.close()

    def _probed(self, run: PodRun, index: int, generation: int, ready: bool) -> None:
        container = run.containers[index]
        if self._current(run) and container.generation == generation and container.running:
            container.probe_ready = ready
            self._report(run)

    # ---- exits and restarts ------------------------------------------------------------
    def _exited(self, run: PodRun, index: int, generation: int, exit: Exit) -> None:
        container = run.containers[index]
        if not self._current(run) or container.generation != generation or container.exit is not None:
            return
        container.process = None
        container.exit = container.forced or exit
        container.finished_at = now_iso()
        policy = self._restart_policy(run)
        restart = not run.deleting and (
            policy == "Always" or (policy == "OnFailure" and container.exit.code != 0)
        )
        if restart:
            container.last_exit = _terminated(container)
            container.restarts += 1
            container.exit, container.waiting = None, "CrashLoopBackOff"
            first, longest = RESTART_BACKOFF_S
            self.after(min(longest, first * 2 ** (container.restarts - 1)), lambda: self._restart(run, index))
        if all(c.exit is not None for c in run.containers):
            self._finish(run)
        else:
            self._report(run)

    def _restart(self, run: PodRun, index: int) -> None:
        if not self._current(run) or run.deleting or not run.containers[index].waiting:
            return
        pod = self.cache["pods"].get(run.key)
        if pod is None:
            return
        self._start_container(run, pod, index)
        self._report(run)

    def _restart_policy(self, run: PodRun) -> str:
        pod = self.cache["pods"].get(run.key)
        return (pod or {}).get("spec", {}).get("restartPolicy", "Always")

    def _finish(self, run: PodRun) -> None:
        """All containers ended: write the final status, free the node, and remove a deleted pod."""
        del self._runs[run.key]  # first: writing the status may bring us back here
        self._report(run)
        self._release(run)
        if run.deleting:
            pod = self.cache["pods"].get(run.key)
            if pod is not None:
                self._remove(pod)

    def _release(self, run: PodRun) -> None:
        self.loopback.forget_pod(run.uid)
        users = self._gpu_users.get(run.node, {})
        for gpu in run.gpus:
            users.pop(gpu, None)
        if run.gpus:
            self._update_training_activity(run.node)
        if run.workdir:
            shutil.rmtree(run.workdir, ignore_errors=True)
            run.workdir = ""

    # ---- stopping ----------------------------------------------------------------------
    def _terminate(self, run: PodRun, pod: dict) -> None:
        run.deleting = True
        if not run.started:
            self._release(run)
            del self._runs[run.key]
            self._remove(pod)
            return
        grace = pod["metadata"].get("deletionGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
        for index, container in enumerate(run.containers):
            if container.waiting:  # in back-off: nothing runs, it stays as it last ended
                container.exit = Exit(**_exit_fields(container.last_exit))
                container.waiting = ""
                continue
            if not container.running:
                continue
            self.events.record(pod, "Killing", f"Stopping container {container.spec['name']}", host=run.node)
            generation = container.generation
            if container.local:
                hold = min(prestop_seconds(container.spec), grace)
                if hold > 0:  # the preStop sleep first, then SIGTERM (within the grace period)
                    self.after(
                        hold, lambda index=index, generation=generation: self._sigterm(run, index, generation)
                    )
                else:
                    _signal(container.process, signal.SIGTERM)
            elif not run.hung:
                self._exited(run, index, generation, Exit(143))  # a simulated container exits on SIGTERM
                continue
            self.after(grace, lambda index=index, generation=generation: self._kill(run, index, generation))
        if self._current(run) and all(c.exit is not None for c in run.containers):
            self._finish(run)

    def _sigterm(self, run: PodRun, index: int, generation: int) -> None:
        container = run.containers[index]
        if self._current(run) and container.generation == generation and container.exit is None:
            _signal(container.process, signal.SIGTERM)

    def _kill(self, run: PodRun, index: int, generation: int) -> None:
        container = run.containers[index]
        if not self._current(run) or container.generation != generation or container.exit is not None:
            return
        if container.local:
            _signal(container.process, signal.SIGKILL)
        else:
            self._exited(run, index, generation, Exit(137))

    def _remove(self, pod: dict) -> None:
        """Remove a stopped pod's object (the kubelet's final delete; finalizers still hold it)."""
        current = self.store.find("pods", *key_of(pod))
        if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
            return
        if not current["metadata"].get("finalizers"):
            try:
                self.store.delete(
                    "pods", *key_of(pod), resource_version=current["metadata"]["resourceVersion"]
                )
            except (NotFound, Conflict):
                pass  # changed meanwhile: the next change brings us back here

    def _abandon(self, run: PodRun) -> None:
        """The pod object is gone: kill whatever still runs for it."""
        del self._runs[run.key]
        for container in run.containers:
            _signal(container.process, signal.SIGKILL)
            container.generation += 1
        self._release(run)

    # ---- status ------------------------------------------------------------------------
    def _report(self, run: PodRun) -> None:
        pod_phase = self._phase(run)

        def write(pod: dict) -> None:
            if pod["metadata"]["uid"] != run.uid:
                raise NotFound("replaced")
            status = pod.setdefault("status", {})
            status["phase"] = pod_phase
            status["hostIP"] = run.host_ip
            status["hostIPs"] = [{"ip": run.host_ip}]
            status["podIP"] = run.pod_ip
            status["podIPs"] = [{"ip": run.pod_ip}]
            status["startTime"] = run.start_time
            status["containerStatuses"] = [_container_status(run, c) for c in run.containers]
            terminal = pod_phase in ("Succeeded", "Failed")
            unready = [c.spec["name"] for c in run.containers if not c.ready]
            set_condition(pod, "PodReadyToStartContainers", "False" if terminal else "True")
            set_condition(pod, "Initialized", "True")
            for kind in ("Ready", "ContainersReady"):
                if terminal:
                    set_condition(pod, kind, "False", "PodCompleted")
                elif unready:
                    set_condition(
                        pod,
                        kind,
                        "False",
                        "ContainersNotReady",
                        f"containers with unready status: [{' '.join(unready)}]",
                    )
                else:
                    set_condition(pod, kind, "True")

        try:
            self.observe("pods", self.store.mutate("pods", *run.key, write))
        except NotFound:
            pass
        except StoreError:
            pass

    def _phase(self, run: PodRun) -> str:
        if not all(c.exit is not None for c in run.containers):
            return "Running"
        return "Succeeded" if all(c.exit.code == 0 for c in run.containers) else "Failed"

    # ---- GPUs --------------------------------------------------------------------------
    def _allocate_gpus(self, run: PodRun, node: dict, wanted: int) -> list[int]:
        if (
            not wanted
            or (node.get("metadata") or {}).get("labels", {}).get(VIRTUAL_NODE_LABEL) == VIRTUAL_NODE_VALUE
        ):
            return []
        total = _gpu_devices(node)
        users = self._gpu_users.setdefault(run.node, {})
        unhealthy = self._unhealthy.get(run.node, set())
        gpus = [i for i in range(total) if i not in users and i not in unhealthy][:wanted]
        for gpu in gpus:
            users[gpu] = run.key
        self._update_training_activity(run.node)
        return gpus

    def _gpu_speed(self, run: PodRun) -> float:
        """The speed factor of the slowest GPU the pod holds (1.0: none is slowed)."""
        telemetry = self.telemetry.get(run.node)
        if telemetry is None or not run.gpus:
            return 1.0
        with telemetry.lock:
            return min((gpu.speed_factor for gpu in telemetry.gpus if gpu.index in run.gpus), default=1.0)

    def _update_training_activity(self, node: str) -> None:
        telemetry = self.telemetry.get(node)
        if telemetry is not None:
            busy = any(
                not self._runs[key].hung
                for key in set(self._gpu_users.get(node, {}).values())
                if key in self._runs
            )
            telemetry.set_training_active(busy)

    # ---- used by faults (from any thread) ----------------------------------------------
    def call(self, work: Callable[[], object]) -> object:
        """Run ``work`` on this controller's thread and return its result (or raise its error)."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            return work()
        done = threading.Event()
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["value"] = work()
            except Exception as error:  # handed back to the caller
                outcome["error"] = error
            finally:
                done.set()

        self.after(0, run)
        if not done.wait(timeout=30):
            raise TimeoutError("the pod runtime did not answer")
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    def crash(self, namespace: str, name: str, exit: Exit) -> None:
        """End a running pod's containers now with ``exit`` (a crash, an OOM kill, a dead GPU)."""
        self.call(lambda: self._crash(self._running((namespace, name)), exit))

    def hang(self, namespace: str, name: str) -> None:
        """Freeze a running pod: it stays Running and makes no progress (processes get SIGSTOP)."""

        def freeze() -> None:
            run = self._running((namespace, name))
            run.hung = True
            for container in run.containers:
                _signal(container.process, signal.SIGSTOP)
            self._update_training_activity(run.node)

        self.call(freeze)

    def pods_on_gpus(self, node: str, gpu: int | None = None) -> list[Key]:
        """Running pods that hold GPU ``gpu`` of ``node`` (any GPU when ``None``)."""

        def find() -> list[Key]:
            users = self._gpu_users.get(node, {})
            keys = {key for index, key in users.items() if gpu is None or index == gpu}
            return sorted(key for key in keys if key in self._runs)

        return self.call(find)

    def gpu_unhealthy(self, node: str, gpu: int) -> None:
        """The node's device plugin reports GPU ``gpu`` Unhealthy: it is handed out no more and the
        kubelet reports ``status.allocatable`` without it (``status.capacity`` still counts it)."""

        def mark() -> None:
            self._unhealthy.setdefault(node, set()).add(gpu)
            self._write_gpu_allocatable(node)

        self.call(mark)

    def fabric_down(self, node: str, message: str) -> None:
        """The node's fabric port is down: each GPU container that starts there dies with ``message``
        ``NCCL_ABORT_S`` after it starts, until ``restore_node``."""
        self.call(lambda: self._fabric_down.__setitem__(node, message))

    def restore_node(self, node: str) -> None:
        """The node rebooted repaired: every GPU healthy and allocatable again, the fabric up."""

        def restore() -> None:
            self._fabric_down.pop(node, None)
            if self._unhealthy.pop(node, None):
                self._write_gpu_allocatable(node)

        self.call(restore)

    def unhealthy_gpus(self, node: str) -> list[int]:
        return self.call(lambda: sorted(self._unhealthy.get(node, ())))

    def _write_gpu_allocatable(self, node: str) -> None:
        """Report the node's healthy GPUs as allocatable, as the kubelet's device manager does."""
        unhealthy = self._unhealthy.get(node, set())

        def write(obj: dict) -> None:
            status = obj.setdefault("status", {})
            allocatable = status.setdefault("allocatable", {})
            capacity = status.setdefault("capacity", {})
            if (
                GPU_RESOURCE not in capacity
            ):  # a node written without capacity: its devices are all allocatable
                capacity[GPU_RESOURCE] = allocatable.get(GPU_RESOURCE, "0")
            total = int(capacity[GPU_RESOURCE])
            allocatable[GPU_RESOURCE] = str(total - len([i for i in unhealthy if i < total]))

        try:
            self.store.mutate("nodes", "", node, write)
        except NotFound:
            pass

    def running_pods(self, node: str) -> list[Key]:
        return self.call(
            lambda: sorted(key for key, run in self._runs.items() if run.node == node and run.started)
        )

    def _running(self, key: Key) -> PodRun:
        run = self._runs.get(key)
        if run is None or not run.started or run.deleting:
            raise PodNotRunning(f'pod "{key[1]}" is not running in namespace "{key[0]}"')
        return run

    def _crash(self, run: PodRun, exit: Exit) -> None:
        for index, container in enumerate(run.containers):
            if not container.running:
                continue
            if container.local:
                container.forced = exit
                _signal(container.process, signal.SIGKILL)
            else:
                self._exited(run, index, container.generation, exit)

    def _abort(self, run: PodRun, index: int, generation: int, exit: Exit) -> None:
        """One container of a running pod dies now with ``exit``, if it is still the run that started."""
        container = run.containers[index]
        if not self._current(run) or container.generation != generation or not container.running:
            return
        if container.local:
            container.forced = exit
            _signal(container.process, signal.SIGKILL)
        else:
            self._exited(run, index, generation, exit)

    def stop(self) -> None:
        self._closed.set()
        super().stop()
        for run in list(self._runs.values()):
            for container in run.containers:
                _signal(container.process, signal.SIGKILL)
            if run.workdir:
                shutil.rmtree(run.workdir, ignore_errors=True)


# ---- helpers ---------------------------------------------------------------------------
def _annotation_seconds(pod: dict, name: str, default: float | None) -> float | None:
    raw = (pod["metadata"].get("annotations") or {}).get(name)
    if raw is None:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if seconds < 0:
        raise ValueError(f"annotation {name}: invalid value {raw!r}: want a number of seconds >= 0")
    return seconds


def _gpu_devices(node: dict) -> int:
    """How many GPU devices the node has: its capacity (healthy or not), else its allocatable."""
    status = node.get("status") or {}
    count = (status.get("capacity") or {}).get(GPU_RESOURCE)
    return int(count if count is not None else (status.get("allocatable") or {}).get(GPU_RESOURCE, 0))


def prestop_seconds(container: dict) -> float:
    """How long a container's preStop hook holds SIGTERM back: a ``sleep`` action's seconds, or N of
    an ``exec`` of ``sleep N`` (other hooks are not run: 0)."""
    hook = (container.get("lifecycle") or {}).get("preStop") or {}
    if "sleep" in hook:
        return float((hook["sleep"] or {}).get("seconds", 0))
    match = re.search(
        r"\bsleep\s+(\d+(?:\.\d+)?)", " ".join(map(str, (hook.get("exec") or {}).get("command") or []))
    )
    return float(match.group(1)) if match else 0.0


def _signal(process: subprocess.Popen | None, signum: int) -> None:
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: a defined variable is replaced, ``$$`` is a literal ``$``."""

    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, str(text))


def field_ref(pod: dict, path: str, run: PodRun) -> str:
    """The value of a downward-API ``fieldRef``."""
    meta = pod["metadata"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": run.node,
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": run.pod_ip,
        "status.hostIP": run.host_ip,
    }
    if path in simple:
        return simple[path]
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if match:
        return (meta.get(match.group(1)) or {}).get(match.group(2), "")
    raise ValueError(f"env fieldRef.fieldPath {path!r} is not supported")


def container_env(pod: dict, spec: dict, run: PodRun, base: Mapping[str, str]) -> dict[str, str]:
    """A process container's environment: this process's, then ``base``, then the pod's own env."""
    env = {**os.environ, **base, "HOSTNAME": pod["spec"].get("hostname") or pod["metadata"]["name"]}
    if run.gpus:
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(str(g) for g in run.gpus)
    for item in spec.get("env") or []:
        if "value" in item or not item.get("valueFrom"):
            env[item["name"]] = expand(item.get("value", ""), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" not in source:
            raise ValueError(
                f"env {item['name']}: only value and valueFrom.fieldRef are supported, got {sorted(source)}"
            )
        env[item["name"]] = field_ref(pod, source["fieldRef"].get("fieldPath", ""), run)
    return env


def _terminated(container: Container) -> dict:
    exit = container.exit
    state = {
        "exitCode": exit.code,
        "reason": exit.shown_reason,
        "startedAt": container.started_at,
        "finishedAt": container.finished_at,
    }
    if exit.message:
        state["message"] = exit.message
    return state


def _exit_fields(terminated: dict | None) -> dict:
    terminated = terminated or {"exitCode": 137}
    return {
        "code": terminated["exitCode"],
        "reason": terminated.get("reason", ""),
        "message": terminated.get("message", ""),
    }


def _container_status(run: PodRun, container: Container) -> dict:
    name = container.spec["name"]
    status = {
        "name": name,
        "image": container.spec.get("image", ""),
        "imageID": container.spec.get("image", ""),
        "containerID": f"devcluster://{run.uid[:8]}-{name}-{container.generation}",
        "ready": container.ready,
        "started": container.running,
        "restartCount": container.restarts,
        "lastState": {"terminated": container.last_exit} if container.last_exit else {},
    }
    if container.exit is not None:
        status["state"] = {"terminated": _terminated(container)}
    elif container.waiting:
        status["state"] = {
            "waiting": {
                "reason": container.waiting,
                "message": f"back-off restarting failed container {name}",
            }
        }
    else:
        status["state"] = {"running": {"startedAt": container.started_at}}
    return status
