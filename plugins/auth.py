"""Airflow's login for the plugin's routes: plugin FastAPI apps are not behind Airflow's auth, so
each route resolves the user itself, as the core API does (``Authorization: Bearer <JWT>`` first,
else the UI's ``_token`` cookie, through the auth manager), and asks the auth manager whether the
user may read or edit DAG runs.  No valid login: 401; a login without the permission: 403."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request, status


async def current_user(request: Request) -> Any:
    """The logged-in user of ``request``; 401/403 from Airflow's own resolution otherwise."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import (
        USER_INJECTED_BY_TRUSTED_MIDDLEWARE,
        resolve_user_from_token,
    )

    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token:
        return await resolve_user_from_token(token.strip())
    user = getattr(request.state, "user", None)
    if user and getattr(request.state, "user_authenticated_via", None) is USER_INJECTED_BY_TRUSTED_MIDDLEWARE:
        return user
    return await resolve_user_from_token(request.cookies.get(COOKIE_NAME_JWT_TOKEN))


def require_dag_run(user: Any, method: str, dag_id: str | None = None) -> None:
    """403 unless the auth manager lets ``user`` ``method`` (GET, PUT...) the DAG runs of ``dag_id`` (all DAGs: None)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    allowed = get_auth_manager().is_authorized_dag(
        method=method,
        access_entity=DagAccessEntity.RUN,
        details=DagDetails(id=dag_id) if dag_id else None,
        user=user,
    )
    if not allowed:
        what = "edit" if method != "GET" else "read"
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"user {user.get_name()!r} may not {what} the DAG runs of {dag_id or 'every DAG'}",
        )
