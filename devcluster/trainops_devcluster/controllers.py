"""The simulated control plane, started in one call: ``start_controllers(...)``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainops_devcluster.admission import ValidatingAdmission
from trainops_devcluster.controller import Controller
from trainops_devcluster.daemonsets import DaemonSetController
from trainops_devcluster.deployments import DeploymentController
from trainops_devcluster.disruption import DisruptionController
from trainops_devcluster.endpointslices import EndpointSliceController
from trainops_devcluster.faults import Faults
from trainops_devcluster.gc import GarbageCollector
from trainops_devcluster.jobs import JobController
from trainops_devcluster.logs import PodLogs
from trainops_devcluster.nodes import NodeLifecycle
from trainops_devcluster.proxy import ServiceProxy
from trainops_devcluster.runtime import PodRuntime
from trainops_devcluster.scheduler import Scheduler
from trainops_devcluster.store import Store


@dataclass
class Controllers:
    scheduler: Scheduler
    runtime: PodRuntime
    jobs: JobController
    deployments: DeploymentController
    daemon_sets: DaemonSetController
    disruption: DisruptionController
    endpoint_slices: EndpointSliceController
    proxy: ServiceProxy
    nodes: NodeLifecycle
    garbage_collector: GarbageCollector
    faults: Faults

    def all(self) -> list[Controller]:
        return [
            self.nodes,
            self.scheduler,
            self.runtime,
            self.jobs,
            self.deployments,
            self.daemon_sets,
            self.disruption,
            self.endpoint_slices,
            self.proxy,
            self.garbage_collector,
        ]

    def stop(self) -> None:
        for controller in reversed(self.all()):
            controller.stop()


def start_controllers(
    store: Store,
    logs: PodLogs,
    telemetry: Mapping | None = None,
    process_env: Mapping[str, str] | None = None,
    admission: ValidatingAdmission | None = None,
    image_pull_s: float = 0.0,
) -> Controllers:
    """Start the scheduler, the kubelet (pod runtimes), the Job, Deployment, DaemonSet, disruption, EndpointSlice,
    service proxy, node lifecycle and garbage-collector controllers on ``store``; ``telemetry`` maps node names to
    ``NodeTelemetry``;
    ``process_env`` is laid over this process's environment for process-runtime pods; ``admission``: the API
    server's validating admission, which the pods the Job, Deployment and DaemonSet controllers create meet;
    ``image_pull_s``: how long the kubelet takes to pull an image a node lacks."""
    telemetry = telemetry if telemetry is not None else {}
    runtime = PodRuntime(store, logs, telemetry, process_env, image_pull_s)
    controllers = Controllers(
        scheduler=Scheduler(store),
        runtime=runtime,
        jobs=JobController(store, admission),
        deployments=DeploymentController(store, admission),
        daemon_sets=DaemonSetController(store, admission),
        disruption=DisruptionController(store),
        endpoint_slices=EndpointSliceController(store),
        proxy=ServiceProxy(store, runtime.loopback),
        nodes=NodeLifecycle(store),
        garbage_collector=GarbageCollector(store),
        faults=Faults(store, telemetry, runtime),
    )
    for controller in controllers.all():
        controller.start()
    return controllers
