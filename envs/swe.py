"""The software-engineering team on SWE-bench-format instances: analyzer -> writer -> validator.

    analyzer   reads the issue and the repository through tools (list_files, read_file, grep), up
               to max_analyzer_calls calls; its first reply without a tool call is the diagnosis
               (the files and functions to change)
    writer     sees the issue, the diagnosis and the current text of the files it names; replies
               with search/replace edit blocks (agents/swe_team.py; a unified diff is read too,
               tolerant of wrong hunk counts and stripped whitespace). The env applies them to the
               episode's working copy, all or nothing (at most MAX_EDITS blocks); an edit outside the
               repository, to a test file or to a file imported as one is rejected with the reason,
               which the writer and validator see
    validator  runs the repository's tests (run_tests) or a Python snippet (python) against the
               patched copy, up to max_validator_calls calls, then says ACCEPT (the episode ends) or
               REJECT with feedback (no verdict acts as REJECT): back to the writer, up to
               max_refinement_iterations times

Reward: SWE-bench's resolution rule, measured in the sandbox (runtime/sandbox.py; no code of the
model's or the repository's runs on the host). A fresh copy of the base repository + the model's
changes to non-test files + the instance's test_patch; the FAIL_TO_PASS and PASS_TO_PASS tests run;
    score    = (FAIL_TO_PASS tests passing / their number) if every PASS_TO_PASS test passes, else 0
    resolved = score == 1
Per model turn: analyzer = |named & gold| / |named | gold| over the repository's code files, where
gold = the files the gold patch touches and named = the files the diagnosis names (by path, or by
a base name no other file shares): naming every file does not pay (the metric `files_localised`
is the plain recall); writer = the score of the repository after its edits (0 when they did not
apply); validator (every turn of one review) = 1 when its verdict on that attempt matches
`resolved`, 0 when it does not or gives no verdict. Team reward = the score of the final repository.

Tests run with the standard library inside the sandbox (the sandbox sees no venv): test ids are
pytest-style `path.py::function`, `path.py::Class::method` (plain classes and unittest.TestCase); no
fixtures, parametrisation or third-party imports. The verdict comes from a judge sandbox that runs
nothing but the instance's test files (runtime/sandbox.run_pair): they are imported from their text,
and every other module of the repository is a proxy of a worker sandbox that runs the code under
test. A call from a test reaches the worker through a pipe and comes back as plain data (exact
builtin types, rebuilt in the judge) or an opaque handle that the judge can call and read but never
compare, test for truth, hash or iterate: an object whose __eq__ is always True decides nothing, and
the worker's process holds no result reporter for code that walks frames or gc to find. The
standard library is always the judge's own (a new `fractions.py` does not replace the one a test
uses), and a top-level name the base repository did not have never replaces an installed module;
the base's own packages come before installed ones, as on sys.path. Edits to test files, and to
code files the runner would import as a test module or package (`tests.py` next to tests/), are
refused. Each test gets a SIGALRM deadline in the judge, and each call one in the worker.
Limits: a test that compares or iterates an object of the code under test (not plain data),
subclasses or isinstance-checks its classes, or reads a non-test data file fails here; `python
bench/verdicts.py` measures the cost of the two sandboxes.

Prompts (`layout`): "rounds" (default) continues a role's tool rounds of one phase in one conversation and
starts each phase afresh (the writer's second attempt, the validator's second review); "per_role" keeps each
role's own chat through the episode (the others' words and the new files or patch arrive as new messages), so
a writer's and a validator's later attempts extend their earlier ones token for token.

Data: data/swe_data.py (load_swe: SWE-bench JSONL, repositories inline or from local git checkouts;
the generator of the small offline instances in data/swe_{train,val}.jsonl).
"""
from __future__ import annotations

import ast
import bisect
import collections
import difflib
import functools
import hashlib
import json
import posixpath
import re
import secrets
import subprocess
import sys
from dataclasses import dataclass

from agents.swe_patch import (MAX_DIFF_LINES, MAX_PATCH_SEARCH, PatchError, apply_patch, clean_path,  # noqa: F401
                              is_test_path, make_patch, parse_patch, patched_paths, shadows_tests, test_modules)
from agents.swe_team import ASK, LABEL, Edit, build_messages, extract_diff, parse_edits, parse_verdict
from envs import MIN_TIMEOUT, Prompt, judge_counts, judge_rates, need_choice, need_int, need_number
from runtime.sandbox import CLIENT, WORKER, run_pair, run_python
from runtime.tools import Tool, ToolCall, parse_tool_call, tool_prompt

ROLES = ("analyzer", "writer", "validator")
OWN = {"analyzer": {"analyzer", "diagnosis"}, "writer": {"writer"}, "validator": {"validator", "feedback"}}
"""the history labels that hold a role's own words (layout per_role: its chat has them as its replies)"""


# --------------------------------------------------------------------------------------------
# running a repository's tests in the sandbox: the verdict comes from a judge that runs no code of
# the model's (runtime/sandbox.run_pair); the code under test runs in a worker sandbox of its own

# The validator's `python` tool: a snippet run next to the patched repository (no verdict hangs on it)
SNIPPET_RUNNER = r'''
import json, os, runpy, sys
with open("job.json", encoding="utf-8") as f:
    job = json.load(f)
os.remove("job.json")
for path, text in job["files"].items():
    full = os.path.join("repo", path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(text)
os.chdir("repo")
sys.path.insert(0, os.getcwd())
with open("/sandbox/_snippet.py", "w", encoding="utf-8") as f:
    f.write(job["code"])
del job
runpy.run_path("/sandbox/_snippet.py", run_name="__main__")
'''

