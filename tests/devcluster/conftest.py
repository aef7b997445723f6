"""The ``api`` fixture: a small local API server (see ``local_api.py``)."""

from __future__ import annotations

import pytest

from tests.devcluster.local_api import LocalApi


@pytest.fixture
def api(tmp_path):
    server = LocalApi(tmp_path)
    yield server
    server.close()
