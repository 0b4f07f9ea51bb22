"""The code team: generator -> test runner (the env, in the sandbox) -> refiner, up to N cycles.

    generator  writes the function (HumanEval prompt: signature + docstring)
    tests      the env runs the task's tests on it in envs/sandbox.py; all pass -> the episode ends,
               else a summary of the failures (at most 3 asserts) is appended to the history
    refiner    rewrites the function from the failures; tests run again ... until all pass or
               max_refinement_iterations refinements were made
Rewards: each generator / refiner turn gets the fraction of tests its code passes (0 when the
code does not run, with the sandbox's reason in the summary). Team reward = final all-pass.

scripted_replies(task): the perfect team, for sft.py's scripted teacher: the generator writes the
task's canonical_solution (HumanEval's, or data/code_data's synthetic family's) as a complete
function in a ```python block; the tests pass and the episode ends there, so a perfect team's
refiner never speaks (the teacher writes no refiner examples).
"""
from __future__ import annotations

import ast
import re

from agents.code_team import build_messages
from envs import Prompt, need_int, need_number
from rewards.code import extract_code, run_tests

ROLES = ("generator", "refiner")


def complete_code(reply: str, task: dict) -> str:
    code = extract_code(reply)
    if f"def {task['entry_point']}" not in code:  # a body only: put it under the prompt's signature
        code = task["prompt"] + code
    return code


def reference_solution(task: dict) -> str:
    """The task's canonical_solution as complete code: a canonical_solution that defines the entry
    point is used as it is; a body (HumanEval's) goes under the prompt (its imports and helpers kept)
    with the entry point's docstring left out: the reply is the code, not a copy of the task."""
    sol, entry = task.get("canonical_solution"), str(task["entry_point"])
    if not isinstance(sol, str) or not sol.strip():
        raise ValueError(f"scripted_replies: task {task.get('task_id', '?')} has no canonical_solution")
    if re.search(rf"^def {re.escape(entry)}\b", sol, re.MULTILINE):
        return sol
    prompt = str(task["prompt"])
    short = _without_docstring(prompt, entry)
    if short != prompt:
        try:
            ast.parse(short + sol)
        except (SyntaxError, ValueError):
            short = prompt
    return short + sol


def _without_docstring(prompt: str, entry: str) -> str:
    """The prompt without the lines of the entry point's docstring (unchanged when they hold anything
    else, or the prompt does not parse)."""
    try:
        tree = ast.parse(prompt)
    except (SyntaxError, ValueError, RecursionError):
        return prompt
    fn = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry),
              None)
    doc = fn.body[0] if fn is not None and fn.body else None
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
        return prompt
    lines = prompt.split("\n")
    first, last = doc.lineno - 1, doc.end_lineno - 1  # offsets count UTF-8 bytes
    if lines[first].encode()[:doc.col_offset].strip() or lines[last].encode()[doc.end_col_offset:].strip():
        return prompt  # the docstring shares a line with other code
    return "\n".join(lines[:first] + lines[last + 1:])


def scripted_replies(task: dict) -> list[str]:
    """The perfect team's replies: the generator's canonical solution, which passes every test, so
    the env asks for no refiner turn."""
    return [f"```python\n{reference_solution(task).lstrip(chr(10)).rstrip()}\n```"]


class CodeTeamEnv:
    roles = ROLES

    def __init__(self, max_refinement_iterations: int = 2, timeout: float = 10.0):
        self.max_refinements = need_int("max_refinement_iterations", max_refinement_iterations, 0, 100)
        self.timeout = need_number("timeout", timeout, 0, 600, lo_open=True)

    def reset(self, task):
        self.task, self.history, self.rewards, self.passed_all, self.refinements = task, [], [], [], 0
        return self._turn("generator")

    def _turn(self, role):
        self.role = role
        return Prompt(role, build_messages(role, self.task["prompt"], self.history))

    def step(self, reply):
        if self.role == "refiner":
            self.refinements += 1
        res = run_tests(complete_code(reply, self.task), self.task, self.timeout)
        self.rewards.append(res.reward)
        self.passed_all.append(res.all_passed)
        self.history.append((self.role, reply))
        if res.all_passed or self.refinements >= self.max_refinements:
            return None
        summary = f"{res.passed}/{res.total} tests passed ({res.reason})."
        if res.failures:
            summary += "\nFailures:\n" + "\n".join(f"- {f}" for f in res.failures[:3])
        self.history.append(("tests", summary))
        return self._turn("refiner")

    def turn_rewards(self):
        return list(self.rewards)

    def metrics(self):
        final = float(bool(self.passed_all) and self.passed_all[-1])
        return {"generator_success": float(bool(self.passed_all) and self.passed_all[0]), "final_success": final,
                "team_reward": final, "refiner_attempts": self.refinements,
                "refiner_fixed": float(self.refinements > 0 and final == 1.0),
                "final_pass_frac": self.rewards[-1] if self.rewards else 0.0, "iterations": len(self.rewards)}


def aggregate(episodes) -> dict:
    ms = [e.metrics for e in episodes if e.metrics]
    n = max(1, len(ms))
    tried = [m for m in ms if m["refiner_attempts"] > 0]
    out = {"generator_success": sum(m["generator_success"] for m in ms) / n,
           "final_success": sum(m["final_success"] for m in ms) / n,
           "final_pass_frac": sum(m["final_pass_frac"] for m in ms) / n,
           "refiner_attempts": sum(m["refiner_attempts"] for m in ms) / n,
           "refiner_success": sum(m["refiner_fixed"] for m in tried) / max(1, len(tried)),
           "iterations": sum(m["iterations"] for m in ms) / n}
    for role in ROLES:
        steps = [s for e in episodes for s in getattr(e, "samples", ()) if s.role == role]  # compare.py: metrics only
        if steps:
            out[f"tokens/{role}"] = sum(len(s.completion_ids) for s in steps) / len(steps)
    return out
