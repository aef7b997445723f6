"""trainops errors as Airflow sees them: permanent ones (and bad input) fail the task without retries,
temporary ones fail only the try."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException
from trainops.provider.errors import translate_errors

from trainops.capacity.claims import ClaimError, NodesHeld
from trainops.errors import PermanentError, TemporaryError, TrainopsError
from trainops.kube.retry import DeadlineExceeded


def raising(error):
    @translate_errors
    def execute(self, context):
        raise error

    return execute


@pytest.mark.parametrize(
    "error",
    [
        ClaimError("node n1: annotation trainops.io/claim-prior is missing"),
        ValueError("nodes: expected a list"),
    ],
)
def test_permanent_errors_and_bad_input_fail_the_task_without_retries(error):
    with pytest.raises(AirflowFailException, match=str(error)) as raised:
        raising(error)(None, {})
    assert raised.value.__cause__ is error


@pytest.mark.parametrize(
    "error", [NodesHeld({"n1": "dag/run"}), DeadlineExceeded("list nodes: 503 for 120s")]
)
def test_temporary_errors_fail_only_the_try(error):
    with pytest.raises(type(error)) as raised:
        raising(error)(None, {})
    assert raised.value is error


def test_every_trainops_error_says_whether_retrying_can_help():
    import trainops.capacity.drain
    import trainops.capacity.procedure
    import trainops.capacity.quota
    import trainops.checkpoints.formats.dcp_metadata
    import trainops.checkpoints.helper
    import trainops.checkpoints.store
    import trainops.health.gate
    import trainops.health.ib_reader
    import trainops.health.prometheus
    import trainops.health.quarantine  # noqa: F401

    def leaves(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from leaves(sub)

    found = [c for c in leaves(TrainopsError) if c not in (TemporaryError, PermanentError)]
    assert len(found) >= 14
    assert all(issubclass(c, TemporaryError) != issubclass(c, PermanentError) for c in found)