# The judge (after runtime.sandbox.CLIENT): the instance's test files are the only code it runs. They
# are imported from their text (a first finder); every other module of the repository is the
# worker's (remote_modules); the standard library is its own.
JUDGE = r'''
def _harness():
    import importlib, importlib.abc, importlib.machinery, io, json, os, signal, sys, traceback, unittest
    with open("job.json", encoding="utf-8") as f:
        job = json.load(f)
    os.remove("job.json")
    nonce, sources, per_test = job["nonce"], job["sources"], job["per_test"]
    root = os.path.abspath("repo")
    for path, text in sources.items():  # on disk too, for tests that read their own data files
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
    os.chdir(root)
    mods = {(p[:-12] if p.endswith("/__init__.py") else p[:-3]).replace("/", "."): p
            for p in sources if p.endswith(".py")}
    packages = set(job["test_packages"])

    class Tests(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name in mods or name in packages:
                return importlib.machinery.ModuleSpec(name, self, is_package=name in packages,
                                                      origin=os.path.join(root, mods.get(name, name)))
            return None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            name = module.__name__
            if name in packages:
                module.__path__ = []
            if name in mods:
                module.__file__ = os.path.join(root, mods[name])
                exec(compile(sources[mods[name]], module.__file__, "exec"), module.__dict__)

    remote_modules(job["first"], job["first_packages"], first=True)  # before installed packages ...
    sys.meta_path.insert(0, Tests())  # ... and after the tests
    remote_modules(job["late"], job["late_packages"])
    out_fd = os.dup(1)

    def report(test_id, passed, message=""):
        os.write(out_fd, (nonce + json.dumps({"id": test_id, "passed": passed, "message": message[:400]}) + "\n").encode())

    class Timeout(BaseException):
        pass

    def alarm(*_):
        raise Timeout(f"the test ran longer than {per_test} s")

    def describe(e):
        where = [fr for fr in traceback.extract_tb(e.__traceback__) if fr.filename.startswith(root)]
        msg = f"{type(e).__name__}: {e}".strip().rstrip(":")
        if where:
            fr = where[-1]
            msg += f" at {os.path.relpath(fr.filename, root)}:{fr.lineno}: {(fr.line or '').strip()}"
        return msg

    def module(path):
        return importlib.import_module((path[:-12] if path.endswith("/__init__.py") else path[:-3]).replace("/", "."))

    def collect(target):
        t = target.strip("/")
        paths = [t] if t.endswith(".py") else sorted(
            p for p in sources if (not t or p.startswith(t + "/"))
            and (p.rsplit("/", 1)[-1].startswith("test_") or p.endswith("_test.py")))
        ids = []
        for p in paths:
            try:
                m = module(p)
            except BaseException as e:
                report(p, False, "collecting: " + describe(e))
                continue
            for name, obj in list(vars(m).items()):
                if getattr(obj, "__module__", None) != m.__name__:
                    continue
                if callable(obj) and not isinstance(obj, type) and name.startswith("test"):
                    ids.append(f"{p}::{name}")
                elif isinstance(obj, type) and (name.startswith("Test") or issubclass(obj, unittest.TestCase)):
                    ids += [f"{p}::{name}::{k}" for k in vars(obj) if k.startswith("test") and callable(getattr(obj, k))]
        return ids

    def run(test_id):
        path, *names = test_id.split("::")
        sys.stdout = sys.stderr = io.StringIO()
        signal.signal(signal.SIGALRM, alarm)
        signal.alarm(per_test)
        try:
            if path not in sources:
                return False, f"{path} is not a test file of the instance"
            obj = module(path)
            for n in names[:-1]:
                obj = getattr(obj, n)
            if isinstance(obj, type) and issubclass(obj, unittest.TestCase):
                res = unittest.TestResult()
                obj(names[-1]).run(res)
                bad = res.errors + res.failures + [(t, "skipped: " + why) for t, why in res.skipped]
                if bad:
                    return False, bad[0][1].strip().splitlines()[-1][:400]
            else:
                getattr(obj() if isinstance(obj, type) else obj, names[-1])()
            return True, ""
        except BaseException as e:
            return False, describe(e)
        finally:
            signal.alarm(0)
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__

    ids = list(job["tests"])
    for target in job["collect"]:
        ids += collect(target)
    for test_id in dict.fromkeys(ids):
        passed, message = run(test_id)
        report(test_id, passed is True, str(message))


_harness()
'''


