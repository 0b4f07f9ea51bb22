"""Single-agent math baseline: one role ("solver") answers once; reward = math_reward.

The same data and the same reward as the 3-agent team (envs/math_3agent.py), so the two can be
compared at equal budget: the team must beat this.

self_refine=True is the baseline reviewers ask for: the solver gets the team's number of generations
by seeing its own solution and revising it once (Self-Refine, one round). Each turn is paid its own
correctness; the team reward is the final answer's; refine_fixed / refine_broken count the revisions.
revision_reward="relative" pays the revision like the team's refiner (envs/math_3agent.py
refiner_reward="relative"): a fix +1, a break -1, keeping a right answer +0.5, staying wrong 0.
Paid on its correctness (the default), a revision that repeats the first answer earns what the first
answer earned, so RL can turn the revision into a copy (docs/experiments.md, arm a''). With "relative", use
algo.group_by_turn so that revisions are centred among revisions, not among first answers.
"""
from __future__ import annotations

from agents.math_team import build_messages, solution_text
from rewards.math import REVISION_REWARD, extract_answer, math_reward
from envs import Prompt, need_bool

ROLES = ("solver",)


class MathSingleEnv:
    roles = ROLES
    rewards_so_far = True  # each turn is paid at its step (rollout.tree_sampling)

    def __init__(self, self_refine: bool = False, revision_reward: str = "correctness"):
        self.self_refine = need_bool("self_refine", self_refine)
        if revision_reward not in ("correctness", "relative"):
            raise ValueError(f"revision_reward must be 'correctness' or 'relative', got {revision_reward!r}")
        if revision_reward == "relative" and not self_refine:
            raise ValueError("revision_reward='relative' pays the revision of self_refine=True: set self_refine")
        self.relative = revision_reward == "relative"

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

    def scripted_replies(self, task: dict) -> list[str]:
        """A perfect solver (sft.py's scripted teacher): the right solution in the words the math team's teacher
        gives its refiner ("79 - 26 = 53, so the answer is \\boxed{53}."; agents.math_team.solution_text), and
        under self_refine the same again as its revision. The control for a team whose roles were taught: one
        agent given the same teacher's solutions (arm a-sft, docs/experiments.md)."""
        sol = solution_text(task["question"], str(task["answer"]))
        return [sol, sol] if self.self_refine else [sol]

    def final_answer(self) -> str | None:
        """The answer this episode ends with (eval.py's majority vote)."""
        return extract_answer(self.replies[-1]) if self.replies else None

    def turn_rewards(self):
        c = self.correct
        if self.relative and len(c) == 2:  # fix +1, break -1, keep right +0.5, stay wrong 0
            return [float(c[0]), REVISION_REWARD[(c[0], c[1])]]
        return [float(x) for x in c]

    def metrics(self):
        c = self.correct
        out = {"initial_correct": float(bool(c) and c[0]), "final_correct": float(bool(c) and c[-1]),
               "team_reward": float(bool(c) and c[-1]),
               "no_answer": float(bool(self.replies) and extract_answer(self.replies[-1]) is None)}
        if self.self_refine:
            out.update(refine_fixed=float(len(c) == 2 and not c[0] and c[1]), refine_broken=float(len(c) == 2 and c[0] and not c[1]))
        return out
