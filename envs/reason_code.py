"""A reasoner and a coder, until they agree (AT-GRPO's math team, arXiv 2510.11062): each round both solve the
problem, the reasoner in words, the coder in Python run in the sandbox; the episode ends when their answers
agree, or after `max_rounds` rounds.

    reasoner  its own chat: the problem; its reply ends with \\boxed{answer} (read as math_reward reads it)
    coder     its own chat: the problem; its reply is one ```python block, run by runtime.tools.run_code_ok
              (`code_timeout` seconds, at least envs.MIN_TIMEOUT); the last line the program prints, when
              it ran cleanly, is its answer (no fenced block, an error or no output: no answer)

The two turns of a round need nothing from each other: they are handed out at once (a list of two Prompts, one
engine call). When their answers differ (answers compare as rewards.math.answer_key: 7, 7.0 and 14/2 agree),
a new round: each chat goes on with a user message holding the other's answer and the coder's output (the
coder's own output to the coder), so each role's next turn extends its last one token for token.

Rewards per turn: 1 if its own answer is right, else 0, plus `agree_bonus` (default 0) on both turns of the
round in which they agree. The team reward is the agreed answer's correctness, or, with no agreement, the
reasoner's last answer's. Metrics: team_reward, agreed, rounds, reasoner_correct and coder_correct (their last
round's answers), reasoner_alone and coder_alone (their round-1 answers: a round-1 prompt is the problem alone, so
each is that role's score as a one-turn agent on the same tasks), code_ran (the share of the coder's programs that
ran cleanly).

`scripted_replies(task)` is a perfect team (both right in round 1); `scripted_repair(task)` a lesson for the
second round: the reasoner slips in round 1 (a step skipped or a wrong last value; sft.py never teaches that
turn), the coder is right, and in round 2 the reasoner redoes the steps and the coder runs its program again.
Both read the worked solution of data/multistep_data.py (the task's `steps`); a task without one gets [] / None.
"""
from __future__ import annotations

import zlib

from data.math_data import load_math
from data.multistep_data import run_steps, steps_program
from envs import MIN_TIMEOUT, Prompt, need_int, need_number
from runtime.tools import run_code_ok
from rewards.code import extract_code
from rewards.math import answer_key, extract_answer, is_equiv

ROLES = ("reasoner", "coder")
SYSTEM = {"reasoner": "You solve math word problems step by step in words. End with the final answer as \\boxed{answer}.",
          "coder": "You solve math word problems with Python. Reply with one ```python block that computes the answer "
                   "and prints it as the last line it prints."}
ASK = {"reasoner": "Solve it step by step and end with \\boxed{answer}.",
       "coder": "Write one ```python block that prints the answer."}
SHOWN = 300  # characters of an answer or of the program's output shown to the other role (the tail of an output)


NO_CODE = "(nothing ran: no ```python block)"


def coder_answer(reply: str, timeout: float) -> tuple[str, bool, str | None]:
    """(output, ran cleanly, answer) of a coder's reply: its last fenced block (rewards.code.extract_code) run in
    the sandbox, the answer the last line it printed when it ran cleanly; no block: nothing runs. Never raises."""
    text = reply if isinstance(reply, str) else ""
    code = extract_code(text)
    if code == text:  # no fenced block (a block is never the whole reply: the fences are not in it)
        return NO_CODE, False, None
    out, ok = run_code_ok(code, timeout)
    lines = out.strip().splitlines() if ok and out != "(no output)" else []
    return out, ok, (lines[-1].strip() or None) if lines else None


def _right(answer: str | None, truth: str) -> bool:
    return answer is not None and is_equiv(answer, truth)


def _shown(answer: str | None) -> str:
    return "none" if answer is None else answer[:SHOWN]


