"""Helpers several test files share (plain functions, not fixtures)."""
import signal
from contextlib import contextmanager

import pytest


class Overtime(BaseException):  # not an Exception: the never-raise guards must not swallow it
    pass


@contextmanager
def deadline(seconds: float):
    """Interrupt the block after `seconds` (CPython's regex engine checks for signals)."""
    def _raise(*_):
        raise Overtime
    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextmanager
def bounded(seconds: float, label: str):
    """pytest.fail (not a hang) when the block runs past `seconds`."""
    try:
        with deadline(seconds):
            yield
    except Overtime:
        pytest.fail(f"{label}: still running after {seconds} s")


def play(env, task, replies):
    """Drive one episode with scripted replies: (roles spoken, turn rewards, metrics, turns seen)."""
    turn, roles, seen = env.reset(task), [], []
    for r in replies:
        assert turn is not None, "ended early"
        roles.append(turn.role)
        seen.append(turn)
        turn = env.step(r)
    assert turn is None, "did not end"
    return roles, env.turn_rewards(), env.metrics(), seen
