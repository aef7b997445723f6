"""The container images (no engine here, so nothing is built): every Dockerfile installs only the
repository's wheels or pinned requirements, and the node probe's image is the light install, run
as non-root by the DaemonSet in ``deploy/node-probe.yaml``."""

from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import PurePosixPath

import yaml

from tests.packaging import dockerfile
from tests.packaging.installs import Build, Venv, airflow_distributions, run

PROBE_DOCKERFILE = "deploy/probe.Dockerfile"
PROBE_MANIFEST = "deploy/node-probe.yaml"


def dockerfiles(build: Build) -> list[str]:
    tracked = run(["git", "ls-files"], cwd=build.clone).stdout.split()
    return [
        path for path in tracked if PurePosixPath(path).name == "Dockerfile" or path.endswith(".Dockerfile")
    ]


def installs(build: Build, text: str) -> tuple[set[str], set[str], list[str]]:
    """What a Dockerfile pip-installs: the repository's distributions (from their wheels or pinned by
    name), other pinned requirements by name, and the problems found (targets that are neither)."""
    ours, pinned, problems = set(), set(), []
    for instruction in dockerfile.parse(text):
        if instruction.keyword != "RUN":
            continue
        try:
            targets = dockerfile.pip_install_targets(instruction)
        except ValueError as error:
            problems.append(str(error))
            continue
        for target in targets:
            if target.endswith(".whl"):
                pattern = PurePosixPath(target).name
                matched = {w.distribution for w in build.wheels.values() if fnmatch(w.path.name, pattern)}
                ours |= matched
                if not matched:
                    problems.append(f"{target} matches none of the repository's wheels")
            elif match := dockerfile.PINNED.match(target):
                name = re.sub(r"[-_.]+", "-", match["name"]).lower()
                (ours if name in build.wheels else pinned).add(name)
            else:
                problems.append(
                    f"{target}: neither a repository wheel nor a pinned requirement (name==version)"
                )
    return ours, pinned, problems


def final_stage(build: Build, path: str) -> list[dockerfile.Instruction]:
    instructions = dockerfile.parse((build.clone / path).read_text())
    return [i for i in instructions if i.stage == instructions[-1].stage]


def test_every_dockerfile_installs_only_repository_wheels_or_pins(build: Build) -> None:
    found = dockerfiles(build)
    assert PROBE_DOCKERFILE in found
    for path in found:
        assert installs(build, (build.clone / path).read_text())[2] == [], path


def test_the_check_refuses_what_it_cannot_vouch_for(build: Build) -> None:
    text = """FROM python:3.11-slim
# a comment between continued lines is skipped
RUN pip install --no-cache-dir -c constraints.txt "boto3==1.40.1" requests \\
    # pinned above, unpinned here
    /wheels/airflow_provider_trainops-*.whl /wheels/other-1.0-py3-none-any.whl && echo done
RUN python -m pip install -r requirements.txt
"""
    ours, pinned, problems = installs(build, text)
    assert ours == {"airflow-provider-trainops"} and pinned == {"boto3"}
    assert problems == [
        "requests: neither a repository wheel nor a pinned requirement (name==version)",
        "/wheels/other-1.0-py3-none-any.whl matches none of the repository's wheels",
        "pip install -r requirements.txt: install built wheels instead",
    ]


def test_probe_image_is_the_light_install(build: Build, light_install: Venv) -> None:
    ours, pinned, _ = installs(build, (build.clone / PROBE_DOCKERFILE).read_text())
    assert ours == {"trainops-core"}
    assert [name for name in pinned if name.startswith("apache-airflow")] == []
    # The image installs exactly what the light install's virtualenv installed from the same wheel.
    assert airflow_distributions(light_install) == []
    base = [i.arguments for i in final_stage(build, PROBE_DOCKERFILE) if i.keyword == "FROM"]
    assert len(base) == 1 and base[0].startswith("python:3.11-") and "slim" in base[0], base


def test_probe_image_runs_the_probe_as_non_root(build: Build) -> None:
    stage = final_stage(build, PROBE_DOCKERFILE)
    users = [i.arguments for i in stage if i.keyword == "USER"]
    assert users, "the probe image sets no USER, so it runs as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: use a numeric non-zero uid (runAsNonRoot)"
    (entrypoint,) = (dockerfile.exec_form(i.arguments) for i in stage if i.keyword == "ENTRYPOINT")
    assert entrypoint == ["trainops", "probe"]


def test_daemonset_runs_the_image_as_built(build: Build) -> None:
    documents = list(yaml.safe_load_all((build.clone / PROBE_MANIFEST).read_text()))
    (daemonset,) = (d for d in documents if d["kind"] == "DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    version = build.wheels["trainops-core"].path.name.split("-")[1]
    assert container["image"].rsplit("/", 1)[-1] == f"trainops-probe:{version}"
    assert f"-t {container['image']} " in (build.clone / PROBE_DOCKERFILE).read_text()
    assert "command" not in container, "the image's entrypoint (`trainops probe`) must run"
    assert container["args"][0] == "--publish"
    assert container["securityContext"]["runAsNonRoot"] is True
