"""``GangTrainingOperator``: the training run as one deferrable task, resumed after crashes.

Every step is ``trainops.training.reconcile.TrainingRun.reconcile()``: it reads the run's attempts
from their Jobs (the cluster is the ledger), decides the one next step and takes it.  A try follows the
run's attempt when it is still alive, judges one that ended while nobody watched, and otherwise begins
a new attempt that resumes from the latest verified checkpoint (a fresh start when there is none).
It then defers to ``GangRunTrigger``, which follows the attempt, judges its end and, for a resume,
begins the next attempt at once and follows that, ``max_resumes`` times per run (a Clear gives a fresh
budget).  How an end is judged:

- infrastructure (node fault, XID, NCCL timeout, node lost, eviction), a hang, pods that never
  start: culprit nodes are quarantined with evidence and kept out, the attempt is stopped, and the
  run resumes on the other nodes (in the triggerer: no scheduler or worker round trip);
- user code (non-zero exit, no infrastructure evidence): the task fails at once, no resume used
  (``fail_fast_on_user_error=False`` resumes it instead). GPU errors the pods printed ("Xid 13",
  "CUDA error: an illegal memory access") are hints in the attempt's record: only the node's own
  word (its probe's ``GPUHealthy`` condition, not Ready, lost) blames and quarantines it;
- preemption by Kueue: not an end; the trigger keeps following the requeued attempt.

Elastic resume (``min_nodes`` below ``nodes``): a resume that finds fewer healthy nodes than ``nodes`` (a
culprit quarantined, no spare left) waits up to ``elastic_wait_s`` for more, then trains on the nodes
there are, never fewer than ``min_nodes``; each attempt's size is on its Job (and in the run view).

Airflow's ``retries`` are for a try that fails on its own (a worker lost, the API unreachable): the
next try reattaches to the run's Job, or judges and resumes it.  Every attempt is on its Job (number,
the try that began it, resume point, kept-out nodes, and once judged its end, verdict and culprits),
shown in the task's log and returned; ``on_kill`` stops the run and records the stop.

Its return value (XCom): run URI, Job, attempts, resumes used, preemptions, excluded nodes and
the latest verified checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from trainops.plugins.links import TrainingRunLink
from trainops.provider.errors import translate_errors

EVIDENCE_WAIT_S = 150.0  # the node probe publishes every 60 s: two rounds and a margin
ELASTIC_WAIT_S = 120.0  # a node back from a kubelet restart or a reboot; two rounds of the node probe


class GangTrainingOperator(BaseOperator):
    """Run ``command`` in ``image`` on ``nodes`` GPU nodes as one Kueue gang, resuming after crashes.

    :param image: the trainer's container image. Templated.
    :param command: the trainer's command (a list of strings). Templated.
    :param nodes: how many nodes the run trains on: one pod per node, started together as one gang. Templated.
    :param min_nodes: elastic resume: when a resume has fewer than ``nodes`` healthy nodes (a culprit
        quarantined, no spare left), it waits up to ``elastic_wait_s`` for more, then resumes on the nodes
        there are, never fewer than ``min_nodes``, from the last verified checkpoint; each pod learns the
        smaller world size from the same environment (``WORLD_SIZE``, ``PET_NNODES``, ``TRAINOPS_WORLD_SIZE``),
        and the trainer must load its checkpoint at that size (DCP reshards). A later resume goes back to
        ``nodes`` when they are free. None: ``nodes`` (off). From 1 to ``nodes``. Templated.
    :param elastic_wait_s: how long an elastic resume waits for nodes before it trains on fewer. Templated.
    :param gpus_per_node: GPUs each pod asks for (``nvidia.com/gpu``). Templated.
    :param args: arguments after ``command``. Templated.
    :param env: more environment variables for the trainer (``TRAINOPS_*`` are set by trainops). Templated.
    :param namespace: namespace of the Job (and of ``local_queue``).
    :param priority_class: the Kueue WorkloadPriorityClass of the run (preemption order). Templated.
    :param cpu: CPU request of each pod, e.g. ``"32"`` (None: none set).
    :param memory: memory request of each pod, e.g. ``"512Gi"`` (None: none set).
    :param termination_grace_seconds: seconds a stopped pod gets to save and exit before it is killed.
    :param heartbeat_poll: seconds between reads of the run's heartbeat while it trains.
    :param fail_fast_on_user_error: a failure with no infrastructure evidence fails the task at once (no
        resume used); False resumes it like an infrastructure failure.
    :param unconfirmed_fault_retries: a failure whose pods printed GPU or NCCL errors that no node confirms
        (an NCCL timeout on a flaky link looks like this) is resumed this many times per run, from the last
        verified checkpoint and without blaming a node, before it counts as the user's code.
    :param quarantine_culprits: quarantine (taint, label, evidence) the nodes blamed for a failure.
    :param evidence_wait_s: when the failed pods printed GPU or NCCL errors that no node confirms, how long
        to wait for the nodes' own health reports before judging it the user's code (the log is a hint only).
    :param check_queue: before the first Job, read ``local_queue`` and its ClusterQueue and fail at once,
        submitting nothing, when a resource the pods request is covered by none of its resource groups (Kueue
        would never admit it).  Turn it off only where Kueue's configuration excludes or transforms that
        resource (``resources.excludeResourcePrefixes``, ``transformations``); it turns off that coverage
        check only: under a Topology Aware Scheduling flavor the Kueue-release refusal (0.13.0-0.13.9,
        0.14.0-0.14.4) and the one-pod-per-node refusal run either way.  Queues it cannot read (RBAC)
        are logged and not checked; either way Kueue's own answer that it can never admit the request ends
        the attempt at once (``never_admitted``), not at ``admission_timeout``.
    :param kubernetes_conn_id: Airflow ``kubernetes`` connection of the cluster.
    :param retries: Airflow retries of this task (a try that failed on its own: the next one reattaches or
        resumes); also the resume budget when ``max_resumes`` is None.
    :param retry_delay: wait before such a retry (seconds or a ``timedelta``).
    :param run_uri: the run path in S3 (``s3://bucket/runs/<run>/``): checkpoints and heartbeat.
    :param local_queue: the Kueue LocalQueue in ``namespace`` (``queue`` is Airflow's executor queue).
    :param node_names: run only on these nodes (e.g. the claim task's XCom); default: the GPU pool.
    :param topology: where in the fabric Kueue places the gang, ``{"mode": "none"|"preferred"|"required",
        "level": <node label>, "levels": [...]}`` (``trainops.placement``): the PodSet annotation
        ``kueue.x-k8s.io/podset-<mode>-topology`` on the pod template; a TAS flavor (``deploy/kueue-queues.yaml``)
        then holds the pods behind Kueue's scheduling gate until it gives each its node. Templated.
    :param hang_timeout: seconds without progress that count as a hang; None learns it from the run.
        Progress is the heartbeat when the trainer writes one (``trainops.checkpoints.helper.heartbeat``),
        else new checkpoints under ``run_uri`` (see ``trainops.training.progress``).
    :param max_resumes: resume at most this many times per run, counted from its start or its last Clear
        (templated, so a DAG param can set it); None: as many as ``retries``.
    :param hang_policy: overrides of ``trainops.training.progress.HangPolicy`` fields.
    :param admission_timeout: seconds Kueue may take to admit the gang (None: wait forever).
    :param start_timeout: seconds from admission until every pod runs.
    :param kubeconfig: a kubeconfig file instead of the ``kubernetes_conn_id`` connection's.
    :param aws_conn_id: Airflow ``aws`` connection of the run path's S3 store (endpoint, credentials):
        the resume lookup and the heartbeat read through it.
    :param procs_per_node: processes per pod (torchrun's ``--nproc-per-node``, given as ``PET_NPROC_PER_NODE``);
        ``WORLD_SIZE`` is ``nodes * procs_per_node``.  Every pod also gets ``MASTER_ADDR`` (rank 0 behind the
        Job's headless Service), ``MASTER_PORT``, ``NODE_RANK`` and their ``PET_*`` forms.
    :param master_port: rank 0's rendezvous port.
    :param shm_size: size limit of the memory-backed ``/dev/shm`` (None: keep the 64 MiB container default).
    :param extra_resources: more devices for the trainer container, e.g. ``{"rdma/ib": "1"}`` or
        ``{"nvidia.com/hostdev": "8"}`` (requests and limits); the ClusterQueue must cover each (list them
        in the claim's ``run_resources``, which checks it before anything is claimed; see ``check_queue``).
    :param capabilities: Linux capabilities for the trainer container (an ``rdma/`` device in
        ``extra_resources`` adds ``IPC_LOCK`` itself; one outside the runtime's default set, like
        ``IPC_LOCK``, needs the namespace's Pod Security level to be "privileged").
    :param node_selector: node labels the pods require, besides the GPU pool's.
    :param volumes: pod volumes in API form (``[{"name": "data", "persistentVolumeClaim": {...}}]``).
    :param volume_mounts: the trainer container's mounts (``[{"name": "data", "mountPath": "/data"}]``).
    :param pod_template: anything else a pod may have, as a dict (``{"metadata": ..., "spec": ...}``) or a
        ``V1PodTemplateSpec``; a container named ``trainer`` merges into the training container.  It is merged
        under what trainops sets (queue label, training toleration, node pinning, resume env); a field set
        differently in both is refused before anything is submitted.
    """

    operator_extra_links = (TrainingRunLink(),)  # the run view of the UI plugin
    template_fields: Sequence[str] = (
        "image",
        "command",
        "args",
        "run_uri",
        "env",
        "node_names",
        "nodes",
        "gpus_per_node",
        "local_queue",
        "priority_class",
        "hang_timeout",
        "max_resumes",
        "topology",
        "min_nodes",
        "elastic_wait_s",
    )
    ui_color = "#d7ecff"

    def __init__(
        self,
        *,
        image: str,
        command: Sequence[str],
        run_uri: str,
        nodes: int = 1,
        min_nodes: int | None = None,
        elastic_wait_s: float = ELASTIC_WAIT_S,
        gpus_per_node: int = 8,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        namespace: str = "training",
        local_queue: str = "training",
        priority_class: str = "training-standard",
        node_names: Sequence[str] | None = None,
        topology: Mapping[str, Any] | None = None,
        cpu: str | None = None,
        memory: str | None = None,
        termination_grace_seconds: int = 30,
        procs_per_node: int = 1,
        master_port: int = 29500,
        shm_size: str | None = "16Gi",
        extra_resources: Mapping[str, str | int] | None = None,
        capabilities: Sequence[str] = (),
        node_selector: Mapping[str, str] | None = None,
        volumes: Sequence[Mapping[str, Any]] = (),
        volume_mounts: Sequence[Mapping[str, Any]] = (),
        pod_template: Any = None,
        hang_timeout: float | None = None,
        max_resumes: int | None = None,
        hang_policy: Mapping[str, Any] | None = None,
        admission_timeout: float | None = 3600.0,
        start_timeout: float = 600.0,
        heartbeat_poll: float = 2.0,
        fail_fast_on_user_error: bool = True,
        unconfirmed_fault_retries: int = 1,
        quarantine_culprits: bool = True,
        evidence_wait_s: float = EVIDENCE_WAIT_S,
        check_queue: bool = True,
        kubernetes_conn_id: str = "kubernetes_default",
        kubeconfig: str | None = None,
        aws_conn_id: str | None = "aws_default",
        retries: int = 3,
        retry_delay: timedelta | float = timedelta(seconds=5),
        **kwargs: Any,
    ) -> None:
        super().__init__(retries=retries, retry_delay=retry_delay, **kwargs)
        self.image, self.command, self.args, self.run_uri = image, command, args, run_uri
        self.nodes, self.gpus_per_node, self.env = nodes, gpus_per_node, dict(env or {})
        self.min_nodes, self.elastic_wait_s = min_nodes, elastic_wait_s
        self.namespace, self.local_queue, self.priority_class = namespace, local_queue, priority_class
        self.node_names = node_names or []
        self.topology = topology
        self.cpu, self.memory, self.termination_grace_seconds = cpu, memory, termination_grace_seconds
        self.procs_per_node, self.master_port, self.shm_size = procs_per_node, master_port, shm_size
        self.extra_resources, self.capabilities = dict(extra_resources or {}), list(capabilities)
        self.node_selector, self.pod_template = dict(node_selector or {}), pod_template
        self.volumes, self.volume_mounts = list(volumes), list(volume_mounts)
        self.hang_timeout, self.hang_policy = hang_timeout, dict(hang_policy or {})
        self.max_resumes = max_resumes
        self.admission_timeout, self.start_timeout, self.heartbeat_poll = (
            admission_timeout,
            start_timeout,
            heartbeat_poll,
        )
        self.fail_fast_on_user_error, self.quarantine_culprits = fail_fast_on_user_error, quarantine_culprits
        self.evidence_wait_s, self.unconfirmed_fault_retries = evidence_wait_s, unconfirmed_fault_retries
        self.check_queue = check_queue
        self.kubernetes_conn_id, self.kubeconfig = kubernetes_conn_id, kubeconfig
        self.aws_conn_id = aws_conn_id

    # ---- parts -------------------------------------------------------------------------
    def spec(self):
        from trainops.training.spec import TrainingSpec

        return TrainingSpec(
            image=self.image,
            command=list(self.command),
            args=list(self.args),
            run_uri=self.run_uri,
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            env=self.env,
            namespace=self.namespace,
            queue=self.local_queue,
            priority_class=self.priority_class,
            node_names=list(self.node_names),
            cpu=self.cpu,
            memory=self.memory,
            termination_grace_seconds=self.termination_grace_seconds,
            procs_per_node=self.procs_per_node,
            master_port=self.master_port,
            shm_size=self.shm_size,
            extra_resources=self.extra_resources,
            capabilities=self.capabilities,
            node_selector=self.node_selector,
            volumes=self.volumes,
            volume_mounts=self.volume_mounts,
            pod_template=self.pod_template,
            topology=dict(self.topology) if self.topology else None,
            min_nodes=self.min_nodes,
            elastic_wait_s=self.elastic_wait_s,
        )

    def follow_config(self):
        """How the trigger follows an attempt (its Job's name is filled in per attempt)."""
        from trainops.training.follow import FollowConfig
        from trainops.training.progress import HangPolicy

        return FollowConfig(
            namespace=self.namespace,
            job_name="",
            run_uri=self.spec().run_path,
            nodes=self.nodes,
            hang=HangPolicy(**{**self.hang_policy, "hang_timeout": self.hang_timeout}),
            admission_timeout=self.admission_timeout,
            start_timeout=self.start_timeout,
            heartbeat_poll=self.heartbeat_poll,
        )

    def training_run(self, context):
        """The run this try reconciles: its spec, its cluster and store, and its resume budget."""
        from trainops.hooks.checkpoint_store import CheckpointStoreHook
        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook

        from trainops.training.cluster import GangCluster
        from trainops.training.decide import Budget, Options
        from trainops.training.reconcile import TrainingRun

        ti = context["ti"]
        kube = KubernetesClusterHook(conn_id=self.kubernetes_conn_id, config_file=self.kubeconfig).kube()
        self._run = TrainingRun(
            GangCluster(kube),
            self.namespace,
            context["dag_run"].dag_id,
            context["dag_run"].run_id,
            spec=self.spec(),
            store=CheckpointStoreHook(aws_conn_id=self.aws_conn_id).get_store(),
            budget=Budget(try_number=ti.try_number, **self.resume_budget(ti)),
            options=Options(
                fail_fast_on_user_error=self.fail_fast_on_user_error,
                quarantine_culprits=self.quarantine_culprits,
                evidence_wait_s=self.evidence_wait_s,
                check_queue=self.check_queue,
            ),
            follow_config=self.follow_config(),
            logger=self.log,
        )
        return self._run

    def resume_budget(self, ti) -> dict:
        """The budget (one semantics for both, ``trainops.training.decide.Budget``): ``max_resumes`` (None:
        ``retries``) and ``unconfirmed_fault_retries`` resumes, counted from the run's first try or its last
        Clear: a Clear sets ``max_tries`` to its last try + ``retries``, so that try is
        ``max_tries - retries + 1``."""
        return {
            "first_try": ti.max_tries - self.retries + 1,
            "max_resumes": self.retries if self.max_resumes is None else int(self.max_resumes),
            "unconfirmed_fault_retries": self.unconfirmed_fault_retries,
        }

    # ---- Airflow -----------------------------------------------------------------------
    @translate_errors
    def execute(self, context):
        return self._next(self.training_run(context).reconcile())

    @translate_errors
    def execute_complete(self, context, event: dict):
        """The trigger ended the run (its event says how); what stands is what the cluster shows."""
        run = self.training_run(context)
        self.log.info("the trigger ended: %s", event.get("message"))
        return self._next(run.reconcile())

    def _next(self, action):
        """Succeed with the result, fail with the reason, or defer to follow the running attempt."""
        from trainops.triggers.training import GangRunTrigger

        from trainops.errors import PermanentError
        from trainops.training.decide import Fail, Follow, Succeed, Wait

        run = self._run
        if isinstance(action, Follow | Wait):  # the trigger follows the attempt, or waits for nodes
            trigger = GangRunTrigger(
                run.to_dict(), self.kubernetes_conn_id, self.kubeconfig, self.aws_conn_id
            )
            self.defer(trigger=trigger, method_name="execute_complete")
        ledger = run.observe()
        self.log.info("%d attempts, %d resumes", len(ledger.attempts), max(0, len(ledger.attempts) - 1))
        if isinstance(action, Succeed):
            return run.result(ledger)
        if isinstance(action, Fail):
            raise PermanentError(run.failure_message(action, ledger))
        raise PermanentError(f"the run did not settle: {action}")

    def on_kill(self) -> None:
        """The task was killed while this try reconciled in the worker: begin no attempt more in this
        process.  The run is not stopped here: a Clear of a running task restarts it in the same budget,
        and its next try follows the attempt; mark-failed is followed by the teardown, which stops it."""
        run = getattr(self, "_run", None)
        if run is not None:
            run.begin_nothing()
