"""The code team: generator -> test runner (the env, in the sandbox) -> refiner, up to N cycles.

    generator  writes the function (HumanEval prompt: signature + docstring)
    tests      the env runs the task's tests on it in runtime/sandbox.py; all pass -> the episode ends,
               else a summary of the failures (at most 3 asserts) is appended to the history
    refiner    rewrites the function from the failures; tests run again ... until all pass or
               max_refinement_iterations refinements were made
Rewards: each generator / refiner turn gets the fraction of tests its code passes (0 when the
code does not run, with the sandbox's reason in the summary). Team reward = final all-pass.

scripted_replies(task): the perfect team, for sft.py's scripted teacher: the generator writes the
task's canonical_solution (HumanEval's, or data/code_data's synthetic family's) as a complete
function in a ```python block; the tests pass and the episode ends there, so a perfect team's
refiner never speaks. scripted_repair(task): the refiner's lesson: a failing first solution (never
taught) and the refiner's fix from the test results (the reference). The env's repair_mistake picks the
mistake: "near_miss" (default) the reference with one comparison, operator, built-in or constant changed;
"approach" another synthetic family's function on the same signature (data.code_data.wrong_approaches: a
filter where a slice was asked for; a near miss for a task of no family, e.g. HumanEval's). The code
recipe's SFT'd refiner, taught on near misses, copied the failing code in 54 of 62 val turns: its lesson
differed from its answer in one token; the generator's real mistakes are wrong approaches.
"""
from __future__ import annotations

import ast
import random
import re

from agents.code_team import build_messages
from data.code_data import wrong_approaches
from envs import MIN_TIMEOUT, Prompt, need_int, need_number
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
    return [_block(_reference_code(task))]


def _reference_code(task: dict) -> str:
    """The reference as the scripted replies write it: no leading blank lines, no trailing space."""
    return reference_solution(task).lstrip("\n").rstrip()


def _block(code: str) -> str:
    return f"```python\n{code}\n```"


_SWAP = {ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
         ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add,
         ast.FloorDiv: ast.Mod, ast.Mod: ast.FloorDiv}
_SYMBOL = {ast.Gt: ">", ast.GtE: ">=", ast.Lt: "<", ast.LtE: "<=", ast.Eq: "==", ast.NotEq: "!=", ast.In: " in ",
           ast.NotIn: " not in ", ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}
_BUILTIN_SWAP = {"max": "min", "min": "max", "sum": "max", "any": "all", "all": "any", "sorted": "list", "abs": "int"}
_METHOD_SWAP = {"upper": "lower", "lower": "upper", "startswith": "endswith", "endswith": "startswith",
                "isdigit": "isalpha", "isalpha": "isdigit"}


