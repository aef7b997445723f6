"""Crash -> training again, elastic resume (no spare: go on with the nodes that remain) against waiting for
a replacement node, side by side in one run on one devcluster.

Both sides: the training run itself (``TrainingRun.follow_to_end``, as the trigger runs it), 3 nodes
with the demo trainer, the same fault (the node of rank 0 stops responding once the heartbeat reaches
step 50: its pods die, it is quarantined), no spare.  A fourth node of the run is still being readied
(in inference mode) and joins ``REPLACEMENT_S`` after the crash: the replacement.

- baseline, ``min_nodes`` unset: the resume asks for 3 nodes and Kueue holds it until the replacement
  joins;
- elastic, ``min_nodes=2``, ``elastic_wait_s=ELASTIC_WAIT_S``: after that wait it trains on the 2 nodes.

Time lost: crash -> every pod of the next attempt running.  GPU-seconds lost: the healthy GPUs the run
holds while none train (2 nodes x 8 GPUs x the time lost) plus the steps redone since the checkpoint it
resumed from (at 3 nodes).  Not counted: the elastic run then trains at 2/3 of the speed until its next
resume (the figures say so).  The figures scale with ``REPLACEMENT_S``: a real replacement (a repair, a
new node) takes minutes to hours.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

from crash_resume import ARGS, NAMESPACE, Timeline, crash_first_attempt, line
from results import record

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the campaign's trigger client
from benchmarks.campaign.steps import async_client  # noqa: E402

GPUS, NODES, MIN_NODES = 8, 3, 2
REPLACEMENT_S = 30.0
ELASTIC_WAIT_S = 5.0
STEP_S = 0.02  # the trainer's --step-seconds in ARGS


def set_mode(kube, node: str, mode: str) -> None:
    """What a claim does to a node's mode taint (the replacement is readied, then joins)."""
    from trainops.conventions import MODE_TAINT
    from trainops.kube.client import NODES as NODE_KIND

    current = kube.get(NODE_KIND, node)
    taints = [t for t in current["spec"].get("taints") or [] if t["key"] != MODE_TAINT]
    taints.append({"key": MODE_TAINT, "value": mode, "effect": "NoSchedule"})
    kube.patch(NODE_KIND, node, {"spec": {"taints": taints}})


def run_side(dev, kube, timeline: Timeline, name: str, nodes: list[str], min_nodes: int | None) -> dict:
    from trainops.capacity.procedure import claim
    from trainops.checkpoints.store import CheckpointStore
    from trainops.training.cluster import GangCluster
    from trainops.training.decide import Budget, Succeed
    from trainops.training.follow import FollowConfig
    from trainops.training.reconcile import TrainingRun
    from trainops.training.spec import TrainingSpec

    run_uri = f"s3://bench-elastic/runs/{name}/"
    claim(kube, f"bench/{name}", nodes, cluster_queue="training")
    replacement = nodes[-1]
    set_mode(kube, replacement, "inference")  # not ready yet
    spec = TrainingSpec(
        image="devcluster.trainops.io/local",
        command=[sys.executable, "-m", "trainops_devcluster.demo.trainer"],
        args=ARGS,
        run_uri=run_uri,
        nodes=NODES,
        gpus_per_node=GPUS,
        node_names=nodes,
        min_nodes=min_nodes,
        elastic_wait_s=ELASTIC_WAIT_S,
    )
    since = time.time()
    crash = crash_first_attempt(
        timeline,
        run_uri,
        since,
        inject_xid=lambda node: dev.inject("node-notready", node),
        read_log=lambda pod: dev.logs.read(NAMESPACE, pod),
    )

    def replace_later():
        crash.done.wait()
        time.sleep(max(0.0, crash.time + REPLACEMENT_S - time.time()))
        set_mode(kube, replacement, "training")

    threading.Thread(target=replace_later, daemon=True).start()
    run = TrainingRun(
        GangCluster(kube),
        NAMESPACE,
        "bench",
        name,
        spec=spec,
        store=CheckpointStore(),
        budget=Budget(max_resumes=2),
        follow_config=FollowConfig(NAMESPACE, "", spec.run_path, NODES, heartbeat_poll=0.2),
    )
    action = asyncio.run(run.follow_to_end(run.follower(async_client(str(dev.kubeconfig)))))
    if not isinstance(action, Succeed) or not crash.done.is_set() or crash.resumed_step is None:
        raise RuntimeError(f"{name}: {action}; fault injected: {crash.done.is_set()}")
    second = run.observe().attempts[1]
    again = timeline.all_running(second.job, second.nodes)
    lost_s = again - crash.time
    redone = crash.step - crash.resumed_step
    return {
        "lost_s": lost_s,
        "gpu_s": (NODES - 1) * GPUS * lost_s + redone * STEP_S * NODES * GPUS,
        "nodes": second.nodes,
        "redone": redone,
    }


