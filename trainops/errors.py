"""The errors trainops raises, on one base, split by whether retrying can help.

``TemporaryError``: the same call later may succeed (the API server kept failing until a
deadline, nodes are held by another run, a step of the return failed).  ``PermanentError``:
nothing changes until a person does (bad input or records, a node that must be released by hand,
a checkpoint that is not what it claims).  The Airflow side maps the first to a failed try that
Airflow retries and the second to a task failure without retries (``trainops.provider.errors``).
"""

from __future__ import annotations


class TrainopsError(Exception):
    """Every error trainops raises on purpose."""


class TemporaryError(TrainopsError):
    """Retrying later can help."""


class PermanentError(TrainopsError):
    """Retrying cannot help until something is changed; the message says what."""
