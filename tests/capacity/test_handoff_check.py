"""The hand-off check, as tables: which fields of a Deployment's pod template or an InferenceService's
predictor keep its pods from leaving without failing requests, and the fix each finding names."""

from __future__ import annotations

import pytest

from trainops.capacity import handoff
from trainops.capacity.handoff import check_choice, check_pod_spec, check_workload, detach_keys, prestop_s

PROBE = {"httpGet": {"path": "/health", "port": 8000}}
SLEEP = {"preStop": {"sleep": {"seconds": 10}}}
VLLM = ["vllm", "serve", "meta-llama/Llama-3.1-8B"]


def spec(container: dict, **pod) -> dict:
    return {"containers": [{"name": "server", "ports": [{"containerPort": 8000}], **container}], **pod}


def fields(findings) -> list[str]:
    return [f.field for f in findings]


C = "spec.template.spec.containers[0]"


@pytest.mark.parametrize(
    ("container", "pod", "expected"),
    [
        # vLLM as its docs set it up: probe, preStop sleep, --shutdown-timeout, grace above both
        (
            {"command": VLLM, "args": ["--shutdown-timeout=30"], "readinessProbe": PROBE, "lifecycle": SLEEP},
            {"terminationGracePeriodSeconds": 60},
            [],
        ),
        # nothing set: no probe, no preStop; vLLM's default aborts in-flight requests
        ({"command": VLLM}, {}, [f"{C}.readinessProbe", f"{C}.lifecycle.preStop", f"{C}.args"]),
        # a preStop no longer than the endpoint propagation (5 s) is too short
        (
            {
                "command": VLLM,
                "args": ["--shutdown-timeout", "10"],
                "readinessProbe": PROBE,
                "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "sleep 5"]}}},
            },
            {"terminationGracePeriodSeconds": 60},
            [f"{C}.lifecycle.preStop"],
        ),
        # grace period not above preStop + --shutdown-timeout: SIGKILL mid-drain
        (
            {"command": VLLM, "args": ["--shutdown-timeout=25"], "readinessProbe": PROBE, "lifecycle": SLEEP},
            {},
            ["spec.template.spec.terminationGracePeriodSeconds"],
        ),
        # Triton drains 30 s by default after SIGTERM (--exit-timeout-secs): 30 s of grace is not enough
        (
            {"image": "nvcr.io/nvidia/tritonserver:25.01-py3", "readinessProbe": PROBE, "lifecycle": SLEEP},
            {},
            ["spec.template.spec.terminationGracePeriodSeconds"],
        ),
        (
            {
                "image": "nvcr.io/nvidia/tritonserver:25.01-py3",
                "args": ["--exit-timeout-secs=10"],
                "readinessProbe": PROBE,
                "lifecycle": SLEEP,
            },
            {},
            [],
        ),
        # a generic server with a probe and a long enough sleep
        ({"image": "example/server", "readinessProbe": PROBE, "lifecycle": SLEEP}, {}, []),
        # a preStop script of its own (its length unknown) is trusted to wait for the endpoint
        (
            {
                "image": "example/server",
                "readinessProbe": PROBE,
                "lifecycle": {"preStop": {"exec": {"command": ["/drain.sh"]}}},
            },
            {},
            [],
        ),
    ],
)
def test_check_pod_spec(container, pod, expected):
    assert fields(check_pod_spec("Deployment inference/chat", spec(container, **pod))) == expected


def test_each_finding_names_the_field_and_the_documented_fix():
    findings = check_pod_spec("Deployment inference/chat", spec({"command": VLLM}))
    text = "\n".join(str(f) for f in findings)
    assert "Deployment inference/chat: spec.template.spec.containers[0].readinessProbe" in text
    assert "/health" in text and "preStop: {sleep: {seconds: N}}" in text and "--shutdown-timeout" in text


def test_the_propagation_setting_moves_the_bar():
    container = {"image": "example/server", "readinessProbe": PROBE, "lifecycle": SLEEP}
    assert check_pod_spec("w", spec(container), propagation_s=5) == []
    assert fields(check_pod_spec("w", spec(container), propagation_s=10)) == [f"{C}.lifecycle.preStop"]


def test_only_serving_containers_are_checked():
    pod = {
        "containers": [
            {"name": "sidecar", "image": "example/log-shipper"},
            {
                "name": "server",
                "image": "example/server",
                "ports": [{"containerPort": 80}],
                "readinessProbe": PROBE,
                "lifecycle": SLEEP,
            },
        ]
    }
    assert check_pod_spec("w", pod) == []


def test_an_inference_service_is_read_from_its_predictor_with_kserves_fixes(caplog):
    """A custom predictor's containers are judged; a predictor.model's probes and preStop come from
    its ServingRuntime, not read: it cannot be judged, is treated as clean, and a warning says so."""
    isvc = {
        "metadata": {"namespace": "inference", "name": "llm"},
        "spec": {"predictor": {"containers": [{"name": "kserve-container", "image": "example/server"}]}},
    }
    findings = check_workload("InferenceService", isvc)
    assert fields(findings) == [
        "spec.predictor.containers[0].readinessProbe",
        "spec.predictor.containers[0].lifecycle.preStop",
    ]
    assert "kserve/kserve#5496" in findings[1].fix

    model = {"modelFormat": {"name": "huggingface"}, "runtime": "kserve-huggingfaceserver"}
    isvc["spec"]["predictor"] = {"model": {**model, "args": ["--model_name=llm"]}}
    with caplog.at_level("WARNING"):
        assert check_workload("InferenceService", isvc) == []
    assert (
        "InferenceService inference/llm: cannot judge its hand-off: the probes and preStop come from "
        "its ServingRuntime kserve-huggingfaceserver" in caplog.text
    )


