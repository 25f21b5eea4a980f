"""One error root: every error cec raises for a user's situation is a `cec.CecError`, so a caller (the CLI,
the worker, a user's code) catches one class; store, recovery, pipeline and replay-divergence errors are
under it."""

from __future__ import annotations

import inspect

import pytest

import operators.exceptions
import queuestore.exceptions
import recovery.exceptions
from cec.exceptions import CecError
from operators.exceptions import PipelineFailedError
from operators.worker import USER_ERRORS
from queuestore.exceptions import QueueStoreError, WriterFailedError
from recovery.exceptions import InputMismatchError, RecoveryError, ReplayDivergenceError


@pytest.mark.parametrize("module", [queuestore.exceptions, recovery.exceptions, operators.exceptions])
def test_every_error_class_of_a_package_is_a_cec_error(module: object) -> None:
    classes = [c for _, c in inspect.getmembers(module, inspect.isclass) if issubclass(c, BaseException)]
    assert classes
    assert [c.__name__ for c in classes if not issubclass(c, CecError)] == []


def test_the_roots_of_stores_recovery_and_pipelines_are_under_cec_error() -> None:
    for error in (QueueStoreError, WriterFailedError, RecoveryError, InputMismatchError, PipelineFailedError):
        assert issubclass(error, CecError), error
    assert issubclass(ReplayDivergenceError, RecoveryError)
    assert not issubclass(ReplayDivergenceError, RuntimeError)  # no bare RuntimeError for a divergence
    assert list(USER_ERRORS) == [CecError]
