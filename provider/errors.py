"""The one place trainops errors become Airflow's: wrap ``execute``, ``execute_complete`` and ``poke``.

``PermanentError`` and bad input (``ValueError``, which names the field and the fix) fail the task
without retries (``AirflowFailException``): the next try would fail the same way.  Everything
else, ``TemporaryError`` included, fails only this try, which Airflow retries (``retries``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from airflow.sdk.exceptions import AirflowFailException

from trainops.errors import PermanentError

F = TypeVar("F", bound=Callable)


def translate_errors(method: F) -> F:
    """``method`` with permanent errors raised as ``AirflowFailException`` (see the module docstring)."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except (PermanentError, ValueError) as error:
            raise AirflowFailException(f"{type(error).__name__}: {error}") from error

    return wrapper  # type: ignore[return-value]
