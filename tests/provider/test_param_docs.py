"""Every parameter of every trainops operator and sensor is documented with ``:param``, as the
provider operators' are (the Airflow UI and API docs show these)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest


def classes(package_name: str) -> list[type]:
    from airflow.sdk import BaseOperator

    package = importlib.import_module(package_name)
    found = []
    for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
        module = importlib.import_module(info.name)
        found += [
            c
            for _, c in inspect.getmembers(module, inspect.isclass)
            if issubclass(c, BaseOperator) and c.__module__ == module.__name__
        ]
    return found


OPERATORS_AND_SENSORS = classes("trainops.operators") + classes("trainops.sensors")


def documented(cls: type) -> set[str]:
    """``:param`` names in the docstrings of ``cls`` and the trainops classes it inherits from."""
    docs = [c.__doc__ or "" for c in cls.__mro__ if c.__module__.startswith("trainops.")]
    return {name for doc in docs for name in re.findall(r"^\s*:param (\w+):", doc, re.MULTILINE)}


@pytest.mark.parametrize("cls", OPERATORS_AND_SENSORS, ids=lambda c: c.__name__)
def test_every_init_parameter_has_a_param_line(cls):
    own = [c for c in cls.__mro__ if c.__module__.startswith("trainops.") and "__init__" in vars(c)]
    params = {
        name
        for c in own
        for name, p in inspect.signature(c.__init__).parameters.items()
        if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }
    missing = sorted(params - documented(cls))
    assert not missing, f"{cls.__name__}: no :param line for {missing}"


def test_the_operators_and_sensors_are_all_found():
    names = {c.__name__ for c in OPERATORS_AND_SENSORS}
    assert {"GangTrainingOperator", "ClaimNodesOperator", "GpuHealthSensor", "CheckpointSensor"} <= names
