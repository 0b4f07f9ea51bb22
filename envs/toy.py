"""A toy workflow a random model can learn: one role, `speaker`, answers a prompt and earns the
fraction of its reply's non-space characters that are the digit TARGET ("7"). A random `tiny` model
starts near 0.085 (the first step's reward on tiny_toy) and every estimator lifts it by more than 0.2
within 12 CPU steps, so end-to-end tests exercise non-zero advantages (math is out of reach for a
random model).

    python train.py --config configs/tiny_toy.py
"""
from __future__ import annotations

from envs import Prompt

ROLES = ("speaker",)
TARGET = "7"  # the character the speaker is paid for
PROMPTS = ("Say something.", "Write a line.", "Tell me more.", "Go on.", "Your turn.", "Reply please.",
           "What now?", "Speak.")


def load_tasks(spec: str = "toy") -> list[dict]:
    """The same eight prompts for any spec (train and val alike: the reward is about style)."""
    return [{"question": p, "answer": ""} for p in PROMPTS]


def target_fraction(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c == TARGET for c in chars) / len(chars) if chars else 0.0


class ToyEnv:
    roles = ROLES
    rewards_so_far = True  # each turn is paid at its step (rollout.tree_sampling)

    def reset(self, task: dict) -> Prompt:
        self.reward = None
        return Prompt("speaker", [{"role": "user", "content": task["question"]}])

    def step(self, reply: str) -> None:
        self.reward = target_fraction(reply)
        return None

    def turn_rewards(self) -> list[float]:
        return [self.reward]

    def metrics(self) -> dict:
        return {"team_reward": self.reward}
