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
