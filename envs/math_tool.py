"""The math-tool team: analyzer -> executor (+ sandboxed run) -> verifier, up to N cycles.

    analyzer   plans the computation (sees the problem and everything so far)
    executor   writes a ```python block; the env runs it in envs/sandbox.py and appends the output
    verifier   answers with \\boxed{x} (the episode ends) or says 'Verdict: Incorrect' (a new cycle,
               back to the analyzer, until max_refinement_iterations cycles); a reply with neither
               counts as Incorrect
Rewards per turn:
    analyzer   the team reward (final answer correct) on each of its turns
    executor   1 if its code ran and the last line it printed equals the answer, else 0
    verifier   an answering turn: math_reward of its answer; a rejecting turn: 1 if the output it
               rejected was indeed wrong, else 0
"""
from __future__ import annotations

from agents.math_tool import build_messages
from agents.math_team import parse_verdict
from envs.tools import run_code_ok
from rewards.code import extract_code
from rewards.math import extract_answer, is_equiv, math_reward
from envs import Prompt, need_int, need_number

ROLES = ("analyzer", "executor", "verifier")


class MathToolEnv:
    roles = ROLES

    def __init__(self, max_refinement_iterations: int = 2, code_timeout: float = 5.0):
        self.max_cycles = need_int("max_refinement_iterations", max_refinement_iterations, 0, 100)
        self.timeout = need_number("code_timeout", code_timeout, 0, 600, lo_open=True)

    def reset(self, task):
        self.problem, self.answer = task["question"], str(task["answer"])
        self.history, self.turns, self.rewards = [], [], []
        self.cycles, self.exec_ok, self.exec_right, self.final = 1, [], [], None
        return self._turn("analyzer")

    def _turn(self, role):
        self.role = role
        return Prompt(role, build_messages(role, self.problem, self.history))

    def step(self, reply):
        role = self.role
        self.history.append((role, reply))
        self.turns.append(role)
        if role == "analyzer":
            self.rewards.append(None)  # filled with the team reward at the end
            return self._turn("executor")
        if role == "executor":
            out, ok = run_code_ok(extract_code(reply), self.timeout) if "```" in reply or "print" in reply else ("(no code)", False)
            self.history.append(("output", out))
            last = out.strip().splitlines()[-1] if ok and out.strip() else ""
            right = ok and is_equiv(last.strip(), self.answer)
            self.exec_ok.append(ok)
            self.exec_right.append(right)
            self.rewards.append(float(right))
            return self._turn("verifier")
        # verifier
        ans, verdict = extract_answer(reply), parse_verdict(reply)
        if ans is not None and verdict is not False:
            self.final = ans
            self.rewards.append(math_reward(reply, self.answer))
            return None
        self.rewards.append(float(not self.exec_right[-1]))  # rejecting a wrong result is right
        if self.cycles >= self.max_cycles:
            return None
        self.cycles += 1
        return self._turn("analyzer")

    def turn_rewards(self):
        team = float(self.final is not None and is_equiv(self.final, self.answer))
        return [team if r is None else r for r in self.rewards]

    def metrics(self):
        team = float(self.final is not None and is_equiv(self.final, self.answer))
        n = max(1, len(self.exec_ok))
        return {"final_correct": team, "team_reward": team, "cycles": self.cycles, "exec_ok": sum(self.exec_ok) / n,
                "exec_right": sum(self.exec_right) / n, "no_answer": float(self.final is None)}


def aggregate(episodes) -> dict:
    ms = [e.metrics for e in episodes if e.metrics]
    n = max(1, len(ms))
    out = {k: sum(m[k] for m in ms) / n for k in ("final_correct", "cycles", "exec_ok", "exec_right", "no_answer")}
    out["final_acc"] = out.pop("final_correct")
    for role in ROLES:
        steps = [s for e in episodes for s in e.steps if s.role == role]
        out[f"tokens/{role}"] = sum(len(s.completion_ids) for s in steps) / max(1, len(steps))
    return out