def _modules(paths) -> tuple[list[str], list[str]]:
    """(module names, package names) of the .py files among `paths`: a/b.py -> a.b; a/__init__.py
    and every directory holding a module -> package a."""
    mods, pkgs = set(), set()
    for p in paths:
        if not p.endswith(".py"):
            continue
        parts = p[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        else:
            mods.add(".".join(parts))
        pkgs.update(".".join(parts[:k]) for k in range(1, len(parts) + (p.endswith("/__init__.py"))))
    pkgs.discard("")
    return sorted(mods - pkgs), sorted(pkgs)


def _importable(p: str) -> bool:
    """Could Python import this file by its path's name (a/b-c.py and a.b/x.py cannot)?"""
    return all(x.isidentifier() for x in p[:-3].split("/"))


@dataclass
class TestRun:
    outcomes: dict  # test id -> (passed, message), in the order they ran
    reason: str  # the sandbox's: ok, timeout, memory limit, ... (the judge's, else the code under test's)

    @property
    def passed(self) -> list[str]:
        return [t for t, (ok, _) in self.outcomes.items() if ok]

    def summary(self, limit: int = 5) -> str:
        bad = [(t, m) for t, (ok, m) in self.outcomes.items() if not ok]
        head = f"{len(self.outcomes) - len(bad)} passed, {len(bad)} failed"
        if self.reason != "ok":
            head += f" (the run ended: {self.reason})"
        return "\n".join([head] + [f"FAILED {t}: {m}" for t, m in bad[:limit]] +
                         ([f"... {len(bad) - limit} more"] if len(bad) > limit else []))


def run_tests(files: dict[str, str], tests=(), collect=(), timeout: float = 30.0, per_test: int = 5,
              disk_mb: int = 16, base: dict[str, str] | None = None) -> TestRun:
    """Run test ids and/or every test found under `collect` paths of a repository given as
    {path: text}. The test files (is_test_path) run in a judge sandbox that runs nothing else; the
    other files run in a worker sandbox that the judge reaches only through calls that return plain
    data (runtime/sandbox.run_pair). Top-level packages of `base` (the instance's repository; default:
    `files`) come before any installed module of the same name; other new names only fill gaps (a
    new `math.py` or `numpy.py` never stands in for the real one). A test with no result failed."""
    nonce = secrets.token_hex(16)
    tests_src = {p: t for p, t in files.items() if is_test_path(p)}
    code = {p: t for p, t in files.items() if not is_test_path(p)}
    mods, pkgs = _modules(p for p in code if _importable(p))
    test_mods, test_pkgs = _modules(p for p in tests_src if _importable(p))
    tops = {n.split(".")[0] for names in _modules(p for p in (base if base is not None else files)
                                                   if not is_test_path(p) and _importable(p)) for n in names}
    tops -= set(sys.stdlib_module_names)  # a repository's `json` package never replaces the judge's own
    first = lambda names: [n for n in names if n.split(".")[0] in tops]  # noqa: E731
    late = lambda names: [n for n in names if n.split(".")[0] not in tops]  # noqa: E731
    job = {"nonce": nonce, "sources": tests_src, "tests": list(tests), "collect": list(collect),
           "per_test": int(per_test),
           "test_packages": [p for p in test_pkgs if p not in pkgs],  # a code package stays the worker's
           "first": first(mods), "first_packages": first(pkgs), "late": late(mods), "late_packages": late(pkgs)}
    judge, worker = run_pair(CLIENT + JUDGE, WORKER, timeout=timeout, cpu_s=max(1, int(timeout)), disk_mb=disk_mb,
                             judge_files={"job.json": json.dumps(job)},
                             worker_files={"job.json": json.dumps({"files": code, "per_call": int(per_test)})})
    outcomes = {}
    for line in judge.stdout.split("\n"):
        if not line.startswith(nonce):
            continue  # whatever a test printed: never a result
        try:
            rec = json.loads(line[len(nonce):])
            outcomes.setdefault(str(rec["id"]), (rec["passed"] is True, str(rec.get("message", ""))))
        except (ValueError, KeyError, TypeError):
            continue
    reason = judge.reason if judge.reason != "ok" or worker.reason in ("ok", "stopped") else worker.reason
    for t in tests:
        outcomes.setdefault(t, (False, f"no result (the run ended: {reason})"))
    return TestRun(outcomes, reason)


def run_snippet(files: dict[str, str], code: str, timeout: float = 10.0, disk_mb: int = 16) -> str:
    """What a Python snippet prints, run in the sandbox with the repository as its working directory."""
    r = run_python(SNIPPET_RUNNER, timeout=timeout, cpu_s=max(1, int(timeout)), disk_mb=disk_mb,
                   files={"job.json": json.dumps({"files": files, "code": code})})
    out = r.stdout
    if r.reason != "ok":
        err = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("  ")][-3:]
        out += ("\n" if out else "") + f"[{r.reason}] " + " | ".join(err)
    return out.strip() or "(no output)"


@dataclass
class Resolution:
    score: float  # FAIL_TO_PASS fraction, 0 unless every PASS_TO_PASS test passed
    resolved: bool
    f2p: float  # FAIL_TO_PASS fraction, ungated
    p2p_ok: bool


def evaluate(task: dict, base: dict[str, str], work: dict[str, str], timeout: float = 60.0,
             disk_mb: int = 16, per_test: int = 5, force: bool = False) -> Resolution:
    """SWE-bench's rule on a fresh copy: base + the working copy's changes to non-test files + the
    instance's test_patch; then FAIL_TO_PASS and PASS_TO_PASS run in the sandbox. An unchanged
    repository scores 0 without running anything (FAIL_TO_PASS fail on the base by definition)
    unless `force` (the data generator checks that definition)."""
    f2p, p2p = task["FAIL_TO_PASS"], task["PASS_TO_PASS"]
    if not f2p:
        return Resolution(0.0, False, 0.0, True)
    fresh = dict(base)
    for p in set(base) | set(work):
        if not is_test_path(p) and base.get(p) != work.get(p):
            if p in work:
                fresh[p] = work[p]
            else:
                fresh.pop(p, None)
    if fresh == base and not force:
        return Resolution(0.0, False, 0.0, True)
    try:
        fresh = apply_patch(fresh, task["test_patch"]) if task["test_patch"].strip() else fresh
    except PatchError:  # the model's edits broke the test patch's context: nothing can pass
        return Resolution(0.0, False, 0.0, False)
    run = run_tests(fresh, tests=list(f2p) + list(p2p), timeout=timeout, per_test=per_test, disk_mb=disk_mb,
                    base=base)
    ok = set(run.passed)
    frac = sum(t in ok for t in f2p) / len(f2p)
    p2p_ok = all(t in ok for t in p2p)
    score = frac if p2p_ok else 0.0
    return Resolution(score, score == 1.0, frac, p2p_ok)


# --------------------------------------------------------------------------------------------
# edits: the writer's blocks applied to the working copy, with the rules that keep them honest


MAX_EDITS = 100  # edit blocks one reply may make (each costs a pass over its file)


