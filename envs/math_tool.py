"""The math-tool team: analyzer -> executor (+ sandboxed run) -> verifier, up to N cycles.

    analyzer   plans the computation (sees the problem and everything so far)
    executor   writes a ```python block; the env runs it in runtime/sandbox.py and appends the output
    verifier   answers with \\boxed{x} (the episode ends) or says 'Verdict: Incorrect' (a new cycle,
               back to the analyzer, until max_refinement_iterations cycles); a reply with neither
               counts as Incorrect
Rewards per turn:
    analyzer   `analyzer_reward="team"` (default): the team reward (final answer correct) on each of its
               turns; "plan": 1 if the last computation its plan writes out (`16 + 17 - 12`, found by
               `plan_expression`) evaluates to the answer, else 0 -- its own job, whatever the executor
               and verifier then do. The metric `plan_right` (either choice): the share of an episode's
               plans (one a cycle) that are right, averaged over episodes
    executor   1 if its code ran and the last line it printed equals the answer, else 0
    verifier   an answering turn: math_reward of its answer; a rejecting turn: 1 if the output it
               rejected was indeed wrong, else 0

Prompts (`layout`, agents/math_tool.py): "transcript" (default) shows the episode as one team conversation,
so every turn extends the last and, with the roles on one adapter, an episode trains as one row; "per_role"
gives each role its own growing chat (what the others said arrives as new messages), so each role's later
cycle extends its earlier one on per-role adapters too, with shorter prompts; "message": each role's own
system prompt and the history in one message, as before transcripts (no turn extends another).

`scripted_replies(task)` is a perfect team (sft.py's scripted teacher): the analyzer names the
computation, the executor's Python computes and prints it, the verifier boxes the printed number.
It solves the arithmetic of data/math_data.py (`solve_arith`, which envs/react.py's teacher shares)
and returns [] for a question it cannot read.
"""
from __future__ import annotations

import ast
import keyword
import re
from dataclasses import dataclass
from fractions import Fraction

from agents.math_team import parse_verdict
from agents.math_tool import LAYOUTS
from envs import MIN_TIMEOUT, Prompt, judge_counts, judge_rates, need_choice, need_int, need_number
from runtime.tools import calculate, run_code_ok
from rewards.code import extract_code
from rewards.math import extract_answer, is_equiv, math_reward

ROLES = ("analyzer", "executor", "verifier")


class MathToolEnv:
    roles = ROLES

    def __init__(self, max_refinement_iterations: int = 2, code_timeout: float = 5.0, layout: str = "transcript",
                 analyzer_reward: str = "team"):
        self.max_cycles = need_int("max_refinement_iterations", max_refinement_iterations, 0, 100)
        self.analyzer_reward = need_choice("analyzer_reward", analyzer_reward, ("team", "plan"))
        self.timeout = need_number("code_timeout", code_timeout, MIN_TIMEOUT, 600)
        self.build = LAYOUTS[need_choice("layout", layout, tuple(LAYOUTS))]

    def reset(self, task):
        self.problem, self.answer = task["question"], str(task["answer"])
        self.history, self.turns, self.rewards = [], [], []
        self.cycles, self.exec_ok, self.exec_right, self.final = 1, [], [], None
        self.plans_right, self.judged = [], []
        return self._turn("analyzer")

    def _turn(self, role):
        self.role = role
        return Prompt(role, self.build(role, self.problem, self.history))

    def step(self, reply):
        role = self.role
        self.history.append((role, reply))
        self.turns.append(role)
        if role == "analyzer":
            self.plans_right.append(plan_right(reply, self.answer))
            # None: filled with the team reward at the end
            self.rewards.append(float(self.plans_right[-1]) if self.analyzer_reward == "plan" else None)
            return self._turn("executor")
        if role == "executor":
            has_code = "```" in reply or "print" in reply
            out, ok = run_code_ok(extract_code(reply), self.timeout) if has_code else ("(no code)", False)
            self.history.append(("output", out))
            last = out.strip().splitlines()[-1] if ok and out.strip() else ""
            right = ok and is_equiv(last.strip(), self.answer)
            self.exec_ok.append(ok)
            self.exec_right.append(right)
            self.rewards.append(float(right))
            return self._turn("verifier")
        # verifier
        ans, verdict = extract_answer(reply), parse_verdict(reply)
        self.judged.append((ans is not None and verdict is not False, self.exec_right[-1]))  # approved, output right
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
                "exec_right": sum(self.exec_right) / n, "no_answer": float(self.final is None),
                "plan_right": sum(self.plans_right) / max(1, len(self.plans_right)),
                **judge_counts("verifier", self.judged)}


