"""What the Airflow UI shows for a lifecycle DAG and each of its tasks (``doc_md``), in Markdown."""

LIFECYCLE_DOC = """
# GPU training lifecycle

One DAG run is one training run on the Kubernetes GPU cluster that serves inference the rest of the time:

0. **preflight** (off unless the `preflight` param is true) runs `trainops doctor`: it reads the cluster and
   fails naming each setup problem and its fix, before anything is touched.
1. **reserve_run_path** makes `<checkpoint_uri>/<run_name>/` this DAG run's (a name another run owns
   fails here, before any node is touched). **health_gate** reads every GPU node's health report and quarantines the failing ones.
2. **claim_nodes** (setup) borrows `nodes + spare_nodes` healthy nodes from inference: drains them
   (PodDisruptionBudgets honoured), flips their mode taint to training, raises the Kueue quota.
   **fabric_ready** then re-checks the claimed nodes' InfiniBand ports (`fabric_gate`).
3. **train** submits the run to Kueue as one gang and follows it. A crash on bad hardware quarantines
   the node and resumes from the last *verified* checkpoint on the spare, at once (in the triggerer).
4. **verify_checkpoint** verifies the final checkpoint and publishes it as an Asset for evaluation or serving.
5. **return_capacity** (teardown) always gives the nodes back to inference, even when a task failed or
   the run was marked failed by hand.

Checkpoints live under `<checkpoint_uri>/<run_name>/`, which one DAG run owns. Leave `run_name` empty
and each DAG run gets its own, derived from the DAG run (`<dag>-<date>-<time>-<hash>`), so triggering
twice gives two runs; a second run with a name another run already used is refused. A "Clear" on **train** re-runs the gate and the claim with it (they
are setups), so the run resumes from the latest verified checkpoint, with a fresh `max_resumes`
budget, on nodes that pass the gate again. If **return_capacity** fails after its retries, the DAG
run fails (GPUs may still be held): run `trainops capacity return --run <dag_id>/<run_id>`.
"""

PREFLIGHT_DOC = """
Off unless the `preflight` param is true. Then it runs `trainops doctor` against the cluster, reading only:
GPU Operator, the node probe and its reports, dcgm-exporter in Prometheus (`prometheus_conn_id`), Kueue and
its queues, DaemonSet tolerations, Pod Security levels, the probe's admission policy, and the worker's own
permissions. The log has one line per check.

**When it fails:** the log names each problem and its fix; nothing was touched. Fix them and trigger again
(the worker's account needs `deploy/doctor-rbac.yaml` to read what the checks read).
"""

RESERVE_DOC = """
Makes the run path `<checkpoint_uri>/<run_name>/` this DAG run's (`trainops-run.json`, written once), before
anything touches the cluster. With `run_name` empty the name is derived from the DAG run, unique per run.

**When it fails:** another DAG run owns the path (the log names it); nothing was claimed or quarantined.
Trigger again with `run_name` empty or another name; to continue that run on purpose, delete its
`trainops-run.json` first.
"""

GATE_DOC = """
Reads the health report the node probe published on each GPU node (NVML, XIDs, ECC, NVLink, InfiniBand),
and, with `prometheus_conn_id`, DCGM metrics from Prometheus,
applies the health policy (plus `health_policy_overrides`), quarantines failing nodes with the evidence
on the node, and chooses at least `nodes + spare_nodes` healthy nodes of like speed, each with
`gpus_per_node` allocatable GPUs. What a node's hardware does not have (NVLink on a PCIe card, ECC with
ECC off, row remapping under MIG) is shown as not applicable, never held against it; RDMA ports are
judged by each node's fabric (`fabrics`, picked by its `trainops.io/fabric` label); XIDs from
Prometheus and slowdowns seen in training keep a node out for `fault_window_s`. When the cluster cannot ever hold the run (fewer GPU nodes than asked
for, or none with `gpus_per_node` GPUs) it fails at once and writes nothing. With `topology` set it also
places the run among them (one `topology_level` domain, or the fewest); `required` and no domain holds
`nodes` healthy ones: not enough, and the log names the largest domains. With `gpu_memory_gib` set, a
warning names the memory risk of an elastic resume on `min_nodes` (the peak grown by `nodes/min_nodes`)
against the chosen GPUs' `nvidia.com/gpu.memory`, with the smallest safe `min_nodes`.

**When it fails:** the log has one line per node with its verdict and reason. Too few healthy nodes:
wait for repairs, lower `nodes`/`spare_nodes`, or set `health_wait_s` so the gate waits (deferred).
A quarantined node is released with `trainops health release <node>` after repair.
"""

