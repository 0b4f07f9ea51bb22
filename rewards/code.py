"""Code rewards: run a task's tests against a model-written solution, with verdicts it cannot forge.

`run_tests(solution, task) -> CodeResult(passed, total, reason, failures)`; reward = passed / total
(`all_passed` for the binary variant). Never raises on any solution or task (SandboxUnavailable
aside: no sandbox on this machine is a setup error, not a score of 0).

Tests are the assert statements of HumanEval's `check(candidate)` body (the other statements are
setup, run in order), or MBPP-style lists of asserts; a statement counts as a test when it asserts
something about the function (`assert True` does not count).

Where the verdict comes from: two sandboxes (runtime/sandbox.run_pair). The solution runs in a worker
sandbox and nothing else does; the task's prompt (its helpers and imports), setup and asserts run in
a judge sandbox that runs no code of the solution's. There, `candidate` (and the entry point's name)
is a proxy: a call goes down a pipe, the worker calls the solution's function and sends back plain
data (numbers, strings, bytes, lists, tuples, dicts, sets: exact builtin types, rebuilt in the
judge; a Counter or a str subclass comes back as its builtin data), or an opaque handle for anything
else, which the judge refuses to read, call, compare, test for truth, hash or iterate (it can only be
passed back). So an object whose `__eq__` (or `__bool__`) is always True fails, and so does one whose
methods lie (`candidate('ab').upper() == 'AB'` never runs an `upper` the solution wrote), and so does a
solution that hunts for the harness (its frames, gc, a nonce, result lines): the process it runs in
holds no reporter; the judge alone prints results. All a solution decides is what its function
returns, as an honest function returning the same values would. A call that runs past `per_call`
seconds raises TimeoutError in the solution, so a hang fails its test, not the ones after it.

passed counts DISTINCT test indices, so passed / total is in [0, 1] by construction; a test with no
result is a failure, never an error. The cost: two sandboxes per solution, started together
(`python bench/verdicts.py` measures it).

Data: data/code_data.py (HumanEval offline, and JSONL rows with prompt / tests / entry_point).
"""
from __future__ import annotations

import ast
import json
import re
import secrets
from dataclasses import dataclass, field

from runtime.sandbox import CLIENT, WORKER, SandboxUnavailable, run_pair


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
    """[(source, has_assert)]: HumanEval check() bodies split per statement, or a list of asserts."""
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


def _plan(tests, entry: str):
    """([(i, is_test, source)], test indices): a statement is a test when it asserts something about
    the function (or, when none names it, when it asserts at all); the rest is setup."""
    names = {"candidate", entry}
    is_test = [has_assert and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(ast.parse(src)))
               for src, has_assert in tests]
    if not any(is_test):  # tests that never name the function: every assert counts, as written
        is_test = [has_assert for _, has_assert in tests]
    return [(i, t, src) for i, ((src, _), t) in enumerate(zip(tests, is_test))], [i for i, t in enumerate(is_test) if t]


# The judge (after runtime.sandbox.CLIENT): the prompt, the setup and the asserts, with `candidate` the
# worker's function; one result line per statement, on its own copy of stdout.
JUDGE = r'''
import signal as _signal
OPAQUE_RESULTS = True  # what the function returns is plain data or an object no test can read or call
with open("job.json", encoding="utf-8") as _f:
    JOB = _json.load(_f)
_os.remove("job.json")
_OUT = _os.fdopen(_os.dup(1), "w")
_sys.stdout = open(_os.devnull, "w")


def emit(d):
    _OUT.write(JOB["nonce"] + _json.dumps(d) + "\n")
    _OUT.flush()


def _main():
    try:
        sol = Remote(CHANNEL.ask(op="import", name="solution")["v"]["h"], "module")
        fn = getattr(sol, JOB["entry"])
    except BaseException as e:
        emit({"error": f"{type(e).__name__}: {str(e)[:200]}"})
        return
    last = []

    def candidate(*args, **kwargs):
        last[:] = [f"{JOB['entry']}{_short(args, kwargs)}"]
        v = fn(*args, **kwargs)
        last.append(repr(v)[:100])
        return v

    g = {"__name__": "__check__"}
    try:
        exec(compile(JOB["prompt"], "prompt.py", "exec"), g)  # the task's helpers and imports (trusted text)
    except BaseException:
        pass
    g["candidate"] = g[JOB["entry"]] = candidate
    for i, is_test, src in JOB["plan"]:
        last.clear()
        try:
            exec(compile(src, f"test_{i}", "exec"), g)
            ok, msg = True, ""
        except BaseException as e:
            ok, msg = False, f"{type(e).__name__}: {str(e)[:200]}".rstrip(": ")
            if len(last) == 2:
                msg += f" ({last[0]} returned {last[1]})"
            elif last:
                msg += f" (in {last[0]})"
        if is_test:
            emit({"i": i, "ok": ok, "msg": msg})


def _short(args, kwargs):
    parts = [repr(a)[:40] for a in args] + [f"{k}={v!r:.40}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts)[:120] + ")"


_main()
'''