def test_a_deployment_is_read_from_its_pod_template():
    deployment = {
        "metadata": {"namespace": "inference", "name": "chat"},
        "spec": {"template": {"spec": spec({"image": "example/server", "readinessProbe": PROBE})}},
    }
    assert [str(f).split(":")[0] for f in check_workload("Deployment", deployment)] == [
        "Deployment inference/chat"
    ]


@pytest.mark.parametrize(
    ("hook", "seconds"),
    [
        (None, None),
        ({"preStop": {"sleep": {"seconds": 7}}}, 7),
        ({"preStop": {"exec": {"command": ["sleep", "12"]}}}, 12),
        ({"preStop": {"exec": {"command": ["/bin/sh", "-c", "sleep 3 && kill -TERM 1"]}}}, 3),
        ({"preStop": {"httpGet": {"path": "/drain", "port": 80}}}, float("inf")),
    ],
)
def test_prestop_seconds(hook, seconds):
    assert prestop_s({"lifecycle": hook} if hook else {}) == seconds


@pytest.mark.parametrize(
    ("selectors", "labels", "keep", "expected"),
    [
        ([{"app": "chat"}], {"app": "chat", "tier": "gpu"}, {"app"}, ["app"]),  # no other key: orphans
        ([{"app": "chat", "serving": "yes"}], {"app": "chat", "serving": "yes"}, {"app"}, ["serving"]),
        ([{"app": "other"}], {"app": "chat"}, set(), []),  # no Service selects it
        ([{"app": "chat"}, {"app": "chat", "x": "1"}], {"app": "chat", "x": "1"}, set(), ["app"]),
    ],
)
def test_detach_keys(selectors, labels, keep, expected):
    services = [
        {"metadata": {"namespace": "ns", "name": f"s{i}"}, "spec": {"selector": s}}
        for i, s in enumerate(selectors)
    ]
    pod = {"metadata": {"namespace": "ns", "name": "p", "labels": labels}}
    assert detach_keys(services, pod, keep) == expected


def test_the_choice_is_checked():
    assert check_choice("refuse") == "refuse"
    with pytest.raises(ValueError, match="unsafe_inference"):
        check_choice("yolo")
    assert handoff.UNSAFE_CHOICES[0] == "drain-safely"


def test_an_overflow_pools_serve_check_parses():
    from trainops.capacity.overflow import OverflowPool, OverflowPoolError

    url = "http://llm-chat.inference.svc/health"
    pool = OverflowPool.parse(
        {"node_label": "type=virtual-kubelet", "serve_check": {"url": url}}, "overflow_pool"
    )
    assert pool.serve_check == (url, 20)
    pool = OverflowPool.parse(
        {"node_label": "a=b", "serve_check": {"url": url, "requests": 5}}, "overflow_pool"
    )
    assert pool.serve_check == (url, 5)
    assert OverflowPool.parse({"node_label": "a=b"}, "overflow_pool").serve_check is None
    for bad in ({"url": "llm-chat/health"}, {"url": url, "requests": 0}, {"url": url, "every": 1}, "url"):
        with pytest.raises(OverflowPoolError, match=r"overflow_pool.serve_check"):
            OverflowPool.parse({"node_label": "a=b", "serve_check": bad}, "overflow_pool")


class _Counting:
    """A local HTTP server answering every GET with ``status`` after ``delay_s``, counting them."""

    def __init__(self, status: int = 200, delay_s: float = 0.0) -> None:
        import http.server
        import threading
        import time

        counting = self
        self.hits = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                counting.hits += 1
                time.sleep(delay_s)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/health"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.servers
def test_a_serve_round_sends_nothing_past_its_deadline():
    """A slow Service: the round stops at the deadline, the requests it left unsent named as failed."""
    from trainops.capacity.overflow import serve_round
    from trainops.kube.retry import Deadline

    slow = _Counting(delay_s=0.3)
    try:
        failed = serve_round(slow.url, 20, Deadline(1.0))
    finally:
        slow.close()
    assert slow.hits < 20
    assert failed and set(failed) <= {"not sent before the deadline", "TimeoutError", "timeout"}


@pytest.mark.servers
def test_a_serve_round_goes_to_the_service_not_a_proxy(monkeypatch):
    """HTTP(S)_PROXY is for the way out, not for a cluster Service's address."""
    from trainops.capacity.overflow import serve_round
    from trainops.kube.retry import Deadline

    service, proxy = _Counting(200), _Counting(502)
    try:
        for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
            monkeypatch.setenv(name, proxy.url.removesuffix("/health"))
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        import urllib.request

        monkeypatch.setattr(urllib.request, "_opener", None)  # urlopen's, built anew as in a fresh process
        assert serve_round(service.url, 3, Deadline(30)) == []
    finally:
        service.close()
        proxy.close()
    assert (service.hits, proxy.hits) == (3, 0)
