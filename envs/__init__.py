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
  reset(task) -> Prompt | list | None     required. Whose turn and what it sees
  step(reply_text) -> Prompt | list | None   required. The next turn's prompt, or None when the episode is
                                          done. The reply is hostile text: parse it in linear time, never raise.
                                          A list of Prompts hands out turns that do not depend on each other
                                          (a debate's solvers, video QA's captioner and grapher): the driver
                                          generates them in the same engine call (mixed adapters and all), numbers
                                          them in the list's order as if they came one by one (their seeds, turn
                                          indices and rewards' order), and calls step ONCE with the list of their
                                          replies in that order. One Prompt (the default) gets one reply string
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
                                          for ReMax's greedy baseline episode and tree sampling's chosen state
  rewards_so_far: bool                    optional (default False). True when turn_rewards() may be called
                                          after any step and gives the rewards of the turns so far (a turn's
                                          reward does not wait for later turns): rollout.tree_sampling needs it
  scripted_replies(task) -> list[str]     optional: as the module's function below, for THIS env's kwargs
                                          (its corpus, budgets, style); sft.py prefers it

The env module (the file), all optional:
  load_tasks(spec: str) -> list[dict]     the workflow's data loader (default: data.math_data.load_math)
  aggregate(episodes) -> dict             numbers over a batch of episodes that are not means of
                                          per-episode ones (e.g. a judge's precision); logged like metrics.
                                          The episodes are stand-ins (see "What aggregate receives")
  CONSOLE: tuple[str, ...]                names of metrics (from metrics() or aggregate()) that the
                                          console line prints after the rewards (trainer.console adds more)
  scripted_replies(task) -> list[str]     a perfect player's replies, in turn order: sft.py's scripted
                                          teacher writes SFT data from them (and tests check they score
                                          the maximum)
  check_config(cfg, grouped) -> (field, why) | None   rules across the env's options and the trainer's,
                                          checked before any model loads (workflows.check_roles; grouped:
                                          the estimators that centre per group, ppo.GROUPED)

What aggregate receives: a list (maybe empty) of episode stand-ins, not rollout.Episode objects with their envs.
  .metrics                                always: the dict env.metrics() returned, {} for an episode whose env
                                          raised: skip an episode that lacks the keys you read
  .samples                                maybe absent (compare.py, which replays saved trajectories, passes
                                          types.SimpleNamespace(metrics=m)). Where present (train.py's and
                                          eval's logs, gathered across ranks), one per model turn with .role,
                                          .reward and .completion_ids of the turn's length; the ids themselves,
                                          prompt_ids, logprobs and text are placeholders (empty or zeros)
  .env, .task, anything else              maybe absent or None: never read them
Read the optional parts with getattr(e, "samples", ()), never raise on a missing key, and return {} (or the
numbers that still mean something) for an empty list.

Conversations: a Prompt whose messages are an earlier turn's messages (of the same episode) + that turn's
reply verbatim as {"role": "assistant", "content": reply} + new messages continues that turn: the driver
builds its ids as the earlier prompt's ids + the ids the engine sampled + the chat template's delta
(chat.continue_ids), token for token. Keep a role's own growing chat that way (its own replies verbatim,
what others said as new user messages) and its turns share the prefix cache and train as one packed row.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Prompt:
    """Whose turn it is (a role name) and the chat messages that role sees: what an env hands the
    driver. (rollout.Sample is what the driver records of the turn: tokens, logprobs, reward.)

    `key` (optional): the turn's place in the episode's structure, compared across a task's chains by
    algo.group_by_turn: a turn is centred among the other chains' turns of the same role and key. None =
    the role's own turn count in the episode (its first, second, ... turn), right where a role's k-th turn
    means the same in every chain (the math teams; a writer after a varying number of analyzer rounds);
    an env whose turns of one role mean different things sets it (research: round r of sub-question i is
    ("sub", i, r), so sub-question 2 is compared with sub-question 2 however many rounds the first one
    took in each chain)."""
    role: str
    messages: list[dict]
    key: object = None


def prompts_of(handed) -> list[Prompt]:
    """What reset / step handed out, as a list: [] for None, [p] for one Prompt, the list itself."""
    return [] if handed is None else list(handed) if isinstance(handed, list) else [handed]


def play_replies(env, task, replies) -> list[tuple[Prompt, str]]:
    """Play one episode of `env` on `task` with scripted `replies` in turn order (a set of prompts handed out
    at once takes the next replies, in its order); stops when the env ends or the replies run out. Returns
    (prompt, reply) for every turn played. (sft.py's scripted teacher, the token benchmarks, tests.)"""
    handed, played, replies = env.reset(task), [], list(replies)
    while (ps := prompts_of(handed)) and len(replies) >= len(ps):
        said, replies = replies[:len(ps)], replies[len(ps):]
        played += list(zip(ps, said))
        handed = env.step(said if isinstance(handed, list) else said[0])
    return played


# --------------------------------------------------------------------------------------------
# Each env checks its own keyword arguments (data.env_kwargs) in its constructor, which
# workflows.check_roles calls before any model loads: a bad value is one ConfigError naming the
# field, never a right answer scored 0, an infinite reward or an exception in every episode.

def judge_counts(prefix: str, judged) -> dict[str, float]:
    """A judge-like role's verdicts as episode metrics: judged = [(approved: True / False / None = no verdict,
    truth: was what it judged right)] -> {prefix}_tp, _fp, _tn, _fn, _none (no verdict on a right one),
    _none_wrong; aggregate's judge_rates reads them."""
    c = dict.fromkeys(("tp", "fp", "tn", "fn", "none", "none_wrong"), 0.0)
    for v, t in judged:
        c[("tp" if t else "fp") if v is True else ("fn" if t else "tn") if v is False else ("none" if t else "none_wrong")] += 1
    return {f"{prefix}_{k}": v for k, v in c.items()}


def judge_rates(prefix: str, tot: dict) -> dict[str, float]:
    """Over summed judge_counts: {prefix}_tpr (right ones approved, of the right ones judged; no verdict counts
    as not approved), _tnr (wrong ones rejected, of the wrong ones; no verdict does not reject) and
    _approve_rate (approvals of all verdicts asked for); {} where nothing was judged."""
    g = lambda k: float(tot.get(f"{prefix}_{k}", 0.0))  # noqa: E731
    right, wrong = g("tp") + g("fn") + g("none"), g("fp") + g("tn") + g("none_wrong")
    if not right + wrong:
        return {}
    return {f"{prefix}_tpr": g("tp") / max(right, 1.0), f"{prefix}_tnr": g("tn") / max(wrong, 1.0),
            f"{prefix}_approve_rate": (g("tp") + g("fp")) / (right + wrong)}


MIN_TIMEOUT = 1
"""the least timeout in seconds of a sandboxed run (the code team's tests, math_tool's code, SWE's tests): the
sandbox starts its Python processes (~0.1 s on an idle machine); below it right code runs out of time and
scores 0 (a timeout of 1e-3 did on every task)"""

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


def need_choice(name: str, v, choices: tuple):
    if not isinstance(v, str) or v not in choices:
        raise _bad(name, f"must be one of {', '.join(map(repr, choices))}, got {v!r}")
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