class ReasonCodeEnv:
    roles = ROLES
    rewards_so_far = True  # each turn is paid at its step (rollout.tree_sampling)

    def __init__(self, max_rounds: int = 4, agree_bonus: float = 0.0, code_timeout: float = 5.0):
        self.max_rounds = need_int("max_rounds", max_rounds, 1, 16)
        self.agree_bonus = need_number("agree_bonus", agree_bonus, 0, 10)
        self.timeout = need_number("code_timeout", code_timeout, MIN_TIMEOUT, 600)

    def reset(self, task: dict):
        self.problem, self.answer = task["question"], str(task["answer"])
        opening = f"Problem: {self.problem}\n\n"
        self.chats = {r: [{"role": "system", "content": SYSTEM[r]}, {"role": "user", "content": opening + ASK[r]}]
                      for r in ROLES}
        self.rewards: list[float] = []
        self.said: list[tuple[str | None, str | None]] = []  # (reasoner's answer, coder's answer) per round
        self.ran: list[bool] = []
        self.agreed, self.done = False, False
        return self._hand()

    def _hand(self) -> list[Prompt]:
        return [Prompt(r, list(self.chats[r])) for r in ROLES]  # copies: the driver keeps the messages it saw

    def step(self, reply):
        if self.done:
            raise RuntimeError("step() after the episode ended")
        replies = list(reply) if isinstance(reply, (list, tuple)) else [reply]
        reasoning, code = [r if isinstance(r, str) else "" for r in (replies + ["", ""])[:2]]
        mine = extract_answer(reasoning)
        out, ok, theirs = coder_answer(code, self.timeout)
        self.said.append((mine, theirs))
        self.ran.append(ok)
        self.agreed = mine is not None and theirs is not None and answer_key(mine) == answer_key(theirs)
        bonus = self.agree_bonus if self.agreed else 0.0
        self.rewards += [float(_right(mine, self.answer)) + bonus, float(_right(theirs, self.answer)) + bonus]
        for role, text in (("reasoner", reasoning), ("coder", code)):
            self.chats[role].append({"role": "assistant", "content": text})  # verbatim: the next round extends it
        if self.agreed or len(self.said) >= self.max_rounds:
            self.done = True
            return None
        output = f"printed:\n{out.strip()[-SHOWN:]}"
        self.chats["reasoner"].append({"role": "user", "content": (
            f"The coder's program {output}\n\nThe coder's answer: {_shown(theirs)}. Yours: {_shown(mine)}. They differ: "
            "check your steps. " + ASK["reasoner"])})
        self.chats["coder"].append({"role": "user", "content": (
            f"Your program {output}\n\nThe reasoner's answer: {_shown(mine)}. Yours: {_shown(theirs)}. They differ: "
            "check your code. " + ASK["coder"])})
        return self._hand()

    def final_answer(self) -> str | None:
        """The agreed answer, else the reasoner's last (eval.py's majority vote)."""
        return self.said[-1][0] if self.said else None

    def turn_rewards(self) -> list[float]:
        return list(self.rewards)

    def metrics(self) -> dict:
        """reasoner_alone and coder_alone: each role's round-1 answer, right or not. A round-1 prompt is the
        problem alone, so that is what the role scores as a one-turn agent on the same task, with the same adapter
        and sampling: the team's own members as baselines, measured on its episodes at no extra cost."""
        mine, theirs = self.said[-1] if self.said else (None, None)
        first = self.said[0] if self.said else (None, None)
        return {"team_reward": float(_right(mine, self.answer)), "agreed": float(self.agreed),
                "rounds": float(len(self.said)), "reasoner_correct": float(_right(mine, self.answer)),
                "coder_correct": float(_right(theirs, self.answer)),
                "reasoner_alone": float(_right(first[0], self.answer)), "coder_alone": float(_right(first[1], self.answer)),
                "code_ran": sum(self.ran) / max(1, len(self.ran))}

    def scripted_repair(self, task: dict) -> list[str] | None:
        """scripted_repair(task), where this env has a second round (max_rounds >= 2), else None."""
        return scripted_repair(task) if self.max_rounds >= 2 else None


def aggregate(episodes) -> dict:
    """Over a batch: agree_precision (right answers among the agreed episodes: what agreement is worth as a
    stopping rule), first_round_agreed (episodes that agreed in round 1) and mean tokens per turn of each role
    (where the episodes carry their turns)."""
    ms = [e.metrics for e in episodes if e.metrics and "agreed" in e.metrics]  # not an env error's
    out = {}
    if ms:
        agreed = [m for m in ms if m["agreed"]]
        out["first_round_agreed"] = sum(m["agreed"] and m["rounds"] == 1 for m in ms) / len(ms)
        if agreed:
            out["agree_precision"] = sum(m["team_reward"] for m in agreed) / len(agreed)
    for role in ROLES:
        steps = [s for e in episodes for s in getattr(e, "samples", ()) if s.role == role]
        if steps:
            out[f"tokens/{role}"] = sum(len(s.completion_ids) for s in steps) / len(steps)
    return out