# a computation written out on one line: numbers (or parenthesised ones) joined by + - * / ^, e.g. "16 + 17 - 12",
# "(3 + 4) * 2"; the text is first put in the calculator's spelling (× ÷ − \times \cdot \div, blanks inside
# parentheses). Possessive quantifiers and a start that is no run's middle keep it linear on a reply built to be
# slow; ASCII digits only (calculate reads no others)
_SPELLING = re.compile(r"[×·]|\\times|\\cdot|÷|\\div|−|(?<=\()[ \t]++|[ \t]++(?=\))")
_SPELLED = {"×": "*", "·": "*", "\\times": "*", "\\cdot": "*", "÷": "/", "\\div": "/", "−": "-"}
_NUM = r"\(*+-?[0-9]++(?:\.[0-9]++)?\)*+"
_COMPUTATION = re.compile(rf"(?<![0-9(])(?<![0-9]\.){_NUM}(?:[ \t]*+[-+*/^][ \t]*+{_NUM})++")
_PART = set("0123456789.+-*/^() \t")  # the characters a computation is written with
PLAN_CHARS = 4000  # a plan's last this-many characters are read: a computation the cut splits is not read


def plan_expression(plan: str) -> str | None:
    """The last computation a plan writes out on one line ("2. Add the 17 bought and subtract the 12 given
    away: 16 + 17 - 12." -> "16 + 17 - 12"), in the calculator's syntax, or None when it writes none (a bare
    number is not a computation). Parentheses that do not pair inside it are dropped from its ends
    ("(i.e. 30 + 17 - 6)" -> "30 + 17 - 6")."""
    text = str(plan)
    tail = _SPELLING.sub(lambda m: _SPELLED.get(m.group(), ""), text[-PLAN_CHARS:])
    # cut inside a computation: what comes before the tail's first other character may be the rest of one
    whole = 0 if len(text) <= PLAN_CHARS else next((i for i, c in enumerate(tail) if c not in _PART), len(tail))
    found = [m for m in _COMPUTATION.finditer(tail) if m.start() >= whole]
    if not found:
        return None
    expr = " ".join(found[-1].group().split())
    while expr.count("(") > expr.count(")") and expr.startswith("("):
        expr = expr[1:]
    while expr.count(")") > expr.count("(") and expr.endswith(")"):
        expr = expr[:-1]
    return expr


def plan_right(plan: str, answer: str) -> bool:
    """Whether the plan's last written-out computation evaluates (the calculator's safe evaluator) to the
    answer. It checks the value, not where the numbers came from: a plan that states the answer outright
    (`41 + 0`) is paid too -- it hands the executor a right computation, which is the analyzer's job."""
    expr = plan_expression(plan)
    if expr is None:
        return False
    value = calculate(expr)
    if value.startswith("error"):
        return False
    try:
        Fraction(str(answer).strip())
    except (ValueError, ZeroDivisionError):
        return is_equiv(value, answer)  # a symbolic answer: math-verify decides
    return _same_number(value, answer)


def aggregate(episodes) -> dict:
    ms = [e.metrics for e in episodes if e.metrics and "exec_ok" in e.metrics]  # not an env error's
    n = max(1, len(ms))
    out = {k: sum(m[k] for m in ms) / n for k in ("final_correct", "cycles", "exec_ok", "exec_right", "no_answer",
                                                   "plan_right")}
    out["final_acc"] = out.pop("final_correct")
    out.update(judge_rates("verifier", {k: sum(m.get(k, 0.0) for m in ms) for k in ms[0] if k.startswith("verifier_")}
                           if ms else {}))
    for role in ROLES:
        steps = [s for e in episodes for s in getattr(e, "samples", ()) if s.role == role]  # compare.py: metrics only
        if steps:
            out[f"tokens/{role}"] = sum(len(s.completion_ids) for s in steps) / len(steps)
    return out


# --------------------------------------------------------------------------------------------
# the scripted teacher: the arithmetic of data/math_data.py, solved the way a teacher writes it out

