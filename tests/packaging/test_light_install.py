"""The light install (issue 18): the ``trainops-core`` wheel alone, as in the node probe's image and
in training images, brings no Airflow and still runs the probe, the CLI and the checkpoint helper."""

from __future__ import annotations

import ast
import json

from tests.packaging.installs import (
    Build,
    Venv,
    airflow_distributions,
    cli_areas,
    import_every_module,
    wheel_modules,
)

CORE_AREAS = ("probe", "health", "checkpoints", "capacity")
TORCH_EXAMPLE = "examples/torch_trainer/train.py"


def test_installs_no_airflow(light_install: Venv) -> None:
    installed = light_install.distributions()
    assert "trainops-core" in installed
    assert airflow_distributions(light_install) == []
    # Nothing that a training stack pins for itself.
    assert installed & {"torch", "numpy", "protobuf"} == set()


def test_full_install_still_gives_everything(full_install: Venv) -> None:
    installed = full_install.distributions()
    assert {"trainops-core", "airflow-provider-trainops", "apache-airflow"} <= installed


def test_probe_runs(light_install: Venv) -> None:
    usage = light_install.run("trainops", "probe", "--help").stdout
    assert "--publish" in usage and "--once" in usage


def test_probe_reports_once(light_install: Venv) -> None:
    # Exit 1 where NVML finds no GPU (health unknown), 0 or 1 by the GPUs' health where it does.
    result = light_install.run("trainops", "probe", "--once", "--json", "--node", "gpu-1", returncodes=(0, 1))
    report = json.loads(result.stdout)
    assert report["node"] == "gpu-1" and report["source"] == "probe"
    assert "gpu_count" in report["signals"]


def test_cli_offers_the_core_areas(light_install: Venv) -> None:
    areas = cli_areas(light_install)
    assert set(CORE_AREAS) <= areas and "devcluster" not in areas, areas


def test_checkpoint_helper_imports(light_install: Venv) -> None:
    light_install.run(
        "python", "-c", "from trainops.checkpoints.helper import resume_from, heartbeat, commit"
    )


def test_every_core_module_imports_without_airflow(build: Build, light_install: Venv) -> None:
    result = import_every_module(light_install)
    assert result["failed"] == {}
    assert result["airflow"] == []
    assert set(result["modules"]) == wheel_modules(build.wheels["trainops-core"]) - {"trainops"}


def test_torch_example_needs_only_the_light_install(build: Build, light_install: Venv) -> None:
    tree = ast.parse((build.clone / TORCH_EXAMPLE).read_text())
    imports = [
        f"from {node.module} import {', '.join(alias.name for alias in node.names)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "trainops"
    ]
    assert imports, f"{TORCH_EXAMPLE} no longer imports the trainops helper"
    light_install.run("python", "-c", "; ".join(imports))
