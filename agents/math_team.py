"""Prompts and reply parsing for the math roles (the 3-agent team and the single-agent baseline).

A role turns the shared history into chat messages: a system prompt of its own and one user
message holding the problem and everything said so far (build_messages: one user message keeps every
chat template happy, including those that forbid two assistant turns in a row), or, in the per-role
layout (role_messages), its own growing chat in which its earlier replies stay its own messages. Replies are read
tolerantly: `parse_verdict` accepts "Verdict: Correct", "**INCORRECT**", "The solution is not
correct.", ...; answers are read by rewards.math.extract_answer.
"""
from __future__ import annotations

import re

from agents import role_conversation

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
    "evaluator_digit": "You check math solutions. Before you see the solution, work out only the sign and the last "
                       "digit of the answer from the last digits of the numbers, e.g. for 53 + 75: 'Check: 3 + 5 = 8, "
                       "so the answer ends in 8.' Then you are shown the solution: an answer that does not end in "
                       "your digit, or has the wrong sign, is wrong. End with exactly one line: 'Verdict: Correct' "
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
    "evaluator_digit": "Before you see the solution, write your check line: the sign and the last digit only.",
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


def role_messages(prompt: str, role: str, problem: str, history: list[tuple[str, str]]) -> list[dict]:
    """The per-role layout: `role`'s own growing chat (agents.role_conversation) with the system prompt and
    task of `prompt` (a key of SYSTEM: the role, or its prompt style such as evaluator_check): its earlier
    replies stay verbatim as its own messages, what the others said since arrives as a new user message."""
    if prompt not in SYSTEM:
        raise KeyError(f"no prompt for role {prompt!r}; known: {sorted(SYSTEM)}")
    return role_conversation(SYSTEM[prompt], f"Problem: {problem}", history, TASK[prompt], LABEL, role)


def _said(history: list[tuple[str, str]]) -> list[str]:
    """Each (role, text) said so far as a labelled paragraph ("Solution:\n...")."""
    return [f"{LABEL.get(who, who)}:\n{text.strip()}" for who, text in history]


BLIND_VERDICT = {
    "evaluator_blind": "Is the latest solution's answer the same as yours? Compare, and end with 'Verdict: Correct' "
                       "or 'Verdict: Incorrect'.",
    "evaluator_digit": "Does the latest solution's answer have your sign and end in your digit? Compare, and end "
                       "with 'Verdict: Correct' or 'Verdict: Incorrect'.",
}


def blind_messages(problem: str, check: str | None, history: list[tuple[str, str]],
                   style: str = "evaluator_blind") -> list[dict]:
    """The blind judge's conversation (style evaluator_blind: its own full result; evaluator_digit: the
    sign and last digit only): it writes its check seeing the problem only (check=None: the prompt of that
    first turn), then, with its check said, it is shown what the team said (`history`) and gives the
    verdict. Checking blind keeps the check its own: a judge that reads the solution before checking copies
    its answer (docs/experiments.md, arm (e))."""
    msgs = build_messages(style, problem, [])
    if check is None:
        return msgs
    parts = [*_said(history), BLIND_VERDICT[style]]
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


OPERATION = re.compile(r"(-?\d{1,6})\s*([-+*x×])\s*(-?\d{1,6})")
_CLAIM = re.compile(r"answer (?:is (negative|positive),? and )?ends in (\d)\b")


def whole(text: str | None) -> str | None:
    """An answer as a whole number ("1,237" -> "1237", "57." and "57.0" -> "57", " -4 " -> "-4"), else None."""
    if not isinstance(text, str):
        return None
    t = "".join(text.split()).replace(",", "")
    t = t[:-2] if t.endswith(".0") else t[:-1] if t.endswith(".") else t
    return t if re.fullmatch(r"-?\d{1,30}", t) else None


def answer_number(answer: str | None) -> str | None:
    """The whole number an answer stands for, read as math_reward reads it (normalised: LaTeX and $ dropped,
    "-47.00" and "(-47)" -> "-47"), after the right side of its last "=" ("91 + 57 = 148" -> "148") and a
    Unicode minus; None when it is none."""
    if not isinstance(answer, str):
        return None
    from rewards.math import answer_key
    return whole(answer_key(answer.rsplit("=", 1)[-1].replace("\u2212", "-")).strip("()"))


