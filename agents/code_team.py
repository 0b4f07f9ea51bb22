"""Prompts for the code team: generator (writes a solution) and refiner (fixes it from test results)."""
from __future__ import annotations

SYSTEM = {
    "generator": "You write correct Python. Reply with the complete function in one ```python block.",
    "refiner": "You fix Python code. Read the failing tests and reply with the corrected complete function in one "
               "```python block.",
}


def build_messages(role: str, prompt: str, history: list[tuple[str, str]]) -> list[dict]:
    parts = [f"Task:\n```python\n{prompt.rstrip()}\n```"]
    for who, text in history:
        parts.append(("Test results:\n" if who == "tests" else "Solution:\n") + text.strip())
    parts.append("Write the function." if role == "generator" else "Fix the function.")
    return [{"role": "system", "content": SYSTEM[role]}, {"role": "user", "content": "\n\n".join(parts)}]
