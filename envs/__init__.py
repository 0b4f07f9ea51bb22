"""Workflows, one file each: the task, the turn order between roles, the shared history and the
reward each role earns. Envs are plain Python (no torch): the trainer imports them, never the
other way round. A new workflow is `envs/<name>.py` + `configs/<name>.py` (data.env =
"envs/<name>.py:MyEnv", or a name added to workflows.BUILTINS); nothing else is edited.

THE ENV CONTRACT, all of it (driven by rollout.run_episodes; every optional hook has a default).

The env class (one instance per episode, built with data.env_kwargs as keyword arguments):
  roles: tuple[str, ...]                  required. The role names it asks for (checked against the
                                          config's roles before any model loads)
  __init__(**env_kwargs)                  required. Validate every kwarg here, one ValueError naming it:
                                          workflows.check_roles builds one env before the model loads
  reset(task) -> Turn | None              required. Whose turn and what it sees
  step(reply_text) -> Turn | None         required. The next turn, or None when the episode is done.
                                          The reply is hostile text: parse it in linear time, never raise
  turn_rewards() -> list[float]           required, after done: one reward per model turn, in order
  metrics() -> dict[str, float]           required, after done: episode-level numbers; "team_reward" is
                                          the team's score (eval, compare.py); every key is logged as
                                          train/<key> and val/<key> (the mean over episodes)
  turn_labels() -> list                   optional (default: no labels). Per model turn, a label (e.g. the
                                          truth of what a judge judged) or None: the trainer leaves out
                                          groups (task, role[, turn]) of several turns whose labels all agree
  final_answer() -> str | None            optional (default: eval.py's --maj-k refuses the workflow). The
                                          episode's answer, for majority voting
  fork() -> env                           optional (default: copy.deepcopy). A copy at the current turn,
                                          for ReMax's greedy baseline episode

The env module (the file), all optional:
  load_tasks(spec: str) -> list[dict]     the workflow's data loader (default: data.math_data.load_math)
  aggregate(episodes) -> dict             numbers over a batch of episodes that are not means of
                                          per-episode ones (e.g. a judge's precision); logged like metrics
  CONSOLE: tuple[str, ...]                names of metrics (from metrics() or aggregate()) that the
                                          console line prints after the rewards (trainer.console adds more)
  scripted_replies(task) -> list[str]     a perfect player's replies, in turn order: sft.py's scripted
                                          teacher writes SFT data from them (and tests check they score
                                          the maximum)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Turn:
    """Whose turn it is (a role name) and the chat messages that role sees."""
    role: str
    messages: list[dict]