def digit_verdict(said: str | None, number: str | None, claim: tuple[bool, str]) -> tuple[bool, str]:
    """The evaluator_digit verdict: an answer (`said`, as extracted; `number`, the whole number it stands for,
    None when it is not one) against a check's claim (negative, last digit), and the words of that verdict
    turn, e.g. (False, "The solution says 120: it ends in 0, not 8.\nVerdict: Incorrect"): what sft.py's
    teacher teaches the judge (with the truth's claim) and what the env writes under verdict_from_check."""
    neg, digit = claim
    said = None if said is None else " ".join(said.split())[:60]
    if not said:  # none, or an empty \boxed{}
        return False, "The solution gives no final answer.\nVerdict: Incorrect"
    if number is None:
        return False, f"The solution says {said}: not a whole number.\nVerdict: Incorrect"
    if number.startswith("-") != neg:
        return False, f"The solution says {said}: it should be {'negative' if neg else 'positive'}.\nVerdict: Incorrect"
    if number[-1] != digit:
        return False, f"The solution says {said}: it ends in {number[-1]}, not {digit}.\nVerdict: Incorrect"
    return True, f"The solution says {said}: {'negative, ' * neg}it ends in {digit}.\nVerdict: Correct"


def operation(problem: str) -> tuple[str, str, str, int] | None:
    """The problem's first "a op b" (OPERATION) as written, and its value: ("53", "+", "75", 128); None when
    it has none."""
    m = OPERATION.search(problem)
    if m is None:
        return None
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return m.group(1), op, m.group(3), a + b if op == "+" else a - b if op == "-" else a * b


def digit_check_line(problem: str, truth: str) -> str:
    """The evaluator_digit judge's check, written from the problem (sft_teachers.math_teacher): the last
    digit worked from the operands' last digits, and the sign, a necessary condition cheaper than the
    result (T1: a small judge checks no better than it computes, and one digit is what it can compute),
    e.g. for 53 + 75 'Check: 3 + 5 = 8, so the answer ends in 8.'; for 41 - 88 'Check: 41 is less than 88,
    so the answer is negative: 88 - 41, 8 - 1 = 7, so the answer is negative and ends in 7.' A problem of
    another shape (not one operation on two non-negative numbers) gets the claim only, from the truth; a
    truth that is not a whole number, no claim (the env pays that check 0)."""
    t = whole(str(truth))
    if t is None:
        return "Check: the answer is not a whole number."
    claim = f"the answer {'is negative and ' * t.startswith('-')}ends in {t[-1]}."
    o = operation(problem)
    if o is None or o[0].startswith("-") or o[2].startswith("-") or str(o[3]) != t:  # not one operation on two
        return f"Check: {claim}"                                                     # non-negatives: claim only
    a, op, b = int(o[0]), o[1], int(o[2])
    if op == "+":
        return f"Check: {a % 10} + {b % 10} = {a % 10 + b % 10}, so {claim}"
    if op in "*x×":
        return f"Check: {a % 10} * {b % 10} = {(a % 10) * (b % 10)}, so {claim}"
    pre = ""
    if a < b:  # a - b = -(b - a)
        pre, a, b = f"{a} is less than {b}, so the answer is negative: {b} - {a}, ", b, a
    x, y = a % 10, b % 10
    step = f"{x} - {y} = {x - y}" if x >= y else f"{x + 10} - {y} = {x + 10 - y}"
    return f"Check: {pre}{step}, so {claim}"


def solution_text(problem: str, truth: str, said: str | None = None) -> str:
    """A solution in the words the generator uses after RL ("53 + 75 = 120, so the answer is \\boxed{120}."):
    the problem's one operation (OPERATION's reading of it, written only when it gives `truth`) =
    `said` (default: the truth); the answer alone for another shape."""
    said = truth if said is None else said
    o = operation(problem)
    lhs = f"{o[0]} {o[1]} {o[2]} = " if o and str(o[3]) == whole(truth) else ""
    return f"{lhs}{said}, so the answer is \\boxed{{{said}}}."


def digit_claim(text: str) -> tuple[bool, str] | None:
    """(negative, last digit) claimed by an evaluator_digit check ("... answer is negative and ends in 7"),
    the last claim in the text; None when it makes none. Linear time."""
    last = None
    for last in _CLAIM.finditer(text.lower() if isinstance(text, str) else ""):
        pass
    return None if last is None else (last.group(1) == "negative", last.group(2))


def _sign_digit(number: str | None) -> tuple[bool, str] | None:
    """(negative, last digit) of a whole number (whole()), else None: what the digit check compares."""
    n = whole(number)
    return None if n is None else (n.startswith("-"), n[-1])


def digit_check_right(text: str, truth: str) -> bool | None:
    """Whether an evaluator_digit check claims the truth's sign and last digit; None when the truth is not
    a whole number (no digit to check)."""
    t = _sign_digit(str(truth))
    return None if t is None else digit_claim(text) == t


def digit_consistent(answer: str | None, truth: str) -> bool:
    """Whether an answer passes the evaluator_digit check of a whole-number `truth`: a whole number with
    the truth's sign and last digit."""
    a = _sign_digit(answer)
    return a is not None and a == _sign_digit(str(truth))


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