def extract_code(text: str) -> str:
    """The last ```python fenced block (or any fenced block), else the text itself."""
    blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", text, re.DOTALL)
    return blocks[-1] if blocks else text


def run_tests(solution: str, task: dict, timeout: float = 10.0) -> CodeResult:
    """Run task["tests"] against `solution` (complete code defining task["entry_point"]): the verdict
    comes from a judge sandbox that runs none of the solution's code (module docstring)."""
    try:
        return _run_tests(solution, task, timeout)
    except SandboxUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 — a reward never crashes the trainer
        return CodeResult(0, 0, f"could not run the tests: {type(e).__name__}: {str(e)[:200]}")


def _run_tests(solution: str, task: dict, timeout: float) -> CodeResult:
    try:
        tests = split_tests(task["tests"])
        plan, test_ids = _plan(tests, task["entry_point"])
    except (SyntaxError, ValueError, RecursionError) as e:
        return CodeResult(0, 0, f"task tests do not parse: {e}")
    nonce = "@@" + secrets.token_hex(8) + "@@"
    job = {"nonce": nonce, "entry": str(task["entry_point"]), "plan": plan, "prompt": str(task.get("prompt") or "")}
    judge, worker = run_pair(CLIENT + JUDGE, WORKER, timeout=timeout, cpu_s=max(1, int(timeout)),
                             judge_files={"job.json": json.dumps(job)},
                             worker_files={"job.json": json.dumps({"files": {"solution.py": str(solution)},
                                                                   "per_call": max(1, min(5, int(timeout) // 2))})})
    verdict, msgs, error, wanted = {}, {}, None, set(test_ids)
    for line in judge.stdout.splitlines():
        if not line.startswith(nonce):
            continue
        try:
            d = json.loads(line[len(nonce):])
        except (ValueError, RecursionError):
            continue
        if "error" in d:
            error = str(d["error"])[:300]
        elif d.get("i") in wanted:
            verdict[d["i"]] = d.get("ok") is True
            msgs[d["i"]] = str(d.get("msg", ""))[:300]
    passed = sum(verdict.get(i) is True for i in test_ids)
    failures = [f"{tests[i][0][:200]} -> {msgs.get(i) or 'did not run'}" for i in test_ids if verdict.get(i) is not True]
    total = len(test_ids)
    if error:
        reason = error  # the solution did not even load
    elif judge.reason != "ok":
        reason = judge.reason  # the sandbox's own verdict (timeout, memory, ...)
    elif worker.reason not in ("ok", "stopped") and passed < total:
        reason = worker.reason  # the solution's process ended early (memory, exit, ...)
    elif total == 0:
        reason = "the task has no tests"
    else:
        reason = "all passed" if passed == total else "tests failed"
    return CodeResult(passed, total, reason, failures)


def code_reward(response: str, task: dict) -> float:
    """Fraction of the task's tests the reply's code passes; 0 on any failure."""
    return run_tests(extract_code(response), task).reward