def apply_edits(files: dict[str, str], edits, protected: set[str]) -> tuple[dict[str, str], list[str]]:
    """(new files, problems): every edit applies, or none does (problems say why, one line each).
    SEARCH must occur exactly once (trailing whitespace is forgiven); an empty SEARCH creates a
    new file. Paths outside the repository and test files are refused, and so are more than
    MAX_EDITS edits (each edit is linear in its file)."""
    if len(edits) > MAX_EDITS:
        return files, [f"{len(edits)} edit blocks: at most {MAX_EDITS} in one reply"]
    out, problems = dict(files), []
    tests = test_modules(set(protected) | set(files))
    for k, e in enumerate(edits, 1):
        path = clean_path(e.path)
        if path is None:
            problems.append(f"edit {k}: rejected: {e.path[:80]!r} is outside the repository")
            continue
        if path in protected or is_test_path(path):
            problems.append(f"edit {k}: rejected: {path} is a test file; fix the code, not the tests")
            continue
        if shadows_tests(path, tests):
            problems.append(f"edit {k}: rejected: {path} would be imported as the test module "
                            f"{shadows_tests(path, tests)!r}; fix the code, not the tests")
            continue
        if not e.search.strip():
            if path in out:
                problems.append(f"edit {k}: {path} exists; an empty SEARCH only creates new files")
            else:
                out[path] = e.replace.rstrip("\n") + "\n"
            continue
        if path not in out:
            problems.append(f"edit {k}: no file {path} in the repository")
            continue
        src, n = out[path], out[path].count(e.search)
        if n == 0:  # forgive trailing whitespace: the rstripped lines, matched on line boundaries
            lines = src.split("\n")
            want = "\n" + "\n".join(ln.rstrip() for ln in e.search.split("\n")) + "\n"
            hay = "\n" + "\n".join(ln.rstrip() for ln in lines) + "\n"
            first = hay.find(want)
            if first >= 0 and hay.find(want, first + 1) < 0:
                i, m = hay.count("\n", 0, first), e.search.count("\n") + 1
                out[path] = "\n".join(lines[:i] + e.replace.split("\n") + lines[i + m:])
                continue
            if first >= 0:
                problems.append(f"edit {k}: the SEARCH text occurs more than once in {path}; include more lines")
                continue
        if n == 0:
            problems.append(f"edit {k}: the SEARCH text is not in {path} (copy the lines exactly)")
        elif n > 1:
            problems.append(f"edit {k}: the SEARCH text occurs {n} times in {path}; include more lines")
        else:
            out[path] = src.replace(e.search, e.replace, 1)
    return (files, problems) if problems else (out, [])


# --------------------------------------------------------------------------------------------
# the repository of a task: inline (the generated instances) or a local git checkout


@functools.lru_cache(maxsize=8)
def _git_files(repo_dir: str, commit: str) -> tuple[tuple[str, str], ...]:
    """Every text file of a git checkout at a commit, read with git (the checkout is not touched)."""
    ls = subprocess.run(["git", "-C", repo_dir, "ls-tree", "-r", "-z", "--name-only", commit], capture_output=True,
                        check=True).stdout.decode("utf-8", "replace").split("\0")
    paths = [p for p in ls if p]
    cat = subprocess.run(["git", "-C", repo_dir, "cat-file", "--batch"], input="".join(f"{commit}:{p}\n" for p in paths)
                         .encode(), capture_output=True, check=True).stdout
    out, pos = [], 0
    for p in paths:
        header_end = cat.index(b"\n", pos)
        size = int(cat[pos:header_end].split()[2])
        blob = cat[header_end + 1:header_end + 1 + size]
        pos = header_end + 1 + size + 1
        if b"\0" not in blob[:8000]:  # text files only
            try:
                out.append((p, blob.decode("utf-8")))
            except UnicodeDecodeError:
                pass
    return tuple(out)


def repo_files(task: dict) -> dict[str, str]:
    """The base repository of a task as {path: text} (a fresh dict: mutate it freely)."""
    if "repo_files" in task:
        return dict(task["repo_files"])
    return dict(_git_files(task["repo_dir"], task["base_commit"]))


# --------------------------------------------------------------------------------------------
# the env


_WORD = re.compile(r"[\w./-]+")


def named(paths, text: str) -> set[str]:
    """The paths the text names: a path, or a base name no other path shares, as a whole word (not
    part of a longer path or name: utils.py is not named by test_utils.py, pkg/a.py not by
    otherpkg/a.py; a trailing '.', '/' or ':' is fine). One pass over the text, whatever the number
    of paths."""
    words = sorted(set(_WORD.findall(text)))

    def said(name: str) -> bool:
        if _WORD.fullmatch(name) is None:  # a name the words cannot hold (a space, say): look for it
            return re.search(r"(?<![\w./-])" + re.escape(name) + r"(?![\w-])", text) is not None
        for key in (name, name + ".", name + "/"):
            i = bisect.bisect_left(words, key)
            if i < len(words) and (words[i] == name if key == name else words[i].startswith(key)):
                return True
        return False

    bases = collections.Counter(posixpath.basename(p) for p in paths)
    return {p for p in paths if said(p) or (bases[posixpath.basename(p)] == 1 and said(posixpath.basename(p)))}


def _arg(args: dict, key: str, default: int) -> int:
    try:
        return int(str(args.get(key, default)).strip())
    except ValueError:
        return default


