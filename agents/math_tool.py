"""Prompts for the math-tool team: analyzer (plans), executor (writes Python), verifier (answers)."""
from __future__ import annotations

SYSTEM = {
    "analyzer": "You plan how to solve math problems. Write a short numbered plan of the computation; do not "
                "compute the final answer yourself.",
    "executor": "You turn a plan into Python. Reply with one ```python block that computes the answer and prints it.",
    "verifier": "You check a computation. If the printed result answers the problem, reply with it as "
                "\\boxed{answer}. If it is wrong or missing, explain why and end with 'Verdict: Incorrect'.",
}
LABEL = {"analyzer": "Plan", "executor": "Code", "output": "Execution output", "verifier": "Check"}
TASK = {"analyzer": "Write the plan.", "executor": "Write the Python code.",
        "verifier": "Give the final answer in \\boxed{}, or end with 'Verdict: Incorrect'."}


def build_messages(role: str, problem: str, history: list[tuple[str, str]]) -> list[dict]:
    parts = [f"Problem: {problem}"] + [f"{LABEL.get(w, w)}:\n{t.strip()}" for w, t in history] + [TASK[role]]
    return [{"role": "system", "content": SYSTEM[role]}, {"role": "user", "content": "\n\n".join(parts)}]
