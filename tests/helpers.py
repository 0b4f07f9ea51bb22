"""Helpers several test files share (plain functions, not fixtures)."""
import signal
from contextlib import contextmanager

import pytest


class Overtime(BaseException):  # not an Exception: the never-raise guards must not swallow it
    pass


@contextmanager
def deadline(cpu_seconds: float):
    """Interrupt the block once THIS process has used `cpu_seconds` of CPU time (ITIMER_PROF: user +
    system, every thread; CPython's regex engine checks for signals). CPU time, not wall time: other
    jobs on a loaded machine do not consume it, and time spent waiting on a subprocess (a sandbox, the
    math-verify worker, which have deadlines of their own) is not counted. A stuck parser burns CPU."""
    def _raise(*_):
        raise Overtime
    old = signal.signal(signal.SIGPROF, _raise)
    signal.setitimer(signal.ITIMER_PROF, cpu_seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


@contextmanager
def bounded(cpu_seconds: float, label: str):
    """pytest.fail (not a hang) when the block uses more than `cpu_seconds` of this process's CPU."""
    try:
        with deadline(cpu_seconds):
            yield
    except Overtime:
        pytest.fail(f"{label}: still running after {cpu_seconds} CPU seconds")


class CountingEngine:
    """An engine that records each generate call's adapters, one list per call (the driver's rounds)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, reqs):
        self.calls.append([r.adapter for r in reqs])
        return self.inner.generate(reqs)


def play(env, task, replies):
    """Drive one episode with scripted replies: (roles spoken, turn rewards, metrics, turns seen). A set of
    prompts handed out at once takes the next replies, in its order."""
    from envs import prompts_of
    handed, roles, seen, replies = env.reset(task), [], [], list(replies)
    while replies:
        ps = prompts_of(handed)
        assert ps, "ended early"
        said, replies = replies[:len(ps)], replies[len(ps):]
        roles += [p.role for p in ps]
        seen += ps
        handed = env.step(said if isinstance(handed, list) else said[0])
    # the turn it wanted next, in full (a sandbox's reason, e.g. a timeout on a loaded machine, is in it)
    assert not prompts_of(handed), f"did not end; next: {[(p.role, p.messages[-1]['content']) for p in prompts_of(handed)]}"
    return roles, env.turn_rewards(), env.metrics(), seen


def _rank_main(fn, r, port, backend, out):
    import os

    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=r, world_size=2)
    try:
        out.put((r, fn(r)))
    finally:
        dist.destroy_process_group()


def on_two_ranks(fn, backend: str = "gloo", timeout: float = 120) -> dict:
    """{rank: fn(rank)} from 2 spawned processes in one process group (fn: a module-level function,
    its result picklable). A rank stuck in a collective is killed and the test fails, not hangs."""
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_rank_main, args=(fn, r, port, backend, q)) for r in range(2)]
    for p in ps:
        p.start()
    try:
        return dict(q.get(timeout=timeout) for _ in ps)
    finally:
        for p in ps:
            p.join(10)
            if p.is_alive():
                p.kill()
