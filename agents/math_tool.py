"""Prompts for the math-tool team: analyzer (plans), executor (writes Python), verifier (answers).

Three ways to show a role the episode (MathToolEnv's `layout`):
    transcript_messages  "transcript" (default): ONE team conversation (agents.team_transcript): a team
                         system prompt, then per turn a user message (what is new + whose turn and what to
                         write) and the reply as an assistant message. Every turn extends the last one
                         (the engine's prefix cache prefills only the new text; the update packs a role's
                         turns in one row); with every role on ONE adapter the whole episode is one row.
    role_messages        "per_role": each role its own growing chat (agents.role_conversation): its system
                         prompt, what the others said since its last turn as a user message, its replies
                         as its own. Shorter prompts than a transcript; each role's later cycle extends its
                         earlier one, which is what per-role adapters can reuse.
    build_messages       "message": each role its own system prompt and the history folded into one user
                         message (the layout before transcripts): no turn extends another.
"""
from __future__ import annotations

from agents import role_conversation, team_transcript

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

TEAM_SYSTEM = "You are a math team of an analyzer, an executor and a verifier, taking turns. Each message says whose turn it is."
ASK = {"analyzer": "Analyzer: write a short numbered plan of the computation; do not compute the final answer.",
       "executor": "Executor: reply with one ```python block that computes the answer and prints it.",
       "verifier": "Verifier: if the printed result answers the problem, reply with it as \\boxed{answer}; if it is "
                   "wrong or missing, explain why and end with 'Verdict: Incorrect'."}


def build_messages(role: str, problem: str, history: list[tuple[str, str]]) -> list[dict]:
    parts = [f"Problem: {problem}"] + [f"{LABEL.get(w, w)}:\n{t.strip()}" for w, t in history] + [TASK[role]]
    return [{"role": "system", "content": SYSTEM[role]}, {"role": "user", "content": "\n\n".join(parts)}]


def transcript_messages(role: str, problem: str, history: list[tuple[str, str]]) -> list[dict]:
    """The team conversation up to `role`'s turn (agents.team_transcript); history's "output" entries are
    the sandbox's, the others the roles' replies, verbatim."""
    return team_transcript(TEAM_SYSTEM, f"Problem: {problem}", history, ASK, LABEL, role)


def role_messages(role: str, problem: str, history: list[tuple[str, str]]) -> list[dict]:
    """`role`'s own conversation up to its turn (agents.role_conversation)."""
    return role_conversation(SYSTEM[role], f"Problem: {problem}", history, TASK[role], LABEL, role)


LAYOUTS = {"transcript": transcript_messages, "per_role": role_messages, "message": build_messages}