FABRIC_DOC = """
Checks the RDMA ports of the claimed nodes' fabrics (`fabrics`) once more right before training (links flap while
nodes are drained, and a bad link shows up as an NCCL hang hours later), and hands the nodes that pass
to **train**; waits (deferred) up to 10 minutes for `nodes` of them. With `fabric_gate` off it only
checks that each node's health report is fresh. Reads `prometheus_conn_id` too when set.
"""

CLAIM_DOC = """
Setup task. First, with reads only, checks that `kueue_queue` sends runs to `cluster_queue`, that this
ClusterQueue covers every resource the run's pods request and that `priority_class` exists: a run Kueue
could never admit fails here, naming the fix, before anything is claimed. Then it takes
`nodes + spare_nodes` of the gate's nodes, the least disruptive first (idle ones, then those running the
fewest inference pods); with `topology`, first the smallest `topology_level` domain that holds the run
(Kueue's best fit), the spares beside it (its rack, then its block). It checks no other run holds them,
flips their `trainops.io/mode`
taint to `training`, scales down `inference_workloads` that ran there (their pods on these nodes first)
and evicts what is left through the Eviction API (PodDisruptionBudgets honoured), pulls `image` onto every
claimed node (so a resume onto a spare pays no pull: the spares are hot), and raises the training
ClusterQueue's GPU quota. A Deployment with an overflow pool (`overflow_pool`, or its own
`trainops.io/overflow-pool` annotation) first gets as many replicas Ready in that pool as it has room for,
in a companion Deployment `<name>-overflow`, before its pods here go; the log and the result say what could
and could not be offloaded. Every change is recorded on the objects so the teardown undoes exactly it.

**When it fails:** it gives back whatever it took before failing. Nodes held by another run are named in
the log; wait for that run or choose other nodes.
"""

TRAIN_DOC = """
Submits the run as one Kueue gang (an Indexed Job, one pod per node) and follows the Workload, the Job,
its pods and the run's heartbeat without polling blindly, in the triggerer. With `topology` the pod
template asks Kueue for it (`kueue.x-k8s.io/podset-<preferred|required>-topology`): the pods wait behind
Kueue's scheduling gate until it gives each its node, among the claimed ones.

- infrastructure failure (XID, node lost, NCCL timeout, eviction) or a hang: the culprit node is
  quarantined with evidence and the run resumes at once from the latest verified checkpoint on the
  other claimed nodes (a new attempt, same try), at most `max_resumes` times;
- user code failure (non-zero exit, no hardware evidence): fails at once, no resume used; when the pods
  printed GPU or NCCL errors no node confirms, it first gets one resume of its own (a flaky link looks so);
- preemption by a higher-priority Workload: Kueue requeues it; it keeps waiting, no resume used.

With `min_nodes` below `nodes` (elastic resume), a resume short of healthy nodes (no spare left) waits up to
`elastic_wait_s` for one, then trains on the nodes there are, never fewer than `min_nodes`; the log and the
Training run tab show each attempt's size.

Airflow's retries are for a try that fails on its own (a worker lost, the API unreachable): the next
try reattaches to the running Job, or judges and resumes it.

**When it fails:** the log names each attempt, where it resumed from and why it ended.
Fix the code (user error) or the nodes, then "Clear" this task to resume from the latest verified checkpoint.
Marking it failed stops the Job; the teardown still returns the nodes.
"""

VERIFY_DOC = """
Verifies the newest complete checkpoint under the run path by its metadata (manifest and `_COMMITTED`
marker, or the format's own index) without downloading it, and publishes it as this DAG's
`final-checkpoint` Asset: the event's extra holds `uri`, `step` and `format` for evaluation or serving DAGs.

**When it fails:** no checkpoint under the run path verifies; the log lists each one skipped and why.
A "Clear" on this task verifies again alone: it claims no nodes.
"""

RETURN_DOC = """
Teardown: runs whatever happened before, also after a user marks the run failed. Lowers the training
quota, flips the nodes this run claimed back to inference (quarantined nodes keep their quarantine),
repays the inference replicas it borrowed and waits until inference is Ready again. Replicas that served
from an overflow pool come back in waves of `return_wave_nodes` nodes: after each wave the Deployment
scales up on the returned nodes, and only once those replicas are Ready does the overflow shrink by as
many. It works from what the cluster records, so it is safe to run twice, and a retry resumes a return
that stopped halfway.

**When it fails** (after its retries; the DAG run then fails too, never a silent success): run
`trainops capacity return --run <dag_id>/<run_id>` (the log shows the exact command) or clear this task.
"""
