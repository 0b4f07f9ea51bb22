"""Single-agent math baseline: one role ("solver") answers once; reward = math_reward.

The same data and the same reward as the 3-agent team (envs/math_3agent.py), so the two can be
compared at equal budget: the team must beat this.

self_refine=True is the baseline reviewers ask for: the solver gets the team's number of generations
by seeing its own solution and revising it once (Self-Refine, one round). Each turn is paid its own
correctness; the team reward is the final answer's; refine_fixed / refine_broken count the revisions.
"""
from __future__ import annotations

from agents.math_team import build_messages
from rewards.math import extract_answer, math_reward
from envs import Prompt, need_bool

ROLES = ("solver",)


class MathSingleEnv:
    roles = ROLES

    def __init__(self, self_refine: bool = False):
        self.self_refine = need_bool("self_refine", self_refine)

    def reset(self, task: dict) -> Prompt:
        self.problem, self.answer = task["question"], str(task["answer"])
        self.replies: list[str] = []
        self.correct: list[bool] = []
        return Prompt("solver", build_messages("solver", self.problem, []))

    def step(self, reply: str):
        self.replies.append(reply)
        self.correct.append(math_reward(reply, self.answer) == 1.0)
        if self.self_refine and len(self.replies) == 1:  # one revision of its own solution
            return Prompt("solver", build_messages("solver_revision", self.problem, [("solver", reply)]))
        return None

    def final_answer(self) -> str | None:
        """The answer this episode ends with (eval.py's majority vote)."""
        return extract_answer(self.replies[-1]) if self.replies else None

    def turn_rewards(self):
        return [float(c) for c in self.correct]

    def metrics(self):
        c = self.correct
        out = {"initial_correct": float(bool(c) and c[0]), "final_correct": float(bool(c) and c[-1]),
               "team_reward": float(bool(c) and c[-1]),
               "no_answer": float(bool(self.replies) and extract_answer(self.replies[-1]) is None)}
        if self.self_refine:
            out.update(refine_fixed=float(len(c) == 2 and not c[0] and c[1]), refine_broken=float(len(c) == 2 and c[0] and not c[1]))
        return out