def main() -> int:
    from trainops_devcluster.cluster import DevCluster
    from trainops_devcluster.local_s3 import local_s3

    from trainops.kube.client import Kube

    with local_s3() as s3, DevCluster(nodes=32, gpus_per_node=GPUS, process_env=s3.env()) as dev:
        os.environ.update(s3.env())
        s3.create_bucket("bench-elastic")
        dev.wait_until_settled()
        kube = Kube.from_kubeconfig(str(dev.kubeconfig))
        timeline = Timeline()
        dev.store.add_listener(lambda event: timeline.record(event.resource, event.type, event.object))
        idle = idle_nodes(kube)
        base = run_side(dev, kube, timeline, "replacement", idle[: NODES + 1], None)
        ours = run_side(dev, kube, timeline, "elastic", idle[NODES + 1 : 2 * NODES + 2], MIN_NODES)
    ratio = base["gpu_s"] / ours["gpu_s"]
    line(
        "elastic-resume-vs-replacement",
        f"elastic: training again after {ours['lost_s']:.1f}s on {ours['nodes']} of {NODES} nodes, "
        f"{ours['gpu_s']:.0f} GPU-s lost; waiting for a replacement: {base['lost_s']:.1f}s on {base['nodes']}, "
        f"{base['gpu_s']:.0f} GPU-s lost (replacement after {REPLACEMENT_S:g}s, elastic_wait_s={ELASTIC_WAIT_S:g}, "
        f"steps redone {ours['redone']}/{base['redone']}; the elastic run then trains at {MIN_NODES}/{NODES} speed "
        "until its next resume)",
        ratio,
        ">=2",
        ratio >= 2 and ours["nodes"] == MIN_NODES and base["nodes"] == NODES,
    )
    record(
        "elastic-resume-vs-replacement",
        passed=ratio >= 2 and ours["nodes"] == MIN_NODES and base["nodes"] == NODES,
        ratio=round(ratio, 3),
        target=">=2",
        elastic_gpu_s=round(ours["gpu_s"], 1),
        replacement_gpu_s=round(base["gpu_s"], 1),
        elastic_lost_s=round(ours["lost_s"], 2),
        replacement_lost_s=round(base["lost_s"], 2),
        elastic_nodes=ours["nodes"],
        steps_redone=f"{ours['redone']}/{base['redone']}",
    )
    return 0 if ratio >= 2 else 1


def idle_nodes(kube) -> list[str]:
    """GPU nodes no pod runs on (each side takes its own)."""
    from trainops.kube.client import NODES as NODE_KIND
    from trainops.kube.client import PODS

    busy = {(p.get("spec") or {}).get("nodeName") for p in kube.list(PODS)}
    return sorted(n["metadata"]["name"] for n in kube.list(NODE_KIND) if n["metadata"]["name"] not in busy)


if __name__ == "__main__":
    sys.exit(main())
