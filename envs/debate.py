"""A debate: N solvers answer a math problem independently, may revise after reading each other, and a
judge picks the team's answer among the final candidates (multi-agent debate, Du et al. 2023; the judge
that picks among N candidates of best-of-N).

    solver   `candidates` turns a round, each in a conversation of its own: the problem; in each debate
             round after the first (`rounds` > 1) its conversation goes on with what the other solvers
             answered, as a new user message, and it writes its final solution. Its own earlier reply stays
             verbatim in its chat, so a revision extends its first turn token for token.
    judge    one turn: the problem and the final candidates, numbered; ends with "Answer: <number>"

The solvers of a round need nothing from each other: with `parallel` (default on) they are handed out
together and share one engine call (a round costs one decode, not N); off, one after another, with the
same prompts, seeds and rewards.

Rewards: a solver's turn 1 if its answer (extracted as math_reward reads it) is right, else 0; the judge 1 if
the candidate it picks is right, else 0 (no readable pick: 0). The team reward is the picked candidate's
correctness. Metrics: pick_correct, any_correct (the best a judge could do), majority_correct (the most common
final answer, ties to the earliest), candidates_agree (every final answer the same), no_pick.
"""
from __future__ import annotations

import re
from collections import Counter

from agents.math_team import build_messages, solution_text
from envs import Prompt, need_bool, need_int
from rewards.math import extract_answer, math_reward

ROLES = ("solver", "judge")
JUDGE = ("You judge math solutions. Read the numbered candidate solutions, work out which final answer is right, "
         "and end with exactly one line: 'Answer: <number of the candidate>'.")
_PICK = re.compile(r"answer\W{0,3}(?:candidate\W{0,3})?(\d{1,2})\b", re.IGNORECASE)


def parse_pick(reply: str, n: int) -> int | None:
    """The candidate (0-based) a judge's reply picks: its last "Answer: k" with 1 <= k <= n, else None."""
    last = None
    for m in _PICK.finditer(reply if isinstance(reply, str) else ""):
        last = m
    k = int(last.group(1)) if last else 0
    return k - 1 if 1 <= k <= n else None


class DebateEnv:
    roles = ROLES

    def __init__(self, candidates: int = 2, rounds: int = 1, parallel: bool = True):
        self.n = need_int("candidates", candidates, 2, 8)
        self.rounds = need_int("rounds", rounds, 1, 3)
        self.parallel = need_bool("parallel", parallel)

    def reset(self, task: dict):
        self.problem, self.answer = task["question"], str(task["answer"])
        self.chats = [build_messages("solver", self.problem, []) for _ in range(self.n)]  # each solver's own chat
        self.said: list[list[str]] = [[] for _ in range(self.n)]  # each solver's replies, by round
        self.rewards: list[float] = []
        self.round, self.next, self.pick, self.done = 0, 0, None, False
        return self._hand()

    def _solver(self, i: int) -> Prompt:
        return Prompt("solver", list(self.chats[i]), key=("solver", self.round, i))

    def _hand(self):
        """The solvers still to speak this round: all at once, or the next one; then the judge."""
        if self.round < self.rounds:
            return [self._solver(i) for i in range(self.n)] if self.parallel else self._solver(self.next)
        shown = "\n\n".join(f"Candidate {i + 1}:\n{s[-1].strip()}" for i, s in enumerate(self.said))
        return Prompt("judge", [{"role": "system", "content": JUDGE},
                                {"role": "user", "content": f"Problem: {self.problem}\n\n{shown}\n\nWhich candidate "
                                                            "is right? End with 'Answer: <number>'."}], key=("judge",))

    def step(self, reply):
        if self.done:
            raise RuntimeError("step() after the episode ended")
        if self.round == self.rounds:  # the judge
            self.pick = parse_pick(reply, self.n)
            self.rewards.append(self._right(self.pick))
            self.done = True
            return None
        replies = list(reply) if isinstance(reply, (list, tuple)) else [reply]
        for text in replies:
            text = text if isinstance(text, str) else ""
            i = self.next
            self.said[i].append(text)
            self.chats[i].append({"role": "assistant", "content": text})  # verbatim: the next round extends it
            self.rewards.append(float(math_reward(text, self.answer) == 1.0))
            self.next += 1
        if self.next < self.n:
            return self._hand()
        self.round, self.next = self.round + 1, 0
        if self.round < self.rounds:  # a debate round: each solver reads the others' latest answers
            for i in range(self.n):
                others = "\n\n".join(f"Solver {j + 1}:\n{s[-1].strip()}" for j, s in enumerate(self.said) if j != i)
                self.chats[i].append({"role": "user", "content": f"The other solvers answered:\n\n{others}\n\n"
                                      "Check their answers against yours and write your final solution, ending "
                                      "with \\boxed{answer}."})
        return self._hand()

    def _right(self, i: int | None) -> float:
        return float(i is not None and math_reward(self.said[i][-1], self.answer) == 1.0)

    def final_answer(self) -> str | None:
        """The picked candidate's answer (eval.py's majority vote)."""
        return None if self.pick is None else extract_answer(self.said[self.pick][-1])

    def scripted_replies(self, task: dict) -> list[str]:
        """A perfect team: every solver writes the right solution in every round, the judge picks the first."""
        sol = solution_text(task["question"], str(task["answer"]))
        return [sol] * (self.n * self.rounds) + ["Candidate 1 is right.\nAnswer: 1"]

    def turn_rewards(self) -> list[float]:
        return list(self.rewards)

    def metrics(self) -> dict:
        finals = [s[-1] if s else "" for s in self.said]
        answers = [extract_answer(t) for t in finals]
        known = [a for a in answers if a is not None]
        top = Counter(known).most_common(1)[0][0] if known else None  # ties: the earliest (Counter keeps order)
        return {"team_reward": self._right(self.pick), "pick_correct": self._right(self.pick),
                "any_correct": float(any(self._right(i) for i in range(self.n) if self.said[i])),
                "majority_correct": float(top is not None and math_reward(f"\\boxed{{{top}}}", self.answer) == 1.0),
                "candidates_agree": float(len(known) == self.n and len(set(known)) == 1),
                "no_pick": float(self.pick is None)}


def check_config(cfg, grouped: tuple) -> tuple[str, str] | None:
    """rounds > 1 and the trainer (workflows.check_roles): a solver's rounds in one chat are paid apart (each
    round's answer): no merged sequence, which would train the first answer on the revision's reward."""
    rounds = cfg.data.env_kwargs.get("rounds", 1)
    if isinstance(rounds, int) and rounds > 1 and cfg.rollout.merge_turns:
        return ("rollout.merge_turns", f"rounds={rounds}: each solver's answers in one chat are paid apart; merging "
                "would train the first answer on the revision's reward (algo.pack_turns still packs them)")
    return None


CONSOLE = ("any_correct", "majority_correct")
