"""Single-agent math baseline: one role ("solver") answers once; reward = math_reward.

The same data and the same reward as the 3-agent team (envs/math_3agent.py), so the two can be
compared at equal budget: the team must beat this.
"""
from __future__ import annotations

from agents.math_team import build_messages
from rewards.math import extract_answer, math_reward
from envs import Turn

ROLES = ("solver",)


class MathSingleEnv:
    roles = ROLES

    def reset(self, task: dict) -> Turn:
        self.problem, self.answer, self.reward, self.reply = task["question"], str(task["answer"]), None, None
        return Turn("solver", build_messages("solver", self.problem, []))

    def step(self, reply: str):
        self.reply, self.reward = reply, math_reward(reply, self.answer)
        return None

    def final_answer(self) -> str | None:
        """The answer this episode ends with (eval.py's majority vote)."""
        return extract_answer(self.reply) if self.reply is not None else None

    def turn_rewards(self):
        return [] if self.reward is None else [self.reward]

    def metrics(self):
        ok = float(self.reward or 0.0)
        return {"initial_correct": ok, "final_correct": ok, "team_reward": ok,
                "no_answer": float(self.reply is not None and extract_answer(self.reply) is None)}