def _mutants(code: str, entry: str) -> list[str]:
    """Every one-site change of the entry point's body, as code: a comparison or arithmetic operator
    swapped, an int constant + 1, a built-in or a str method swapped for its neighbour, a string
    constant's last character changed, a returned len(...) less one. Only that expression's text is
    rewritten (comments, blank lines and the rest of the layout stay the reference's), and each mutant
    is checked to parse to exactly the mutated tree; [] when the code does not parse or has no site."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError):
        return []
    fn = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry), None)
    if fn is None:
        return []
    first = fn.body[0] if fn.body else None
    doc = first.value if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else None
    sites = []  # (the expression whose text is rewritten, holder, key, new value)
    for node in (n for stmt in fn.body for n in ast.walk(stmt)):
        if isinstance(node, ast.Compare):
            sites += [(node, node.ops, i, _SWAP[type(op)]()) for i, op in enumerate(node.ops) if type(op) in _SWAP]
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _SWAP:
            sites.append((node, node.__dict__, "op", _SWAP[type(node.op)]()))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sites.append((node, node.__dict__, "value", node.value + 1))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value and node is not doc:
            sites.append((node, node.__dict__, "value", node.value[:-1] + ("b" if node.value[-1] == "a" else "a")))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BUILTIN_SWAP:
            sites.append((node.func, node.func.__dict__, "id", _BUILTIN_SWAP[node.func.id]))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _METHOD_SWAP:
            sites.append((node.func, node.func.__dict__, "attr", _METHOD_SWAP[node.func.attr]))
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", None) == "len":
            sites.append((node.value, node.__dict__, "value", ast.BinOp(node.value, ast.Sub(), ast.Constant(1))))
    lines = code.encode().split(b"\n")  # AST offsets count UTF-8 bytes

    def splice(a, b, text: str) -> str:  # the code with the text from position a to position b replaced
        head, tail = lines[a[0] - 1][:a[1]], lines[b[0] - 1][b[1]:]
        return b"\n".join(lines[:a[0] - 1] + [head + text.encode() + tail] + lines[b[0]:]).decode()

    out = []
    for span, holder, key, new in sites:
        old, holder[key] = holder[key], new
        after = new if isinstance(new, ast.expr) else span  # what now stands where span stood
        want, edits = ast.dump(tree), []
        if type(old) in _SYMBOL:  # an operator: rewrite its token between the operands, nothing else
            if isinstance(span, ast.Compare):
                left, right = (span.comparators[key - 1] if key else span.left), span.comparators[key]
            elif isinstance(span, ast.BinOp):
                left, right = span.left, span.right
            else:  # AugAssign
                left, right = span.target, span.value
            a, b = (left.end_lineno, left.end_col_offset), (right.lineno, right.col_offset)
            eq = "=" if isinstance(span, ast.AugAssign) else ""
            gap = lines[a[0] - 1][a[1]:b[1]].decode() if a[0] == b[0] else ""
            if gap.count(_SYMBOL[type(old)] + eq) == 1:
                edits.append((a, b, gap.replace(_SYMBOL[type(old)] + eq, _SYMBOL[type(new)] + eq)))
        whole = ((span.lineno, span.col_offset), (span.end_lineno, span.end_col_offset))
        if isinstance(new, str) and isinstance(span, ast.Constant):  # a string keeps its quotes
            q = lines[span.lineno - 1][span.col_offset:span.col_offset + 1].decode()
            edits.append((*whole, q + new + q))
        edits += [(*whole, ast.unparse(after)), (*whole, f"({ast.unparse(after)})")]
        for a, b, text in edits:
            cand = splice(a, b, text)
            try:
                if ast.dump(ast.parse(cand)) == want:
                    out.append(cand)
                    break
            except (SyntaxError, ValueError, RecursionError):
                pass
        holder[key] = old
    return out


REPAIR_MISTAKES = ("near_miss", "approach")


def scripted_repair(task: dict, timeout: float = 10.0, tries: int = 8, mistake: str = "near_miss") -> list[str] | None:
    """The refiner's lesson for sft.py's scripted teacher: [a mistake, the fix]. mistake="near_miss": the
    reference (as scripted_replies writes it) with one site changed (`_mutants`); "approach": another
    family's function on the same signature (`wrong_approaches`), then near misses (reached only when fewer than
    `tries` approaches load and fail a test); candidates in an order seeded by the task id. The mistake is the first of `tries` candidates whose
    code loads and runs and fails at least one of the task's tests (in the sandbox; a candidate that crashes
    on load or runs out of time is passed over); the fix is scripted_replies' reference. The teacher never
    teaches the first reply (the mistake). None when no candidate qualifies."""
    if mistake not in REPAIR_MISTAKES:
        raise ValueError(f"repair_mistake must be one of {REPAIR_MISTAKES}, got {mistake!r}")
    ref, rng = _reference_code(task), random.Random(f"repair:{task.get('task_id', task['prompt'])}")
    cands = _mutants(ref, str(task["entry_point"]))
    rng.shuffle(cands)
    if mistake == "approach":
        approaches = wrong_approaches(task)
        rng.shuffle(approaches)
        cands = approaches + cands
    for code in cands[:tries]:
        res = run_tests(complete_code(code, task), task, timeout)
        if res.reason == "tests failed" and res.failures:
            return [_block(code), _block(ref)]
    return None


class CodeTeamEnv:
    roles = ROLES

    def __init__(self, max_refinement_iterations: int = 2, timeout: float = 10.0, repair_mistake: str = "near_miss"):
        self.max_refinements = need_int("max_refinement_iterations", max_refinement_iterations, 0, 100)
        self.timeout = need_number("timeout", timeout, MIN_TIMEOUT, 600)
        if repair_mistake not in REPAIR_MISTAKES:
            raise ValueError(f"config field data.env_kwargs.repair_mistake: must be one of {REPAIR_MISTAKES}, "
                             f"got {repair_mistake!r}")
        self.repair_mistake = repair_mistake

    def scripted_repair(self, task):
        """scripted_repair with this env's test timeout and repair_mistake (only sft.py's teacher calls it)."""
        return scripted_repair(task, self.timeout, mistake=self.repair_mistake)

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
    ms = [e.metrics for e in episodes if e.metrics and "refiner_attempts" in e.metrics]  # not an env error's
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