class SWETeamEnv:
    roles = ROLES

    def __init__(self, max_refinement_iterations: int = 2, max_analyzer_calls: int = 4, max_validator_calls: int = 2,
                 test_timeout: float = 60.0, obs_chars: int = 3000, file_chars: int = 6000, disk_mb: int = 16,
                 layout: str = "rounds"):
        for name, v, lo, hi in (("max_refinement_iterations", max_refinement_iterations, 0, 100),
                                ("max_analyzer_calls", max_analyzer_calls, 0, 100),
                                ("max_validator_calls", max_validator_calls, 0, 100), ("obs_chars", obs_chars, 100, 10**6),
                                ("file_chars", file_chars, 100, 10**6), ("disk_mb", disk_mb, 1, 4096)):
            need_int(name, v, lo, hi)
        test_timeout = need_number("test_timeout", test_timeout, MIN_TIMEOUT, 3600)
        self.max_refinements, self.max_analyzer_calls = max_refinement_iterations, max_analyzer_calls
        self.max_validator_calls, self.timeout, self.obs_chars = max_validator_calls, test_timeout, obs_chars
        self.file_chars, self.disk_mb = file_chars, disk_mb
        self.per_role = need_choice("layout", layout, ("rounds", "per_role")) == "per_role"

    # -- tools (built per call: nothing bound is stored, so copy.deepcopy / ReMax forks stay plain) --

    def _tools(self, role: str) -> list[Tool]:
        def one(name, desc, extra=None):
            props = {name: {"type": "string", "description": desc}, **(extra or {})}
            return {"type": "object", "properties": props, "required": [name]}
        line = {"type": "integer"}
        if role == "analyzer":
            return [Tool("list_files", "List the repository's files under a directory ('' for all).",
                         one("path", "a directory"), self._list_files),
                    Tool("read_file", "Read a file (optionally lines start..end, numbered).",
                         one("path", "the file", {"start": line, "end": line}), self._read_file),
                    Tool("grep", "Find lines containing a text (not a regex), optionally under a path.",
                         one("text", "what to look for", {"path": {"type": "string"}}), self._grep)]
        return [Tool("run_tests", "Run the repository's tests: 'tests', a test file, or one test id path.py::name.",
                     one("path", "what to run"), self._run_tests),
                Tool("python", "Run a Python snippet with the patched repository importable; returns what it prints.",
                     one("code", "the Python code"), lambda a: run_snippet(self.work, a["code"], 10.0, self.disk_mb))]

    def _list_files(self, a):
        d = (clean_path(a["path"]) or "") if a["path"].strip() not in ("", ".", "/") else ""
        ps = [p for p in sorted(self.work) if not d or p == d or p.startswith(d + "/")]
        return "\n".join(ps[:200] + ([f"... {len(ps) - 200} more"] if len(ps) > 200 else [])) or f"no files under {d!r}"

    def _read_file(self, a):
        p = clean_path(a["path"])
        if p is None or p not in self.work:
            return f"error: no file {a['path'][:80]!r} (list_files shows what there is)"
        lines = self.work[p].split("\n")
        start = max(1, _arg(a, "start", 1))
        end = min(len(lines), _arg(a, "end", start + 199))
        return "\n".join(f"{i:4d}| {lines[i - 1]}" for i in range(start, end + 1)) or "(empty)"

    def _grep(self, a):
        text, d = a["text"], clean_path(a.get("path", "")) or ""
        if not text.strip():
            return "error: grep needs a text to look for"
        hits = [f"{p}:{i}: {ln.strip()[:160]}" for p in sorted(self.work) if not d or p == d or p.startswith(d + "/")
                for i, ln in enumerate(self.work[p].split("\n"), 1) if text in ln]
        return "\n".join(hits[:50] + ([f"... {len(hits) - 50} more"] if len(hits) > 50 else [])) or "no match"

    def _run_tests(self, a):
        t = a["path"].strip()
        if "::" in t:
            return run_tests(self.work, tests=[t], timeout=self.timeout, disk_mb=self.disk_mb, base=self.base).summary()
        p = "" if t in ("", ".", "/", "./") else clean_path(t)
        if p is None or p and not (p in self.work or any(q.startswith(p + "/") for q in self.work)):
            return f"error: no file or directory {t[:80]!r} in the repository"
        run = run_tests(self.work, collect=[p], timeout=self.timeout, disk_mb=self.disk_mb, base=self.base)
        return run.summary() if run.outcomes else f"no tests found under {p or 'the repository'!r} ({run.reason})"

    def _use_tool(self, role: str, reply: str) -> str | None:
        """The observation of the reply's tool call, or None when it calls none."""
        tools = self._tools(role)
        call = parse_tool_call(reply, tools)
        if call is None:
            return None
        if isinstance(call, str):
            return call  # a malformed call: the parser's error message
        assert isinstance(call, ToolCall)
        try:
            obs = str(next(t for t in tools if t.name == call.name).fn(call.arguments))
        except Exception as e:  # noqa: BLE001 — a tool failure is an observation
            obs = f"error: {type(e).__name__}: {e}"
        return obs if len(obs) <= self.obs_chars else obs[:self.obs_chars] + "\n... (truncated)"

    # -- the episode --

    def reset(self, task):
        self.task, self.issue = task, task["problem_statement"]
        self.base = repo_files(task)
        self.work = dict(self.base)
        self.protected = patched_paths(task["test_patch"])
        self.gold = sorted(p for p in patched_paths(task["patch"]) if not is_test_path(p))
        self.history = []  # (label, text, roles that see it)
        self.turns = []  # per model turn: (role, attempt index)
        self.calls = {"analyzer": 0, "validator": 0}
        self.round_from = {"analyzer": 0}  # history index where a role's current tool rounds start
        self.diagnosis, self.attempts, self.verdicts, self._scores = None, [], {}, {}
        self.chats, self.said, self.seen = {}, {}, {}  # layout per_role: each role's chat, last reply, history read
        return self._turn("analyzer")

    def _turn(self, role):
        """The role's prompt. The analyzer's tool rounds, and the validator's on one patch, continue one
        conversation (agents.swe_team.build_messages' rounds): the tools stay in the system prompt after the
        last call, the rounds follow the opening message, so each round's prompt extends the last. layout
        "per_role": every turn of a role continues its own chat, across attempts too (the writer's fix after a
        rejection follows its first edits and the feedback; the validator's second review its first), the
        history entries new to it (not its own words), the files or patch of a new attempt and what to do now
        arriving as one user message."""
        self.role = role
        start = self.round_from.get(role, len(self.history))  # where this role's current tool rounds begin
        shown = [(w, t) for w, t, who in self.history[:start] if role in who]
        seq = self.history[start:]
        rounds = [(seq[i][1], seq[i + 1][1]) for i in range(0, len(seq) - 1, 2)
                  if seq[i][0] == role and seq[i + 1][0] == "observation"]
        context, tools, cap = "", "", 0
        if role == "writer":
            context = self._files_for_writer()
        else:
            if role == "validator":
                diff = make_patch(self.base, self.work)
                context = "The patch (all changes so far):\n" + (f"```diff\n{diff[:self.file_chars]}```" if diff else "(no change)")
            cap = self.max_analyzer_calls if role == "analyzer" else self.max_validator_calls
            tools = tool_prompt(self._tools(role)) if cap > 0 else ""
        if self.per_role and role in self.chats:  # its own chat goes on: its reply, then what is new for it
            new = [(w, t) for w, t, who in self.history[self.seen[role]:] if role in who and w not in OWN[role]]
            ask = ASK[role] if not tools else ASK[f"{role}_last" if self.calls[role] >= cap else f"{role}_tools"]
            context = "" if new and new[-1][0] == "observation" else context  # a tool round: just its result
            msgs = self.chats[role] + [{"role": "assistant", "content": self.said[role]},
                                       {"role": "user", "content": "\n\n".join(
                                           [f"{LABEL.get(w, w)}:\n{t.strip()}" for w, t in new]
                                           + ([context.strip()] if context else []) + [ask])}]
        else:
            msgs = build_messages(role, self.issue, shown, context, tools, rounds=rounds, cap=cap)
        self.chats[role], self.seen[role] = msgs, len(self.history)
        return Prompt(role, msgs)

    def _files_for_writer(self) -> str:
        code = [p for p in sorted(self.work) if not is_test_path(p)]
        said = named(self.work, self.diagnosis or "")
        shown = [p for p in code if p in said]
        if not shown:
            return "Files in the repository:\n" + "\n".join(code[:100])
        parts, left = [], self.file_chars
        for p in shown:
            body = self.work[p] if len(self.work[p]) <= left else self.work[p][:left] + "\n... (truncated)"
            parts.append(f"{p}\n```python\n{body.rstrip()}\n```")
            left -= len(body)
            if left <= 0:
                break
        return "Current contents:\n\n" + "\n\n".join(parts)

    def step(self, reply):
        role = self.role
        self.said[role] = reply
        self.turns.append((role, len(self.attempts) - 1))
        if role == "analyzer":
            obs = self._use_tool(role, reply) if self.calls[role] < self.max_analyzer_calls else None
            if obs is not None:
                self.calls[role] += 1
                self.history += [("analyzer", reply, {"analyzer"}), ("observation", obs, {"analyzer"})]
                return self._turn("analyzer")
            self.diagnosis = reply
            self.history.append(("diagnosis", reply, {"writer", "validator"}))
            return self._turn("writer")
        if role == "writer":
            edits, problems = parse_edits(reply)
            diff = extract_diff(reply) if not edits and not problems else None
            if diff is not None:
                try:
                    new, problems = self._apply_diff(diff), []
                except PatchError as e:
                    new, problems = self.work, [f"the diff does not apply: {e}"]
            elif not edits and not problems:
                new, problems = self.work, ["no edit block found (path, <<<<<<< SEARCH, =======, >>>>>>> REPLACE)"]
            else:
                new, more = apply_edits(self.work, edits, self.protected)
                problems += more
                new = self.work if problems else new
            applied = not problems
            self.work = new
            self.attempts.append({"applied": applied, "work": dict(new)})
            self.turns[-1] = ("writer", len(self.attempts) - 1)
            note = (f"applied {len(edits) or 'the diff'} edit(s) to "
                    f"{', '.join(sorted(p for p in set(new) | set(self.base) if new.get(p) != self.base.get(p))) or 'nothing'}"
                    if applied else "NOT applied (nothing changed):\n" + "\n".join(problems[:5]))
            self.history.append(("applied", note, {"writer", "validator"}))
            self.calls["validator"], self.round_from["validator"] = 0, len(self.history)
            return self._turn("validator")
        # validator
        obs = self._use_tool(role, reply) if self.calls[role] < self.max_validator_calls else None
        if obs is not None:
            self.calls[role] += 1
            self.history += [("validator", reply, {"validator"}), ("observation", obs, {"validator"})]
            return self._turn("validator")
        verdict = parse_verdict(reply)
        self.verdicts[len(self.attempts) - 1] = verdict  # None (no verdict) acts as REJECT but earns nothing
        if verdict or len(self.attempts) > self.max_refinements:
            return None
        self.history.append(("feedback", reply, {"writer", "validator"}))
        return self._turn("writer")

    def _apply_diff(self, diff: str) -> dict[str, str]:
        tests = test_modules(set(self.protected) | set(self.work))
        bad = sorted(p for p in patched_paths(diff) if clean_path(p) is None or p in self.protected or is_test_path(p)
                     or shadows_tests(p, tests))
        if bad:
            raise PatchError(f"rejected: {bad[0]} is outside the repository, a test file or imported as the tests")
        return apply_patch(self.work, diff)

    # -- rewards --

    def _score(self, k: int) -> Resolution:
        """The resolution of the repository after writer attempt k (-1: the base), cached by content."""
        work = self.attempts[k]["work"] if k >= 0 else self.base
        key = hashlib.sha256(json.dumps(sorted(work.items())).encode()).hexdigest()
        if key not in self._scores:
            self._scores[key] = evaluate(self.task, self.base, work, self.timeout, self.disk_mb)
        return self._scores[key]

    def named_files(self) -> set[str]:
        """The repository's code files (not tests) that the diagnosis names."""
        return {p for p in named(self.base, self.diagnosis or "") if not is_test_path(p)}

    def localised(self) -> float:
        """Recall: the share of the gold patch's files that the diagnosis names (the metric)."""
        return len(set(self.gold) & self.named_files()) / len(self.gold) if self.gold else 0.0

    def analyzer_reward(self) -> float:
        """|named & gold| / |named | gold|: naming every file in the repository does not pay."""
        named, gold = self.named_files(), set(self.gold)
        return len(named & gold) / len(named | gold) if gold else 0.0

    def scripted_replies(self, task) -> list[str]:
        """A perfect team's replies for this env's tool-call budgets (module scripted_replies): sft.py's
        scripted teacher plays these, so configs/tiny_swe.py's (no tool calls) get their own."""
        return scripted_replies(task, self.max_analyzer_calls, self.max_validator_calls, self.obs_chars)

    def turn_rewards(self):
        out = []
        for role, k in self.turns:
            if role == "analyzer":
                out.append(self.analyzer_reward())
            elif role == "writer":
                out.append(self._score(k).score if self.attempts[k]["applied"] else 0.0)
            else:
                v = self.verdicts.get(k)
                out.append(float(v is not None and v == self._score(k).resolved))
        return out

    def metrics(self):
        final = self._score(len(self.attempts) - 1)
        judged = [(v, self._score(k).resolved) for k, v in self.verdicts.items()]
        return {"team_reward": final.score, "resolved": float(final.resolved), "f2p_frac": final.f2p,
                "p2p_ok": float(final.p2p_ok), "patch_applied": float(any(a["applied"] for a in self.attempts)),
                "files_localised": self.localised(), "iterations": len(self.attempts),
                "analyzer_calls": self.calls["analyzer"], "accepted": float(any(v is True for v in self.verdicts.values())),
                "validator_correct": sum(v == r for v, r in judged) / len(judged) if judged else 0.0,
                **judge_counts("validator", judged)}

    def model_patch(self) -> str:
        """The episode's patch as a unified diff (SWE-bench's `model_patch`), test files left out."""
        return make_patch({p: t for p, t in self.base.items() if not is_test_path(p)},
                          {p: t for p, t in self.work.items() if not is_test_path(p)})


