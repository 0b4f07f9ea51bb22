"""Prompts and reply parsing for the math roles (the 3-agent team and the single-agent baseline).

A role turns the shared history into chat messages: a system prompt of its own and one user
message holding the problem and everything said so far (one user message keeps every chat
template happy, including those that forbid two assistant turns in a row). Replies are read
tolerantly: `parse_verdict` accepts "Verdict: Correct", "**INCORRECT**", "The solution is not
correct.", ...; answers are read by rewards.math.extract_answer.
"""
from __future__ import annotations

import re

EXAMPLE = "for example: 2 + 3 = 5, so the answer is \\boxed{5}."
SYSTEM = {  # a one-line worked example: small models copy the format, large ones lose nothing
    "solver": f"You are a careful math solver. Solve the problem in short steps and end with the final answer in "
              f"\\boxed{{}}, {EXAMPLE}",
    "generator_initial": f"You are a careful math solver. Solve the problem in short steps and end with the final "
                         f"answer in \\boxed{{}}, {EXAMPLE}",
    "evaluator_critique": "You check math solutions. Say briefly whether the solution is right, then end with exactly "
                          "one line: 'Verdict: Correct' or 'Verdict: Incorrect'.",
    "generator_refinement": f"You fix math solutions. Use the critique, correct the mistakes in short steps and end "
                            f"with the final answer in \\boxed{{}}, {EXAMPLE}",
    "evaluator_check": "You check math solutions. First check the answer yourself in one line: the last digit and the "
                       "number of digits of the result, and your own result, e.g. 'Check: ends in 8, 3 digits. I get "
                       "\\boxed{128}.' Then say whether the solution's answer is the same, and end with exactly one "
                       "line: 'Verdict: Correct' or 'Verdict: Incorrect'.",
    "evaluator_blind": "You check math solutions. Before you see the solution, work out the answer yourself in one "
                       "line: the last digit and the number of digits of the result, and your own result, e.g. "
                       "'Check: ends in 8, 3 digits. I get \\boxed{128}.' Then you are shown the solution: say "
                       "whether its answer is the same as yours, and end with exactly one line: 'Verdict: Correct' "
                       "or 'Verdict: Incorrect'.",
    "solver_revision": f"You are a careful math solver checking your own solution. If it is wrong, correct it in short "
                       f"steps; if it is right, keep it. End with the final answer in \\boxed{{}}, {EXAMPLE}",
}
LABEL = {"generator_initial": "Solution", "generator_refinement": "Refined solution",
         "evaluator_critique": "Critique", "solver": "Your solution"}
TASK = {
    "solver": "Solve the problem. End with \\boxed{answer}.",
    "generator_initial": "Solve the problem. End with \\boxed{answer}.",
    "evaluator_critique": "Is the latest solution correct? Critique it and end with 'Verdict: Correct' or "
                          "'Verdict: Incorrect'.",
    "generator_refinement": "The latest solution was judged incorrect. Write a corrected solution ending with "
                            "\\boxed{answer}.",
    "evaluator_check": "Is the latest solution correct? Write your check line first, then compare, and end with "
                       "'Verdict: Correct' or 'Verdict: Incorrect'.",
    "evaluator_blind": "Before you see the solution, write your check line.",
    "solver_revision": "Check your solution. Write the final solution (corrected if it was wrong) ending with "
                       "\\boxed{answer}.",
}


def build_messages(role: str, problem: str, history: list[tuple[str, str]]) -> list[dict]:
    """Chat messages for `role` (a key of SYSTEM: a role, or a prompt style such as evaluator_check),
    who sees the problem and every (role, text) said so far."""
    if role not in SYSTEM:
        raise KeyError(f"no prompt for role {role!r}; known: {sorted(SYSTEM)}")
    parts = [f"Problem: {problem}", *_said(history), TASK[role]]
    return [{"role": "system", "content": SYSTEM[role]}, {"role": "user", "content": "\n\n".join(parts)}]


def _said(history: list[tuple[str, str]]) -> list[str]:
    """Each (role, text) said so far as a labelled paragraph ("Solution:\n...")."""
    return [f"{LABEL.get(who, who)}:\n{text.strip()}" for who, text in history]


BLIND_VERDICT = ("Is the latest solution's answer the same as yours? Compare, and end with 'Verdict: Correct' or "
                 "'Verdict: Incorrect'.")


def blind_messages(problem: str, check: str | None, history: list[tuple[str, str]]) -> list[dict]:
    """The evaluator_blind judge's conversation: it writes its check seeing the problem only (check=None:
    the prompt of that first turn), then, with its check said, it is shown what the team said (`history`)
    and gives the verdict. A judge that reads the solution before checking copies its answer: at step 0
    of arm (e), 94% of the evaluator_check judge's own results were the solution's answer (of the first
    solutions that gave one), 99% at step 24."""
    msgs = build_messages("evaluator_blind", problem, [])
    if check is None:
        return msgs
    parts = [*_said(history), BLIND_VERDICT]
    return msgs + [{"role": "assistant", "content": check.strip()}, {"role": "user", "content": "\n\n".join(parts)}]


def check_line(truth: str) -> str:
    """The evaluator_check prompt's check, written from the true answer (sft.py's teacher): the cheap
    necessary checks a small judge can learn (T1: small models check no better than they compute, so
    the last digit and the size come first), then the full result, e.g. 'Check: ends in 8, 3 digits.
    I get \\boxed{128}.'; a non-integer truth gets the result only."""
    t = " ".join(str(truth).split())[:60]
    if re.fullmatch(r"-?\d{1,30}", t):
        n = len(t.lstrip("-"))
        return f"Check: ends in {t[-1]}, {n} digit{'s' * (n > 1)}. I get \\boxed{{{t}}}."
    return f"Check: I get \\boxed{{{t}}}."


_NEG = r"(incorrect|not\s+correct|wrong|false|invalid|no)"
_POS = r"(correct|right|true|valid|yes)"
# Every quantifier next to another one that can match the same characters is possessive (`*+`,
# `++`): "verdict" + 30k spaces took minutes with plain `\s*` (cubic backtracking); now linear.
_VERDICT_LINE = re.compile(rf"verdict\s*+(?:is)?\s*+[:\-=]?\s*+(?:the\s++solution\s++is\s++)?(?:{_NEG}|{_POS})\b")
_VERDICT_WORD = re.compile(r"\b(incorrect|not\s+correct|wrong|correct)\b")
_MARKUP = re.compile(r"[*_`#>\[\]()]")


def parse_verdict(text: str) -> bool | None:
    """True (Correct), False (Incorrect) or None (no verdict found). Never raises; linear time.

    The last explicit 'verdict' line wins; failing that, the last verdict word in the reply.
    """
    if not isinstance(text, str):
        return None
    t = _MARKUP.sub(" ", text.lower())
    last = None
    for last in _VERDICT_LINE.finditer(t):
        pass
    if last is not None:
        return last.group(1) is None
    for last in _VERDICT_WORD.finditer(t):
        pass
    if last is not None:
        return last.group(1) == "correct"
    return None