def check_config(cfg, grouped: tuple) -> tuple[str, str] | None:
    """Rules across the env's options and the trainer's (workflows.check_roles): each round's turn is paid on its
    own answer, so no merged sequence (it would train round 1 on the last round's reward); and a round is two
    turns, so rollout.max_turns must leave room for max_rounds of them (rounds past it would be cut)."""
    rounds = cfg.data.env_kwargs.get("max_rounds", 4)
    if not isinstance(rounds, int):
        return None  # the env's own check names it
    if rounds > 1 and cfg.rollout.merge_turns:
        return ("rollout.merge_turns", f"max_rounds={rounds}: each round's turns are paid apart; merging would train "
                "a role's first answer on its last round's reward (algo.pack_turns still packs them)")
    if cfg.rollout.max_turns < 2 * rounds:
        return ("rollout.max_turns", f"{cfg.rollout.max_turns} cuts the episode short: max_rounds={rounds} rounds of "
                f"two turns need {2 * rounds}")
    return None


def load_tasks(spec: str) -> list[dict]:
    """Rows of data/multistep_data.py (or any math rows: the teacher then has nothing to say)."""
    return load_math(spec)


CONSOLE = ("agreed", "rounds", "code_ran")


# --------------------------------------------------------------------------------------------
# the scripted teacher: the task's worked solution (data/multistep_data.py's `steps`)

def _worked(steps) -> list[tuple[str, str, int]] | None:
    """[(name, the expression with earlier values put in, its value)], or None for no (or unreadable) steps."""
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) for s in steps):
        return None
    try:
        values = run_steps(steps)
    except (ValueError, SyntaxError, RecursionError):
        return None
    env, out = {}, []
    for line, (name, value) in zip(steps, values):
        expr = " ".join(str(env.get(w, w)) for w in line.partition(" = ")[2].split()).replace("//", "/")
        out.append((name, expr, value))
        env[name] = value
    return out


def _reasoning(worked, answer: int, opening: str = "") -> str:
    lines = [f"{name.replace('_', ' ')} = {expr} = {value}" if expr != str(value) else f"{name.replace('_', ' ')} = {value}"
             for name, expr, value in worked]
    return opening + "\n".join(lines) + f"\nSo the answer is \\boxed{{{answer}}}."


def _program(task) -> str:
    return f"```python\n{steps_program(task['steps'])}\n```"


def scripted_replies(task: dict) -> list[str]:
    """A perfect team's round: the reasoner's steps with their values, ending \\boxed{answer}; the coder's program
    (the steps as Python, printing the last). [] for a task without readable steps that give its answer."""
    worked = _worked(task.get("steps"))
    if worked is None or str(worked[-1][2]) != str(task["answer"]).strip():
        return []
    return [_reasoning(worked, worked[-1][2]), _program(task)]


def scripted_repair(task: dict) -> list[str] | None:
    """Two rounds: the reasoner slips (drawn per task: the last step left out, or its value off by 1-9) while the
    coder is right; they differ, and in round 2 the reasoner works the steps again to the right answer and the
    coder runs its program again. None where scripted_replies has nothing."""
    right = scripted_replies(task)
    if not right:
        return None
    worked, rng = _worked(task["steps"]), zlib.crc32(task["question"].encode("utf-8", "replace"))
    if len(worked) > 1 and rng % 2:
        slip = _reasoning(worked[:-1], worked[-2][2])  # stops a step early
    else:
        name, expr, value = worked[-1]
        wrong = value + (1 + rng // 2 % 9) * (1 if value < 10 or rng // 32 % 2 else -1)
        slip = _reasoning(worked[:-1] + [(name, expr, wrong)], wrong)
    if extract_answer(slip) == str(worked[-1][2]):  # a step early that gives the same number: slip the value
        slip = _reasoning(worked[:-1] + [(worked[-1][0], worked[-1][1], worked[-1][2] + 1)], worked[-1][2] + 1)
    again = _reasoning(worked, worked[-1][2], "The coder's answer differs from mine, so I work the steps again.\n")
    return [slip, right[1], again, right[1]]