def load_tasks(spec: str) -> list[dict]:
    """data.train_files / val_files: a SWE-bench JSONL, or `FILE.jsonl@REPOS_DIR` (data/swe_data.py)."""
    from data.swe_data import load_swe
    return load_swe(spec)


def check_config(cfg, grouped: tuple) -> tuple[str, str] | None:
    """layout="per_role" and the trainer (workflows.check_roles): a writer's attempts, and a validator's reviews, in
    one chat are paid apart (each attempt's score, each verdict against its own patch): no merged sequence."""
    if cfg.data.env_kwargs.get("layout") == "per_role" and cfg.rollout.merge_turns:
        return ("rollout.merge_turns", "layout='per_role' keeps each role's attempts in one chat, each paid on its own; "
                "merging would train the first attempt on the last one's reward (algo.pack_turns still packs them)")
    return None


def aggregate(episodes) -> dict:
    """Rates over the episodes, and mean tokens per turn of each role."""
    ms = [e.metrics for e in episodes if e.metrics and "resolved" in e.metrics]
    n = max(1, len(ms))
    out = {f"{k}_rate" if k in ("resolved", "patch_applied") else k: sum(m[k] for m in ms) / n
           for k in ("resolved", "patch_applied", "files_localised", "iterations", "validator_correct")}
    out.update(judge_rates("validator", {k: sum(m.get(k, 0.0) for m in ms) for k in ms[0] if k.startswith("validator_")}
                           if ms else {}))
    for role in ROLES:
        steps = [s for e in episodes for s in getattr(e, "samples", ()) if s.role == role]  # compare.py: metrics only
        if steps:
            out[f"tokens/{role}"] = sum(len(s.completion_ids) for s in steps) / len(steps)
    return out



