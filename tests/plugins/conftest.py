"""The plugin's FastAPI app mounted at ``/trainops`` as the API server mounts it, with Airflow's
auth manager (SimpleAuthManager) in this process and JWTs it signed."""

from __future__ import annotations

import pytest


@pytest.fixture
def ui(airflow_db):
    """``(client, token(role))``: a TestClient of a root app with the plugin at ``/trainops``."""
    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from trainops.plugins.app import app

    manager = init_auth_manager()
    root = FastAPI()
    root.mount("/trainops", app)

    def token(role: str | None, username: str = "alice") -> str:
        return manager.generate_jwt(SimpleAuthManagerUser(username=username, role=role))

    with TestClient(root) as client:
        yield client, token
