"""Building the three wheels from a clean clone of HEAD and installing them, non-editable, into
fresh virtualenvs.

A clean clone means an uncommitted or ignored file cannot hide a module missing from a wheel.
Both virtualenvs are made without pip (the test's own pip installs into them through
``pip --python``) and without byte-compiling, which keeps the session's setup short.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROJECTS = {"trainops-core": "core", "airflow-provider-trainops": ".", "trainops-devcluster": "devcluster"}
AIRFLOW_DISTRIBUTIONS = ("apache-airflow", "airflow-provider-trainops")
# Variables of the calling environment that would point a fresh install at this checkout's setup.
INHERITED_PREFIXES = ("AIRFLOW", "VIRTUAL_ENV", "PYTHON", "KUBECONFIG", "AWS_", "TRAINOPS_")


def run(command: list[str], returncodes: tuple[int, ...] = (0,), **kwargs) -> subprocess.CompletedProcess:
    """Run a command, failing with its output when it exits with another code than ``returncodes``."""
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode not in returncodes:
        pytest.fail(
            f"{' '.join(map(str, command))} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def clean_env() -> dict[str, str]:
    """This process's environment without what points at this checkout's own setup."""
    return {k: v for k, v in os.environ.items() if not k.startswith(INHERITED_PREFIXES)}


@dataclass(frozen=True)
class Wheel:
    distribution: str
    path: Path

    def files(self) -> list[str]:
        with zipfile.ZipFile(self.path) as archive:
            return archive.namelist()

    def requires(self) -> list[str]:
        """The ``Requires-Dist`` lines of the wheel's metadata."""
        with zipfile.ZipFile(self.path) as archive:
            metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
            lines = archive.read(metadata).decode().splitlines()
        return [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]


@dataclass(frozen=True)
class Build:
    clone: Path
    wheels: dict[str, Wheel]  # by distribution name


@dataclass(frozen=True)
class Venv:
    root: Path
    home: Path  # AIRFLOW_HOME and HOME-like scratch space for commands run in it

    def env(self) -> dict[str, str]:
        env = clean_env()
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["AIRFLOW_HOME"] = str(self.home)
        return env

    def run(self, *command: str, returncodes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        """Run one of the venv's commands (``trainops``, ``airflow``, ``python``) with a clean env."""
        return run(
            [str(self.root / "bin" / command[0]), *command[1:]],
            returncodes,
            env=self.env(),
            cwd=self.home,
        )

    def distributions(self) -> set[str]:
        """Names of every distribution installed in the venv, normalised (``apache-airflow-core``)."""
        script = (
            "import importlib.metadata as m, json, re;"
            "print(json.dumps(sorted({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower()"
            " for d in m.distributions()})))"
        )
        return set(json.loads(self.run("python", "-c", script).stdout))


def cli_areas(venv: Venv) -> set[str]:
    """The subcommands ``trainops --help`` offers in a venv."""
    return set(re.findall(r"^ {4}(\w[\w-]*)", venv.run("trainops", "--help").stdout, re.MULTILINE))


def airflow_distributions(venv: Venv) -> list[str]:
    """The Airflow distributions (Airflow itself, its providers, ours) installed in a venv."""
    return sorted(name for name in venv.distributions() if name.startswith(AIRFLOW_DISTRIBUTIONS))


def make_venv(root: Path, wheels: list[Wheel]) -> Venv:
    """A fresh virtualenv with ``wheels`` installed (their dependencies from the package registry)."""
    run([sys.executable, "-m", "venv", "--without-pip", str(root)])
    run(
        [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "--quiet"]
        + ["--no-compile", *(str(wheel.path) for wheel in wheels)],
        env=clean_env(),
    )
    home = root.parent / f"{root.name}-home"
    home.mkdir()
    return Venv(root, home)


IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil, sys
import trainops
failed = {}
def record(name):
    failed[name] = repr(sys.exc_info()[1])
modules = []
for info in pkgutil.walk_packages(trainops.__path__, "trainops.", onerror=record):
    modules.append(info.name)
    try:
        importlib.import_module(info.name)
    except Exception as error:
        failed[info.name] = f"{type(error).__name__}: {error}"
print(json.dumps({"modules": modules, "failed": failed,
                  "airflow": sorted(m for m in sys.modules if m.split(".")[0] == "airflow")[:5]}))
"""


def import_every_module(venv: Venv) -> dict:
    """Import every module of the installed ``trainops`` package; returns the modules walked, the
    failures by module, and any ``airflow`` modules that got imported."""
    return json.loads(venv.run("python", "-c", IMPORT_EVERY_MODULE).stdout)


def wheel_modules(wheel: Wheel) -> set[str]:
    """Dotted names of the Python modules a wheel holds (packages by their own name)."""
    names = set()
    for file in wheel.files():
        if file.endswith(".py"):
            parts = file[: -len(".py")].split("/")
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names