# --------------------------------------------------------------------------------------------
# a scripted perfect team (sft.py's scripted teacher): replies derived from the instance's gold patch

BUG_WORDS = {"off_by_one": "an off-by-one constant", "wrong_operator": "a wrong operator",
             "swapped_arguments": "two arguments swapped", "missing_edge_case": "a missing edge case"}


def _tool_call(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def _changes(a: list[str], b: list[str]) -> list[tuple[int, int, int, int]]:
    """The (i1, i2, j1, j2) line ranges where b (the gold version) differs from a (the base)."""
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def _block(text: str, a: list[str], b: list[str], i1: int, i2: int, j1: int, j2: int, lo: int, hi: int):
    """(SEARCH, REPLACE) for the change a[i1:i2] -> b[j1:j2] with the least context (lines of a in
    [lo, i1) before it and [i2, hi) after it, which b shares) that makes SEARCH non-blank and occur
    once in the file, as apply_edits counts; None when no context does."""
    for n in range((i1 - lo) + (hi - i2) + 1):  # n lines of context: (0,0) (1,0) (1,1) (2,1) ..., or one side's all
        half = sorted({(n + 1) // 2, n // 2}, reverse=True)
        for k, m in [(h, n - h) for h in half] + [(n - (hi - i2), hi - i2), (i1 - lo, n - (i1 - lo))]:
            if 0 <= k <= i1 - lo and 0 <= m <= hi - i2:
                search = "\n".join(a[i1 - k:i2 + m])
                if search.strip() and text.count(search) == 1:
                    return search, "\n".join(a[i1 - k:i1] + b[j1:j2] + a[i2:i2 + m])
    return None


def _file_edits(text: str, fixed: str) -> list[tuple[str, str]]:
    """Edit blocks (SEARCH, REPLACE) that turn text into fixed through apply_edits: one per change,
    else one block spanning them all; each line's trailing whitespace left out where that still
    gives `fixed` (the writer's view of a file may not show it)."""
    a, b = text.split("\n"), fixed.split("\n")
    ch = _changes(a, b)
    per = [_block(text, a, b, i1, i2, j1, j2, ch[k - 1][1] if k else 0, ch[k + 1][0] if k + 1 < len(ch) else len(a))
           for k, (i1, i2, j1, j2) in enumerate(ch)]
    whole = _block(text, a, b, ch[0][0], ch[-1][1], ch[0][2], ch[-1][3], 0, len(a))
    tries = ([per] if None not in per else []) + ([[whole]] if whole else [])

    def bare(t: str) -> str:
        return "\n".join(ln.rstrip() for ln in t.split("\n"))

    for blocks in tries:
        for cand in ([(bare(s), bare(r)) for s, r in blocks], blocks):
            got, problems = apply_edits({"m.py": text}, [Edit("m.py", s, r) for s, r in cand], set())
            if not problems and got["m.py"] == fixed:
                return cand
    return tries[-1] if tries else []


def _function_at(text: str, line: int):
    """The innermost function (an ast node) whose lines hold `line` (1-based), else None."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    fns = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
           and n.lineno <= line <= (n.end_lineno or n.lineno)]
    return max(fns, key=lambda n: n.lineno, default=None)


def _read_window(a: list[str], fn, first: int, last: int, obs_chars: int) -> tuple[int, int]:
    """The 1-based lines an analyzer reads: the function's code after its docstring (with a line
    either side of the change), cut around the change until read_file's numbered lines fit obs_chars."""
    start, end = (fn.lineno, fn.end_lineno or fn.lineno) if fn is not None else (first - 5, last + 5)
    body = fn.body if fn is not None else []
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0].value, "value", None), str):
        start = body[0].end_lineno + 1
    start, end = max(1, min(start, first - 1)), min(len(a), max(end, last + 1))

    def size():
        return sum(len(f"{k:4d}| {a[k - 1]}") + 1 for k in range(start, end + 1))

    while size() > obs_chars - 40 and (start < first - 1 or end > last + 1):
        if end > last + 1 and end - last >= first - start:
            end -= 1
        else:
            start += 1
    return start, end


