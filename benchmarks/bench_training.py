"""Crash-to-resume on the devcluster: trainops' watch-based follower and resume against the cncf
provider's ``KubernetesJobTrigger`` (what ``KubernetesJobOperator(deferrable=True,
wait_until_job_complete=True)`` defers to, default ``job_poll_interval``) plus an Airflow retry
with the same ``retry_delay`` and a resubmit from scratch.  Same cluster, same trainer, same fault
(XID 79 on rank 0's node at step >= 50), in one run.

Lines: failure seen after the pod failed; crash -> next attempt's Job created (ratio vs baseline);
training steps lost per crash (vs a restart from scratch).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

RETRY_DELAY_S = 1.0
CHECKPOINT_EVERY = 20
ARGS = ["--steps", "100000", "--checkpoint-every", str(CHECKPOINT_EVERY), "--step-seconds", "0.02"]


def line(name: str, figures: str, ratio: float, target: str, ok: bool) -> None:
    print(f"bench {name}: {figures} ratio={ratio:.2f} target={target} {'PASS' if ok else 'FAIL'}", flush=True)


def main() -> int:
    import os

    from kubernetes import client, config

    from trainops.cluster.capacity import Apis, claim
    from trainops.devcluster.cluster import DevCluster
    from trainops.devcluster.local_s3 import local_s3
    from trainops.training.attempts import RunLedger
    from trainops.training.blame import quarantine_node
    from trainops.training.cluster import GangCluster
    from trainops.training.follow import FollowConfig, RunFollower, read_heartbeat, stop
    from trainops.training.kube import kubeconfig_client
    from trainops.training.progress import HangPolicy
    from trainops.training.runner import GangRun
    from trainops.training.spec import TrainingSpec

    with local_s3() as s3, DevCluster(nodes=16, gpus_per_node=8, process_env=s3.env()) as dev:
        from trainops.devcluster.airflow_home import kubernetes_connection

        os.environ.update(s3.env())
        os.environ["KUBECONFIG"] = str(dev.kubeconfig)
        os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = kubernetes_connection(dev.kubeconfig)
        s3.create_bucket("bench-training")
        dev.wait_until_settled()
        api = config.new_client_from_config(config_file=str(dev.kubeconfig))
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        pods = json.loads(core.list_pod_for_all_namespaces(_preload_content=False).data)["items"]
        busy = {p["spec"].get("nodeName") for p in pods}
        nodes = json.loads(core.list_node(_preload_content=False).data)["items"]
        idle = sorted(n["metadata"]["name"] for n in nodes if n["metadata"]["name"] not in busy)
        claim(Apis.from_api_client(api), "bench/training", idle, cluster_queue="training")
        factory = lambda: kubeconfig_client(str(dev.kubeconfig))  # noqa: E731

        def crash_when_running(run_uri: str, attempt: str, at: dict) -> threading.Thread:
            def loop():
                while (read_heartbeat(run_uri) or {}).get("step", 0) < 50:
                    time.sleep(0.02)
                listed = json.loads(core.list_namespaced_pod("training", _preload_content=False).data)[
                    "items"
                ]
                pod = next(p for p in listed if p["metadata"]["labels"].get("trainops.io/attempt") == attempt)
                at["step"] = read_heartbeat(run_uri)["step"]
                at["time"] = time.time()
                dev.inject("xid", pod["spec"]["nodeName"], code=79)

            thread = threading.Thread(target=loop, daemon=True)
            thread.start()
            return thread

        def spec(run: str) -> TrainingSpec:
            return TrainingSpec(
                image="devcluster.trainops.io/local",
                command=[sys.executable, "-m", "trainops.demo.trainer"],
                args=ARGS,
                run_uri=f"s3://bench-training/runs/{run}/",
                nodes=2,
            )

        # ---- trainops ------------------------------------------------------------------
        ours = spec("trainops")
        run = GangRun(
            ours,
            "bench",
            "trainops",
            GangCluster(core, batch),
            RunLedger(),
            lambda ledger: None,
            lambda job: asyncio.run(stop(factory, "training", job)),
            lambda n, r, e: quarantine_node(core, n, r, e),
        )
        record, _ = run.start(lambda n: 2)
        crash: dict = {}
        crash_when_running(ours.run_path, "1", crash)
        follow = FollowConfig(
            "training", record.job, ours.run_path, 2, HangPolicy(floor=30), heartbeat_poll=0.5
        )
        outcome = asyncio.run(RunFollower(follow, factory).follow())
        seen = outcome.seen_at - crash["time"]
        run.finish(outcome.to_dict())
        time.sleep(RETRY_DELAY_S)  # the same Airflow retry delay as the baseline
        resumed, _ = run.start(lambda n: 2)
        ours_latency = time.time() - crash["time"]
        lost = crash["step"] - (resumed.resume_step or 0)
        asyncio.run(stop(factory, "training", resumed.job))

        # ---- baseline: KubernetesJobTrigger, Airflow retry, resubmit from scratch -----------
        from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger

        base = spec("baseline")
        baseline = GangRun(
            base,
            "bench",
            "baseline",
            GangCluster(core, batch),
            RunLedger(),
            lambda ledger: None,
            lambda job: "",
            lambda *a: False,
        )
        record, _ = baseline.start(lambda n: 2)
        crash_b: dict = {}
        crash_when_running(base.run_path, "1", crash_b)
        trigger = KubernetesJobTrigger(
            job_name=record.job,
            job_namespace="training",
            pod_names=[],
            pod_namespace="training",
            base_container_name="trainer",
            config_file=str(dev.kubeconfig),
            get_logs=False,
        )

        async def first_event():
            async for event in trigger.run():
                return event

        asyncio.run(first_event())
        seen_b = time.time() - crash_b["time"]
        time.sleep(RETRY_DELAY_S)
        baseline.ledger.end("infrastructure", "the provider's trigger reported the Job failed")
        baseline.start(lambda n: 2)  # the retry resubmits the Job
        base_latency = time.time() - crash_b["time"]

    line(
        "training-failure-seen",
        f"trainops={seen:.2f}s provider_trigger={seen_b:.2f}s",
        seen_b / max(seen, 1e-3),
        "seen<=1s",
        seen <= 1.0,
    )
    speedup = base_latency / ours_latency
    line(
        "training-crash-to-resumed-job",
        f"trainops={ours_latency:.2f}s baseline={base_latency:.2f}s retry_delay={RETRY_DELAY_S:g}s",
        speedup,
        ">=5",
        speedup >= 5,
    )
    ratio = lost / max(crash["step"], 1)
    line(
        "training-steps-lost-per-crash",
        f"trainops={lost} from_scratch={crash['step']} checkpoint_interval={CHECKPOINT_EVERY}",
        ratio,
        f"lost<={CHECKPOINT_EVERY}",
        lost <= CHECKPOINT_EVERY,
    )
    return 0 if seen <= 1.0 and speedup >= 5 and lost <= CHECKPOINT_EVERY else 1


if __name__ == "__main__":
    sys.exit(main())
