"""Workflows, one file each: the task, the turn order between roles, the shared history and the
reward each role earns. Envs are plain Python (no torch): the trainer imports them, never the
other way round.

The interface every env implements (driven by rollout.run_episodes):
  env.roles: tuple[str, ...]              the role names it asks for (checked against the config)
  env.reset(task) -> Turn | None          whose turn and what it sees
  env.step(reply_text) -> Turn | None     the next turn, or None when the episode is done
  env.turn_rewards() -> list[float]       after done: one reward per model turn, in order
  env.metrics() -> dict                   after done: episode-level numbers (team reward, ...)
Optional:
  env.turn_labels() -> list               after done: per model turn, a label (e.g. the truth of what
                                          a judge judged) or None. The trainer leaves out of the update
                                          every group (task, role[, turn]) of several turns whose labels
                                          all agree: a judge learns from groups where what it judged differs
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Turn:
    """Whose turn it is (a role name) and the chat messages that role sees."""
    role: str
    messages: list[dict]


# --------------------------------------------------------------------------------------------
# Each env checks its own keyword arguments (data.env_kwargs) in its constructor, which
# workflows.check_roles calls before any model loads: a bad value is one ConfigError naming the
# field, never a right answer scored 0, an infinite reward or an exception in every episode.

MAX_FILE_BYTES = 256 * 2**20
"""files an env reads whole (a search corpus) are regular files of at most this size: a FIFO would
hang the read, /dev/zero would fill memory"""


def _bad(name: str, msg: str):
    from config import ConfigError  # a ValueError that train.py prints as one line
    return ConfigError(f"config field data.env_kwargs.{name}: {msg}")


def need_int(name: str, v, lo: int, hi: int):
    """An integer (not a bool, not 3.0, not 1e999) in [lo, hi]."""
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(name, f"must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def need_number(name: str, v, lo: float, hi: float, lo_open: bool = False):
    """A finite number (int or float, not a bool or a string) in [lo, hi] ((lo, hi] with lo_open)."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (lo < v if lo_open else lo <= v) and v <= hi
    if not ok:  # NaN fails every comparison
        raise _bad(name, f"must be a number in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")
    return float(v)


def need_bool(name: str, v):
    if not isinstance(v, bool):
        raise _bad(name, f"must be true or false, got {v!r}")
    return v


def need_file(name: str, path, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A regular file of at most max_bytes (checked before anything opens it)."""
    from pathlib import Path
    if not isinstance(path, str) or not path:
        raise _bad(name, f"must be a file path, got {path!r}")
    p = Path(path)
    if not p.is_file():
        raise _bad(name, f"{path} " + ("does not exist" if not p.exists() else "is not a regular file"))
    if p.stat().st_size > max_bytes:
        raise _bad(name, f"{path} has {p.stat().st_size} bytes, more than the {max_bytes} an env reads whole")
    return path