def _reproducer(issue: str) -> tuple[str, str] | None:
    """(a snippet, the call it shows) from the issue's first ```python block of `>>> ` lines: the
    statements run and the last expression's repr is printed, as the issue shows it."""
    lines, inside = [], False
    for ln in issue.split("\n"):
        if ln.strip().startswith("```"):
            if inside:
                break
            inside = True
        elif inside and ln.startswith(">>> "):
            lines.append(ln[4:])
    if not lines:
        return None
    try:
        ast.parse(lines[-1], mode="eval")
        code = lines[:-1] + [f"print(repr({lines[-1]}))"]
    except SyntaxError:
        code = lines + ['print("ok")']
    try:
        ast.parse("\n".join(code))
    except SyntaxError:
        return None
    return "\n".join(code), lines[-1]


def scripted_replies(task, max_analyzer_calls: int = 2, max_validator_calls: int = 1,
                     obs_chars: int = 1200) -> list[str]:
    """A perfect team's replies in turn order, derived from the instance's gold `patch`; the keyword
    arguments are the env's (defaults: configs/swe_team.py's), which set how many tool calls fit.
    The analyzer greps for the definition of the function the gold patch changes and reads its code
    (up to two calls), then names exactly the gold files, the function and the line to change; the
    writer sends the gold change as the smallest edit blocks whose SEARCH occurs once; the validator
    runs the issue's example against the patched code (then the module's tests, given a second
    call) and accepts. Through SWETeamEnv every turn earns 1 when the gold patch edits existing
    code files only (a file it adds cannot be named: the analyzer's reward reads the base files;
    a file it deletes cannot be said with edit blocks)."""
    base = repo_files(task)
    fixed = apply_patch(base, task["patch"])
    gold = sorted(p for p in set(base) | set(fixed) if not is_test_path(p) and base.get(p) != fixed.get(p))
    edits, said, calls = [], [], []
    for p in gold:
        text, new = base.get(p), fixed.get(p)
        if new is None:
            continue
        if text is None:  # a new file: an empty SEARCH creates it
            body = new.rstrip("\n")
            edits.append(f"{p}\n<<<<<<< SEARCH\n=======\n{body}\n>>>>>>> REPLACE")
            said.append(f"{p} must be created.")
            continue
        edits += [f"{p}\n<<<<<<< SEARCH\n{s}\n=======\n{r}\n>>>>>>> REPLACE" for s, r in _file_edits(text, new)]
        a, b = text.split("\n"), new.split("\n")
        ch = _changes(a, b)
        i1, i2, j1, j2 = ch[0]
        line = min(i1 + 1, len(a))  # 1-based: the first changed line, or the line an insertion goes before
        fn = _function_at(text, line)
        kind = BUG_WORDS.get(str(task.get("bug_kind", ""))) if p == gold[0] else None
        old = " ".join(x.strip() for x in a[i1:i2] if x.strip())
        add = " ".join(x.strip() for x in b[j1:j2] if x.strip())
        fix = (f"line {i1 + 1} `{old}` should be `{add}`." if old and add else f"line {i1 + 1} `{old}` should go."
               if old else f"before line {line} `{a[line - 1].strip()}` add `{add}`.")
        said.append((f"`{fn.name}` in {p}" if fn is not None else p) + (f" ({kind})" if kind else "") + f": {fix}"
                    + (f" ({len(ch) - 1} more change(s) in this file.)" if len(ch) > 1 else ""))
        if not calls:  # the analyzer looks for the first changed function and reads it
            probe = f"def {fn.name}(" if fn is not None else next(
                (x.strip() for x in a[i1:max(i2, i1 + 1)] if x.strip()), a[line - 1].strip())[:60]
            start, end = _read_window(a, fn, line, max(i2, line), obs_chars)
            calls = [_tool_call("grep", text=probe), _tool_call("read_file", path=p, start=start, end=end)]
    replies = calls[:max(0, max_analyzer_calls)] + ["The bug is in " + " ".join(said), "\n\n".join(edits)]
    rep = _reproducer(str(task.get("problem_statement", "")))
    tests = sorted(t for t in patched_paths(task.get("test_patch", "")) if t in base)
    checks = [_tool_call("python", code=rep[0])] if rep else []
    checks += [_tool_call("run_tests", path=tests[0])] if tests else []
    why = "the issue's example now gives the expected result" if rep else "the tests pass"
    return replies + checks[:max(0, max_validator_calls)] + [f"Verdict: ACCEPT\nThe patch fixes the issue: {why}."]