_WHAT_IS = re.compile(r"What is ([0-9 +\-*/().]{1,200})\?")
_GETS = re.compile(r"([A-Z][a-z]{0,30}) has (\d{1,9}) ([a-z]{1,30}) and gets (\d{1,9}) more\. "
                   r"How many \3 does \1 have now\?")
_BUYS_GIVES = re.compile(r"([A-Z][a-z]{0,30}) has (\d{1,9}) ([a-z]{1,30}), buys (\d{1,9}) more, then gives "
                         r"(\d{1,9}) away\. How many \3 does \1 have left\?")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


@dataclass
class ArithSolution:
    """How a teacher solves one arithmetic question: the computation and its parts in words."""
    expression: str   # the computation, e.g. "16 + 9 * 9" (Python and calculator syntax)
    value: str        # what it evaluates to (runtime.tools.calculate: what the calculator shows)
    reason: str       # a short thought before computing: what the question gives, or the computation
    plan: list[str]   # the analyzer's numbered plan, one step a line
    code: str         # Python that computes it and prints it
    given: str = ""   # a word problem's facts in one sentence ("" for a bare expression)

    def worked(self) -> str:
        """The computation done by hand, one operation at a time: '9 * 9 = 81, then 16 + 81 = 97'."""
        steps = []

        def walk(node) -> str:
            if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
                left, right = walk(node.left), walk(node.right)
                text = f"{left} {_OPS[type(node.op)]} {right}"
                steps.append(f"{text} = {calculate(text)}")
                return calculate(text)
            return calculate(ast.unparse(node))
        walk(ast.parse(self.expression, mode="eval").body)
        return ", then ".join(steps) or f"{self.expression} = {self.value}"


def _same_number(a: str, b: str) -> bool:
    try:
        return Fraction(a.strip()) == Fraction(b.strip())
    except (ValueError, ZeroDivisionError):
        return a.strip() == b.strip()


def solve_arith(question, answer=None) -> ArithSolution | None:
    """The teacher's solution of a data/math_data.py question ("What is 16 + 9 * 9?", the one- and
    two-step word problems), or None when the question is of another kind, or when `answer` is given
    and the computation does not give it (the teacher then has nothing right to show)."""
    q = " ".join(str(question).split())
    if m := _WHAT_IS.fullmatch(q):
        expr = " ".join(m.group(1).split())
        mixed = any(o in expr for o in "*/") and any(o in expr.lstrip("-") for o in "+-")
        plan = [f"Compute {expr}" + (", doing * and / before + and -." if mixed else "."), "Print the result."]
        sol = ArithSolution(expr, "", f"I compute {expr}.", plan, f"print({expr})")
    elif m := _GETS.fullmatch(q) or _BUYS_GIVES.fullmatch(q):
        name, a, item, b, c = (m.groups() + (None,))[:5]
        var = item if item.isidentifier() and not keyword.iskeyword(item) else "total"
        if c is None:
            expr = f"{a} + {b}"
            given = f"{name} has {a} {item} and gets {b} more."
            plan = [f"{name} starts with {a} {item}.", f"Add the {b} more: {expr}.", "Print the total."]
        else:
            expr = f"{a} + {b} - {c}"
            given = f"{name} has {a} {item}, buys {b}, gives {c} away."
            plan = [f"{name} starts with {a} {item}.", f"Add the {b} bought and subtract the {c} given away: {expr}.",
                    "Print what is left."]
        sol = ArithSolution(expr, "", given, plan, f"{var} = {expr}\nprint({var})", given)
    else:
        return None
    sol.value = calculate(sol.expression)
    if sol.value.startswith("error") or (answer is not None and not _same_number(sol.value, str(answer))):
        return None
    return sol


def scripted_replies(task) -> list[str]:
    """A perfect team's replies, in turn order (analyzer, executor, verifier), one cycle: the plan names
    the computation, the executor's ```python block computes and prints it, the verifier boxes the
    number it printed. [] for a task the teacher cannot solve (sft.py's scripted teacher skips it)."""
    sol = solve_arith(task["question"], task["answer"])
    if sol is None:
        return []
    plan = "\n".join(f"{i}. {step}" for i, step in enumerate(sol.plan, 1))
    check = f"The code printed {sol.value}, the number asked for.\n\\boxed{{{sol.value}}}"
    return [plan, f"```python\n{sol.code}\n```", check]
