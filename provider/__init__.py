"""Airflow provider metadata, read through the ``apache_airflow_provider`` entry point.

As Airflow's own providers do: each integration with the modules that serve it (hooks, operators,
sensors, triggers), and the connection types trainops adds to the UI's connection form, declared
here (``conn-fields``, ``ui-field-behaviour``) so the form needs no hook import.  The Kubernetes
and AWS connections are the cncf and amazon providers' own types; only Prometheus gets its own.
"""

HEALTH = "GPU node health (trainops)"
CAPACITY = "GPU capacity from inference (trainops)"
TRAINING = "Kueue gang training (trainops)"
CHECKPOINTS = "Verified S3 checkpoints (trainops)"
PROMETHEUS = "Prometheus (trainops)"
DOCTOR = "Cluster setup check (trainops)"

INTEGRATIONS = {
    HEALTH: ("https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/feature-overview.html", ["gpu"]),
    CAPACITY: (
        "https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/",
        ["kubernetes"],
    ),
    TRAINING: ("https://kueue.sigs.k8s.io/docs/overview/", ["kubernetes", "ml"]),
    CHECKPOINTS: ("https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-requests.html", ["aws"]),
    PROMETHEUS: ("https://prometheus.io/docs/prometheus/latest/querying/api/", ["monitoring"]),
    DOCTOR: (
        "https://kubernetes.io/docs/reference/access-authn-authz/authorization/#checking-api-access",
        ["kubernetes"],
    ),
}
# kind -> integration -> the modules (under ``trainops.<kind>``) that serve it
MODULES = {
    "hooks": {
        CAPACITY: ["kubernetes_cluster"],
        CHECKPOINTS: ["checkpoint_store"],
        PROMETHEUS: ["prometheus"],
    },
    "operators": {
        HEALTH: ["health"],
        CAPACITY: ["capacity"],
        TRAINING: ["training"],
        CHECKPOINTS: ["checkpoint"],
        DOCTOR: ["doctor"],
    },
    "sensors": {HEALTH: ["health"], CHECKPOINTS: ["checkpoint"]},
    "triggers": {
        HEALTH: ["health"],
        CAPACITY: ["capacity"],
        TRAINING: ["training"],
        CHECKPOINTS: ["checkpoint"],
    },
}
PROMETHEUS_CONNECTION = {
    "hook-class-name": "trainops.hooks.prometheus.PrometheusHook",
    "hook-name": "Prometheus (trainops)",
    "connection-type": "trainops_prometheus",
    "ui-field-behaviour": {
        "hidden-fields": [],
        "relabeling": {
            "host": "Prometheus URL",
            "schema": "Scheme",
            "login": "Username (basic auth)",
            "password": "Password (basic auth)",
            "extra": "HTTP headers (JSON)",
        },
        "placeholders": {
            "host": "http://prometheus.monitoring.svc:9090",
            "schema": "http",
            "extra": '{"Authorization": "Bearer <token>"}',
        },
    },
    "conn-fields": {
        "verify": {
            "label": "Verify TLS certificates",
            "description": "Check the server's certificate on https (default: yes); a CA bundle path also works.",
            "schema": {"type": ["boolean", "string", "null"]},
        },
        "timeout": {
            "label": "Query timeout (s)",
            "description": "Seconds each PromQL query may take (default 30).",
            "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
        },
        "node_label": {
            "label": "Node label",
            "description": "The label naming the Kubernetes node in dcgm-exporter's series (default Hostname, "
            "which dcgm-exporter fills from NODE_NAME; e.g. node where Prometheus relabels it).",
            "schema": {"type": ["string", "null"], "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
        },
    },
}


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-trainops",
        "name": "trainops",
        "description": "GPU training lifecycle on Kubernetes: health gate, taint flip, Kueue gang run, "
        "verified checkpoints in S3, crash-triggered resume, return of inference capacity.",
        "integrations": [
            {"integration-name": name, "external-doc-url": url, "tags": tags}
            for name, (url, tags) in INTEGRATIONS.items()
        ],
        **{
            kind: [
                {"integration-name": name, "python-modules": [f"trainops.{kind}.{m}" for m in modules]}
                for name, modules in by_integration.items()
            ]
            for kind, by_integration in MODULES.items()
        },
        "connection-types": [PROMETHEUS_CONNECTION],
    }
