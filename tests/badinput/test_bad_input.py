"""Issue 15's bad-input suite: each bad input gets an error naming the field or file (and, where a
person must act, what to do), and changes nothing: no write in the devcluster's audit log, no object
added or changed in the bucket.  (Malformed health reports: ``test_health_reports.py``.)"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.capacity.helpers import writes
from tests.checkpoints.builders import put, write_dcp, write_deepspeed, write_hf, write_megatron_torch_dist


@dataclass
class Env:
    cluster: object
    bucket: str
    client: object
    files: Path

    @property
    def kubeconfig(self) -> str:
        return str(self.cluster.kubeconfig)

    def file(self, name: str, text: str) -> str:
        path = self.files / name
        path.write_text(text)
        return str(path)

    def uri(self, name: str) -> str:
        return f"s3://{self.bucket}/runs/bad/{name}/"


@dataclass(frozen=True)
class Case:
    setup: Callable[[Env], object]  # writes the hostile objects (before the snapshot); returns the input
    act: Callable[[Env, object], str]  # uses the input; returns the error text, fails if it is accepted
    expect: tuple[str, ...]
    conn: dict[str, dict] | None = None  # Airflow connections (AIRFLOW_CONN_<ID>) the case needs


def _raised(action: Callable[[], object]) -> str:
    try:
        action()
    except Exception as error:  # the error under test, whatever its class
        return str(error)
    raise AssertionError("the bad input was accepted")


def _nothing(env: Env) -> None:
    return None


# --- the trigger form of the lifecycle DAG ------------------------------------------------------


def _param(name: str, value: object) -> Case:
    def act(env: Env, _: object) -> str:
        from airflow.sdk.definitions.param import ParamsDict
        from trainops.operators.lifecycle.params import lifecycle_params

        return _raised(lambda: ParamsDict(lifecycle_params()).update({name: value}))

    return Case(_nothing, act, (f"Invalid input for param {name}",))


PARAMS = {
    "param-run-name-upper-case": _param("run_name", "My_Run"),
    "param-run-name-too-long": _param("run_name", "r" * 64),
    "param-nodes-zero": _param("nodes", 0),
    "param-nodes-a-string": _param("nodes", "two"),
    "param-spare-nodes-negative": _param("spare_nodes", -1),
    "param-checkpoint-uri-http": _param("checkpoint_uri", "http://bucket/runs/"),
    "param-max-resumes-over-10": _param("max_resumes", 11),
    "param-hang-timeout-zero": _param("hang_timeout_s", 0),
    "param-inference-workload-no-namespace": _param("inference_workloads", ["llm-chat"]),
    "param-on-prometheus-unavailable": _param("on_prometheus_unavailable", "maybe"),
    "param-policy-override-unknown-row": _param("health_policy_overrides", {"xid_fatl": {"verdict": "fail"}}),
    "param-command-empty": _param("command", []),
    "param-overflow-pool-without-node-label": _param(
        "overflow_pool", {"taint": "virtual-kubelet.io/provider"}
    ),
    "param-overflow-pool-label-not-key-value": _param("overflow_pool", {"node_label": "virtual-kubelet"}),
    "param-return-wave-nodes-zero": _param("return_wave_nodes", 0),
}


# --- the command line ---------------------------------------------------------------------------


def _cli(*argv: str | Callable[[Env], str]) -> Callable[[Env, object], str]:
    """Run ``trainops`` in-process; returns its stderr, failing unless the exit status is non-zero."""

    def act(env: Env, _: object) -> str:
        from trainops.cli import main

        args = [arg(env) if callable(arg) else arg for arg in argv]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(args)
            except SystemExit as exit_:
                code = exit_.code
        assert code not in (0, None), f"trainops {' '.join(args)} exited 0"
        return err.getvalue()

    return act


def _good_kubeconfig(env: Env) -> str:
    return env.kubeconfig


def _policy(name: str, text: str) -> Callable[[Env], str]:
    return lambda env: env.file(name, text)


def _kubeconfig(name: str, text: str) -> Callable[[Env], str]:
    return lambda env: env.file(name, text)


NO_CONTEXT = "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\ncurrent-context: nowhere\nusers: []\n"

CLI = {
    "cli-return-run-without-slash": Case(
        _nothing,
        _cli("capacity", "return", "--run", "no-slash", "--kubeconfig", _good_kubeconfig),
        ("run 'no-slash' must be '<dag_id>/<run_id>'",),
    ),
    "cli-return-ready-deadline-not-a-number": Case(
        _nothing,
        _cli("capacity", "return", "--run", "a/b", "--ready-deadline", "soon"),
        ("argument --ready-deadline", "invalid float value"),
    ),
    "cli-return-wave-nodes-zero": Case(
        _nothing,
        _cli("capacity", "return", "--run", "a/b", "--wave-nodes", "0"),
        ("argument --wave-nodes", "'0' is not a whole number >= 1"),
    ),
    "cli-status-kubeconfig-missing": Case(
        _nothing,
        _cli("capacity", "status", "--kubeconfig", "/nonexistent/kubeconfig"),
        ("kubeconfig /nonexistent/kubeconfig cannot be used", "--kubeconfig"),
    ),
    "cli-status-kubeconfig-not-yaml": Case(
        _nothing,
        _cli("capacity", "status", "--kubeconfig", _kubeconfig("kc-not-yaml", "clusters: [")),
        ("kc-not-yaml cannot be used", "fix the file"),
    ),
    "cli-status-kubeconfig-clusters-an-int": Case(
        _nothing,
        _cli("capacity", "status", "--kubeconfig", _kubeconfig("kc-int", "apiVersion: v1\nclusters: 5\n")),
        ("kc-int cannot be used", "fix the file"),
    ),
    "cli-status-kubeconfig-context-missing": Case(
        _nothing,
        _cli("capacity", "status", "--kubeconfig", _kubeconfig("kc-no-context", NO_CONTEXT)),
        ("kc-no-context cannot be used",),
    ),
    "cli-gate-min-nodes-zero": Case(
        _nothing,
        _cli("health", "gate", "--min-nodes", "0", "--kubeconfig", _good_kubeconfig),
        ("min_nodes must be an integer >= 1",),
    ),
    "cli-gate-policy-file-missing": Case(
        _nothing,
        _cli("health", "gate", "--policy", "/nonexistent/policy.yaml", "--kubeconfig", _good_kubeconfig),
        ("/nonexistent/policy.yaml",),
    ),
    "cli-gate-policy-not-yaml": Case(
        _nothing,
        _cli(
            "health", "gate", "--policy", _policy("p.yaml", "xid_fatal: ["), "--kubeconfig", _good_kubeconfig
        ),
        ("p.yaml: not valid YAML",),
    ),
    "cli-gate-policy-not-json": Case(
        _nothing,
        _cli("health", "gate", "--policy", _policy("p.json", "{xid_fatal"), "--kubeconfig", _good_kubeconfig),
        ("p.json: not valid JSON",),
    ),
    "cli-gate-policy-a-list": Case(
        _nothing,
        _cli("health", "gate", "--policy", _policy("list.json", "[1]"), "--kubeconfig", _good_kubeconfig),
        ("list.json: expected a mapping of row name -> overrides",),
    ),
    "cli-gate-policy-unknown-row": Case(
        _nothing,
        _cli(
            "health",
            "gate",
            "--policy",
            _policy("row.json", '{"xid_fatl": {}}'),
            "--kubeconfig",
            _good_kubeconfig,
        ),
        ("unknown health policy row 'xid_fatl'", "valid rows"),
    ),
    "cli-gate-policy-bad-verdict": Case(
        _nothing,
        _cli(
            "health",
            "gate",
            "--policy",
            _policy("verdict.json", '{"xid_fatal": {"verdict": "explode"}}'),
            "--kubeconfig",
            _good_kubeconfig,
        ),
        ("policy row 'xid_fatal' field 'verdict'", "use one of"),
    ),
    "cli-gate-policy-threshold-of-another-kind": Case(
        _nothing,
        _cli(
            "health",
            "gate",
            "--policy",
            _policy("threshold.yaml", "thermal_critical:\n  threshold: hot\n"),
            "--kubeconfig",
            _good_kubeconfig,
        ),
        ("policy row 'thermal_critical' field 'threshold'", "is not like the default"),
    ),
    "cli-verify-not-an-s3-uri": Case(
        _nothing, _cli("checkpoints", "verify", "runs/x/step-1/"), ("uri must be an s3:// URI",)
    ),
    "cli-verify-no-bucket": Case(_nothing, _cli("checkpoints", "verify", "s3://"), ("uri has no bucket",)),
    "cli-latest-level-unknown": Case(
        _nothing,
        _cli("checkpoints", "latest", "s3://b/runs/x/", "--level", "paranoid"),
        ("argument --level: invalid choice: 'paranoid'",),
    ),
}


# --- kubeconfigs and connections ----------------------------------------------------------------


def _from_kubeconfig(name: str, text: str) -> Case:
    def act(env: Env, _: object) -> str:
        from trainops.kube.client import Kube

        return _raised(lambda: Kube.from_kubeconfig(env.file(name, text)))

    return Case(_nothing, act, (f"{name} cannot be used", "--kubeconfig or $KUBECONFIG"))


def _kube_connection(extra: dict) -> Case:
    def act(env: Env, _: object) -> str:
        from trainops.hooks.kubernetes_cluster import KubernetesClusterHook

        return _raised(lambda: KubernetesClusterHook(conn_id="k8s_bad").kube())

    return Case(
        _nothing,
        act,
        ("connection 'k8s_bad': its kubeconfig cannot be used", "kube_config_path extra"),
        conn={"k8s_bad": {"conn_type": "kubernetes", "extra": extra}},
    )


def _aws_connection(extra: dict) -> Case:
    def act(env: Env, _: object) -> str:
        from trainops.hooks.checkpoint_store import CheckpointStoreHook

        return _raised(lambda: CheckpointStoreHook(aws_conn_id="s3_bad").get_store())

    return Case(
        _nothing,
        act,
        ("connection 's3_bad' cannot make an S3 client", "endpoint_url"),
        conn={"s3_bad": {"conn_type": "aws", "extra": extra}},
    )


CONFIGS = {
    "kubeconfig-a-list": _from_kubeconfig("kc-list", "- 1\n- 2\n"),
    "kubeconfig-users-a-string": _from_kubeconfig(
        "kc-users", "apiVersion: v1\nclusters: []\ncontexts: []\nusers: everyone\n"
    ),
    "kubeconfig-binary": _from_kubeconfig("kc-binary", "\x00\x01\x02"),
    "connection-kubeconfig-path-missing": _kube_connection({"kube_config_path": "/nonexistent/kc"}),
    "connection-kubeconfig-not-yaml": _kube_connection({"kube_config": "clusters: ["}),
    "connection-kubeconfig-clusters-an-int": _kube_connection({"kube_config": "clusters: 5"}),
    "connection-s3-endpoint-not-a-url": _aws_connection({"endpoint_url": "not a url"}),
}


# --- checkpoint metadata: each a reason for that checkpoint, naming the file ----------------------


def _checkpoint(build: Callable[[Env, str], None]) -> Callable[[Env], str]:
    counter = iter(range(1, 1_000_000))

    def setup(env: Env) -> str:
        uri = env.uri(f"step-{next(counter)}-{id(build) % 10_000}")
        build(env, uri.split("/", 3)[3])
        return uri

    return setup


def _verify(env: Env, uri: object) -> str:
    from trainops.checkpoints.verify import verify_checkpoint

    result = verify_checkpoint(str(uri))
    assert not result.ok, f"{uri} verified"
    return "\n".join(result.reasons)


def _forged_commit(manifest: bytes) -> Callable[[Env, str], None]:
    import hashlib

    def build(env: Env, prefix: str) -> None:
        write_dcp(env.client, env.bucket, prefix)
        put(env.client, env.bucket, prefix + "trainops-manifest.json", manifest)
        body = {"manifest_sha256": hashlib.sha256(manifest).hexdigest()}
        put(env.client, env.bucket, prefix + "_COMMITTED", json.dumps(body).encode())

    return build


def _dcp_with(metadata: bytes, root: str = "") -> Callable[[Env, str], None]:
    def build(env: Env, prefix: str) -> None:
        write_dcp(env.client, env.bucket, prefix + root)
        put(env.client, env.bucket, prefix + root + ".metadata", metadata)

    return build


def _hf_with(name: str, body: bytes) -> Callable[[Env, str], None]:
    def build(env: Env, prefix: str) -> None:
        write_hf(env.client, env.bucket, prefix, 1)
        put(env.client, env.bucket, prefix + name, body)

    return build


class _System:
    def __reduce__(self):
        import os

        return (os.system, ("true",))


def _megatron_tracker(value: bytes) -> Callable[[Env, str], None]:
    def build(env: Env, prefix: str) -> None:
        write_megatron_torch_dist(env.client, env.bucket, prefix)
        put(
            env.client,
            env.bucket,
            prefix.rstrip("/").rsplit("/", 1)[0] + "/latest_checkpointed_iteration.txt",
            value,
        )

    return build


def _deepspeed_latest(value: bytes) -> Callable[[Env, str], None]:
    def build(env: Env, prefix: str) -> None:
        write_deepspeed(env.client, env.bucket, prefix)
        put(env.client, env.bucket, prefix.rstrip("/").rsplit("/", 1)[0] + "/latest", value)

    return build


def _named(name: str, build: Callable[[Env, str], None]) -> Callable[[Env], str]:
    """A checkpoint directory of the given name (the format is recognised by it)."""

    def setup(env: Env) -> str:
        uri = f"s3://{env.bucket}/runs/{name.replace('/', '-')}-{id(build) % 10_000}/{name}/"
        build(env, uri.split("/", 3)[3])
        return uri

    return setup


def _safetensors(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + b"\0" * 16


METADATA = {
    "manifest-a-json-list": Case(
        _checkpoint(_forged_commit(b"[1, 2]")), _verify, ("trainops-manifest.json is not valid",)
    ),
    "manifest-size-a-string": Case(
        _checkpoint(_forged_commit(b'{"files": [{"key": "a", "size": "1", "etag": "x"}]}')),
        _verify,
        ("trainops-manifest.json is not valid",),
    ),
    "committed-not-json": Case(
        _checkpoint(
            lambda env, p: (
                write_dcp(env.client, env.bucket, p),
                put(env.client, env.bucket, p + "trainops-manifest.json", b"{}"),
                put(env.client, env.bucket, p + "_COMMITTED", b"\xff"),
            )
        ),
        _verify,
        ("_COMMITTED is not the JSON trainops writes",),
    ),
    "dcp-metadata-garbage": Case(
        _checkpoint(_dcp_with(b"\x80\x04not a pickle")), _verify, (".metadata was not loaded",)
    ),
    "dcp-metadata-runs-a-command": Case(
        _checkpoint(_dcp_with(pickle.dumps(_System()))), _verify, (".metadata was not loaded", "os")
    ),
    "dcp-metadata-a-dict": Case(
        _checkpoint(_dcp_with(pickle.dumps({"storage_data": {}}))),
        _verify,
        (".metadata was not loaded", "not a DCP Metadata"),
    ),
    "dcp-metadata-huge-int-keys": Case(
        _checkpoint(_dcp_with(pickle.dumps({k * (2**61 - 1): 0 for k in range(5, 50)}))),
        _verify,
        (
            ".metadata was not loaded",
            "not a DCP Metadata",
        ),  # loaded in the sandbox: the collisions cost only it
    ),
    "hf-trainer-state-a-list": Case(
        _named("checkpoint-1", _hf_with("trainer_state.json", b"[1]")),
        _verify,
        ("trainer_state.json is not valid JSON with a global_step",),
    ),
    "hf-index-weight-map-a-list": Case(
        _named("checkpoint-1", _hf_with("model.safetensors.index.json", b'{"weight_map": [1]}')),
        _verify,
        ("model.safetensors.index.json is not valid JSON with a weight_map",),
    ),
    "hf-safetensors-header-a-list": Case(
        _named("checkpoint-1", _hf_with("model.safetensors", _safetensors(b"[1, 2]"))),
        _verify,
        ("model.safetensors has an unreadable safetensors header",),
    ),
    "megatron-tracker-not-a-number": Case(
        _named("iter_0000100", _megatron_tracker(b"one hundred")),
        _verify,
        ("latest_checkpointed_iteration.txt holds 'one hundred'",),
    ),
    "megatron-metadata-garbage": Case(
        _named(
            "iter_0000100",
            lambda env, p: (
                _megatron_tracker(b"100")(env, p),
                put(env.client, env.bucket, p + ".metadata", b"junk"),
            ),
        ),
        _verify,
        (".metadata was not loaded",),
    ),
    "deepspeed-latest-escaping": Case(
        _named("global_step5", _deepspeed_latest(b"../../etc/passwd")),
        _verify,
        ("'latest' names '../../etc/passwd'",),
    ),
    "nemo-weights-metadata-garbage": Case(
        _named("model-step=100", _dcp_with(b"\x80\x04junk", root="weights/")),
        _verify,
        ("weights/.metadata was not loaded",),
    ),
}

CASES = {**PARAMS, **CLI, **CONFIGS, **METADATA}


def _bucket_state(env: Env) -> dict[str, str]:
    pages = env.client.get_paginator("list_objects_v2").paginate(Bucket=env.bucket)
    return {item["Key"]: item["ETag"] for page in pages for item in page.get("Contents", ())}


@pytest.fixture(scope="module")
def env(cluster, shared_bucket, s3_server, tmp_path_factory) -> Env:
    return Env(cluster, shared_bucket, s3_server.client(), tmp_path_factory.mktemp("badinput"))


def test_the_suite_has_at_least_40_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_input_is_named_and_changes_nothing(case: Case, env: Env, monkeypatch):
    for conn_id, conn in (case.conn or {}).items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    given = case.setup(env)
    before = _bucket_state(env)
    env.cluster.server.audit.clear()

    error = case.act(env, given)

    for text in case.expect:
        assert text in error, f"{text!r} not in {error[:2000]!r}"
    assert writes(env.cluster) == []
    assert _bucket_state(env) == before
