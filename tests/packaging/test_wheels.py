"""The three distributions as built wheels: nothing forgotten, nothing misplaced, and the full
non-editable install imports, runs its CLI and registers with Airflow."""

from __future__ import annotations

import ast
import json

from tests.packaging.installs import Build, Venv, cli_areas, import_every_module, run, wheel_modules

PRODUCT = ("trainops-core", "airflow-provider-trainops")


def install_paths(build: Build) -> dict[str, str]:
    """Source folder -> where its files install: the core and devcluster packages as they are, and
    the provider's folders as ``setup.py`` maps them (read from the file, not repeated here)."""
    tree = ast.parse((build.clone / "setup.py").read_text())
    (folders,) = (
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "FOLDERS"
    )
    mapped = {folder: name.replace(".", "/") for name, folder in folders.items()}
    return {"trainops": "trainops", "devcluster/trainops_devcluster": "trainops_devcluster", **mapped}


def test_every_source_file_is_in_a_wheel(build: Build) -> None:
    shipped = {file for wheel in build.wheels.values() for file in wheel.files()}
    paths = install_paths(build)
    tracked = run(["git", "ls-files", *paths], cwd=build.clone).stdout.split()
    assert len(tracked) > 100
    missing = [
        source
        for source in tracked
        if not source.endswith(".md")
        for folder, target in paths.items()
        if source.startswith(f"{folder}/") and target + source[len(folder) :] not in shipped
    ]
    assert missing == [], "tracked files no wheel ships (a package without __init__.py? package data?)"


def test_no_file_is_in_two_wheels(build: Build) -> None:
    seen: dict[str, str] = {}
    clashes = []
    for wheel in build.wheels.values():
        for file in wheel.files():
            if ".dist-info/" not in file and seen.setdefault(file, wheel.distribution) != wheel.distribution:
                clashes.append((file, seen[file], wheel.distribution))
    assert clashes == []


def test_product_wheels_hold_no_simulator(build: Build) -> None:
    for name in PRODUCT:
        wheel = build.wheels[name]
        assert [f for f in wheel.files() if f.startswith("trainops_devcluster")] == [], name
        requires = [r.lower() for r in wheel.requires()]
        assert [r for r in requires if r.startswith(("kubernetes-validate", "trainops-devcluster"))] == [], (
            name
        )


def test_core_wheel_requires_no_airflow(build: Build) -> None:
    requires = build.wheels["trainops-core"].requires()
    assert requires, "the core wheel's metadata lists no requirements at all"
    assert [r for r in requires if r.lower().startswith(("apache-airflow", "airflow"))] == []


def test_provider_wheel_requires_the_core_it_was_built_with(build: Build) -> None:
    core_version = build.wheels["trainops-core"].path.name.split("-")[1]
    assert f"trainops-core=={core_version}" in build.wheels["airflow-provider-trainops"].requires()


def test_every_product_module_imports(build: Build, full_install: Venv) -> None:
    result = import_every_module(full_install)
    assert result["failed"] == {}
    expected = set().union(*(wheel_modules(build.wheels[name]) for name in PRODUCT)) - {"trainops"}
    assert set(result["modules"]) == expected


def test_cli_offers_every_area(full_install: Venv) -> None:
    assert {"probe", "health", "checkpoints", "capacity", "devcluster"} <= cli_areas(full_install)


def test_airflow_lists_the_provider(full_install: Venv) -> None:
    listed = json.loads(full_install.run("airflow", "providers", "list", "--output", "json").stdout)
    versions = {provider["package_name"]: provider["version"] for provider in listed}
    assert versions.get("airflow-provider-trainops") == "0.1.0", versions
