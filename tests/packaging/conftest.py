"""Session fixtures: the three wheels built from a clean clone of HEAD, and two fresh virtualenvs
(the full install and the light, core-only install) built once per test session."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.packaging.installs import PROJECTS, REPO, Build, Venv, Wheel, make_venv, run


@pytest.fixture(scope="session")
def build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Build]:
    """Wheels of the three distributions, built with ``python -m build`` from a clone of HEAD.
    The clone, the wheels and both virtualenvs (about 1 GB, tens of thousands of files) are removed
    by a detached ``rm`` when the session ends, so that the session does not wait for it."""
    top = tmp_path_factory.mktemp("packaging")
    clone, dist = top / "clone", top / "dist"
    run(["git", "clone", "--quiet", str(REPO), str(clone)])
    with ThreadPoolExecutor(len(PROJECTS)) as pool:  # each build mostly waits for its build environment
        commands = [
            [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(clone / project)]
            for project in PROJECTS.values()
        ]
        list(pool.map(run, commands))
    wheels = {}
    for name in PROJECTS:
        (path,) = dist.glob(f"{name.replace('-', '_')}-*.whl")
        wheels[name] = Wheel(name, path)
    yield Build(clone, wheels)
    subprocess.Popen(["rm", "-rf", str(top)], start_new_session=True)


@pytest.fixture(scope="session")
def full_install(build: Build) -> Venv:
    """All three wheels installed, as a user of the provider plus the devcluster has them."""
    return make_venv(build.clone.parent / "full", list(build.wheels.values()))


@pytest.fixture(scope="session")
def light_install(build: Build) -> Venv:
    """Only the ``trainops-core`` wheel, as a probe image or a training image has it."""
    return make_venv(build.clone.parent / "light", [build.wheels["trainops-core"]])
