"""The SWE team (envs/swe.py, agents/swe_team.py, data/swe_data.py): patch and edit parsing, the
sandboxed test runner and SWE-bench's resolution rule, scripted teams through every branch (perfect
-> 1, broken -> 0, malicious -> contained), the loader and the generator, and two training steps
of the tiny model."""
import dataclasses
import json
import math
import os
import subprocess

import pytest

import train
from agents.swe_team import extract_diff, parse_edits, parse_verdict
from config import load_config_file
from data.math_data import DataError
from data.swe_data import load_swe
from data.swe_generate import generate
from envs.swe import (
    PatchError,
    SWETeamEnv,
    apply_edits,
    apply_patch,
    clean_path,
    evaluate,
    is_test_path,
    make_patch,
    parse_patch,
    patched_paths,
    repo_files,
    run_tests,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------------- a hand-made instance

BUGGY = "def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n    return a - b\n\n\ndef neg(a):\n    return -a\n"
FIXED = BUGGY.replace("return a - b", "return a + b")
BASE = {"calc/__init__.py": "from .ops import add, neg\n", "calc/ops.py": BUGGY, "calc/util.py": "X = 1\n",
        "tests/test_ops.py": "from calc.ops import add, neg\n\n\ndef test_neg():\n    assert neg(2) == -2\n\n\n"
                             "def test_add_zero():\n    assert add(5, 0) == 5\n"}
WITH_TESTS = {**BASE, "tests/test_ops.py": BASE["tests/test_ops.py"] + "\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
              "def test_add_neg():\n    assert add(-1, -1) == -2\n"}
TASK = {"instance_id": "calc-1", "repo": "me/calc", "base_commit": "0" * 40, "repo_files": BASE,
        "problem_statement": "add(2, 3) returns -1, expected 5.",
        "patch": make_patch(BASE, {**BASE, "calc/ops.py": FIXED}), "test_patch": make_patch(BASE, WITH_TESTS),
        "FAIL_TO_PASS": ["tests/test_ops.py::test_add", "tests/test_ops.py::test_add_neg"],
        "PASS_TO_PASS": ["tests/test_ops.py::test_neg", "tests/test_ops.py::test_add_zero"]}
FIX = "calc/ops.py\n```python\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n```"
TOOL = lambda name, **args: f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


def play(env, task, replies):
    turn, roles = env.reset(task), []
    for r in replies:
        assert turn is not None, f"ended early, before {r[:40]!r}"
        roles.append(turn.role)
        turn = env.step(r)
    assert turn is None, "did not end"
    return roles, env.turn_rewards(), env.metrics()


# ---------------------------------------------------------------------------------- diffs


def test_make_and_apply_patch_round_trip_and_tolerance():
    new = {**BASE, "calc/ops.py": FIXED, "calc/new.py": "Y = 2\n"}
    del new["calc/util.py"]
    d = make_patch(BASE, new)
    assert apply_patch(BASE, d) == new and patched_paths(d) == {"calc/ops.py", "calc/new.py", "calc/util.py"}
    one = make_patch(BASE, {**BASE, "calc/ops.py": FIXED})
    # what models get wrong: hunk counts, the space of blank context lines, CRLF, no trailing newline, fences
    for variant in (one.replace("@@ -1,3 +1,3 @@", "@@ -1,9 +1,12 @@"), one.replace("@@ -1,3 +1,3 @@", "@@ -1 +1 @@"),
                    one.replace("\n", "\r\n"), one.rstrip("\n")):
        assert apply_patch(BASE, variant)["calc/ops.py"] == FIXED, variant
    assert apply_patch(BASE, extract_diff(f"Here:\n```diff\n{one}```\nDone."))["calc/ops.py"] == FIXED
    with pytest.raises(PatchError, match="calc/ops.py: hunk .* does not match"):
        apply_patch(BASE, one.replace("-    return a - b", "-    return a * b"))
    with pytest.raises(PatchError, match="nope.py: no such file"):
        apply_patch(BASE, one.replace("calc/ops.py", "nope.py"))
    with pytest.raises(PatchError, match="no file in the diff"):
        apply_patch(BASE, "just words, no diff")
    for evil in ("../../etc/passwd", "/etc/passwd", ".git/config", "a/../../x.py"):
        with pytest.raises(PatchError, match="outside the repository"):
            apply_patch(BASE, one.replace("a/calc/ops.py", f"a/{evil}").replace("b/calc/ops.py", f"b/{evil}")
                        .replace("--- a//", "--- /").replace("+++ b//", "+++ /"))
    assert parse_patch("") == [] and patched_paths("--- a\n+++ b\n@@ garbage") == set()
    assert [clean_path(p) for p in ("./a/b.py", "a//b.py", "a/../b.py", "../b.py", "/b.py", ".git", "")] == \
        ["a/b.py", "a/b.py", "b.py", None, None, None, None]
    assert is_test_path("tests/x.py") and is_test_path("pkg/test_x.py") and is_test_path("conftest.py")
    assert not is_test_path("pkg/core.py") and not is_test_path("pkg/attest.py")


def test_edit_blocks_parse_tolerantly_and_apply_all_or_nothing():
    edits, problems = parse_edits(FIX)
    assert problems == [] and [(e.path, e.search, e.replace) for e in edits] == [("calc/ops.py", "    return a - b",
                                                                                 "    return a + b")]
    for head in ("**calc/ops.py**", "File: calc/ops.py", "# calc/ops.py", "In `calc/ops.py`:"):
        assert parse_edits(FIX.replace("calc/ops.py", head))[0][0].path == "calc/ops.py"
    assert parse_edits(FIX.replace("<<<<<<< SEARCH", "<<<<< search").replace(">>>>>>> REPLACE", ">>>>>>>>> Replace"))[0]
    two = FIX + "\n\ncalc/util.py\n<<<<<<< SEARCH\nX = 1\n=======\nX = 2\n>>>>>>> REPLACE\n"
    out, probs = apply_edits(BASE, parse_edits(two)[0], set())
    assert probs == [] and out["calc/ops.py"] == FIXED and out["calc/util.py"] == "X = 2\n"
    assert parse_edits(FIX.replace(">>>>>>> REPLACE", ""))[1] == ["edit block 1: the reply ends inside the block "
                                                                 "(no >>>>>>> REPLACE line)"]
    assert "no file name" in parse_edits("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE")[1][0]
    assert parse_edits("no blocks here") == ([], [])
    # all or nothing: one bad edit leaves the files as they were
    bad = two.replace("X = 1\n=", "X = 7\n=")
    out, probs = apply_edits(BASE, parse_edits(bad)[0], set())
    assert out == BASE and probs == ["edit 2: the SEARCH text is not in calc/util.py (copy the lines exactly)"]
    cases = {"../outside.py": "outside the repository", "/etc/passwd": "outside the repository",
             "tests/test_ops.py": "is a test file", "calc/nope.py": "no file calc/nope.py"}
    for path, why in cases.items():
        out, probs = apply_edits(BASE, parse_edits(FIX.replace("calc/ops.py", path))[0], set())
        assert out == BASE and why in probs[0], (path, probs)
    twice = {**BASE, "calc/ops.py": BUGGY + "\n\ndef sub(a, b):\n    return a - b\n"}
    assert "occurs 2 times" in apply_edits(twice, parse_edits(FIX)[0], set())[1][0]
    trailing = FIX.replace("    return a - b\n=", "    return a - b   \n=")  # forgiven trailing whitespace
    assert apply_edits(BASE, parse_edits(trailing)[0], set())[0]["calc/ops.py"] == FIXED
    created = apply_edits(BASE, parse_edits("calc/extra.py\n<<<<<<< SEARCH\n=======\nZ = 3\n>>>>>>> REPLACE")[0], set())
    assert created[0]["calc/extra.py"] == "Z = 3\n" and created[1] == []


@pytest.mark.parametrize("text,want", [
    ("Verdict: ACCEPT", True), ("verdict - reject, the test fails", False), ("**Verdict:** Accept", True),
    ("I ACCEPT this patch", True), ("REJECTED: still wrong", False), ("Verdict: REJECT ... Verdict: ACCEPT", True),
    ("looks fine to me", None), ("", None), (None, None)])
def test_verdicts(text, want):
    assert parse_verdict(text) is want


def test_parsers_never_raise_on_hostile_text():
    hostile = ["<<<<<<< SEARCH\n" * 5000, "```\n" * 20000 + "\n+++ @@", "=======\n>>>>>>> REPLACE\n" * 3000,
               "--- a/x\n+++ b/x\n" + "@@ -1,99999 +1 @@\n" * 2000, "\x00\ud800" * 1000, " " * 32768 + "Verdict:",
               "a" * 40000 + ".py\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE", "Verdict:" + "-" * 30000]
    for h in hostile:
        parse_edits(h), parse_verdict(h)
        d = extract_diff(h)
        try:
            apply_patch(BASE, d or h)
        except PatchError:
            pass
    env = SWETeamEnv(max_analyzer_calls=1, max_validator_calls=1, max_refinement_iterations=1)
    for h in hostile[:4]:
        turn = env.reset(TASK)
        while turn is not None:
            turn = env.step(h)
        assert len(env.turn_rewards()) == len(env.turns) and env.metrics()["team_reward"] == 0.0


# ---------------------------------------------------------------------------------- tests in the sandbox


def test_resolution_rule():
    assert evaluate(TASK, BASE, {**BASE, "calc/ops.py": FIXED}).score == 1.0
    assert evaluate(TASK, BASE, BASE).score == 0.0  # nothing changed: nothing to run
    assert evaluate(TASK, BASE, BASE, force=True).f2p == 0.0  # and indeed they fail on the base
    half = evaluate(TASK, BASE, {**BASE, "calc/ops.py": BUGGY.replace("return a - b", "return 5 if a == 2 else a - b")})
    assert (half.score, half.f2p, half.p2p_ok, half.resolved) == (0.5, 0.5, True, False)  # one of two FAIL_TO_PASS
    gated = evaluate(TASK, BASE, {**BASE, "calc/ops.py": FIXED.replace("return -a", "return a")})
    assert (gated.score, gated.f2p, gated.p2p_ok) == (0.0, 1.0, False)  # a PASS_TO_PASS broke: 0
    # an edit to the tests is ignored: the instance's own test files are what runs
    cheat = evaluate(TASK, BASE, {**BASE, "tests/test_ops.py": "def test_add():\n    pass\n"})
    assert cheat.score == 0.0
    hang = evaluate(TASK, BASE, {**BASE, "calc/ops.py": FIXED.replace("return a + b", "while True:\n        pass")},
                    per_test=1)
    assert hang.score == 0.0


# Reward hacks a policy could learn: each leaves the bug unfixed; before, each scored 1.0
ALWAYS_EQUAL = ("class _Any:\n    def __eq__(self, other):\n        return True\n\n    __hash__ = object.__hash__\n\n\n"
                + BUGGY.replace("    return a - b", "    return _Any()"))
COMPILE_SWAP = ("import builtins, re\n_compile = builtins.compile\n\n\n"
                "def compile(src, *a, **k):  # every test's asserts become `pass`\n"
                "    if isinstance(src, str) and 'def test' in src:\n"
                "        src = re.sub(r'assert [^\\n]*', 'pass', src)\n"
                "    return _compile(src, *a, **k)\n\n\nbuiltins.compile = compile\n")
REPORTER_HUNT = ("import gc, sys\n_IDS = ['tests/test_ops.py::' + t for t in ('test_add', 'test_add_neg', 'test_neg', "
                 "'test_add_zero')]\n\n\ndef _forge():\n    f = sys._getframe()\n    while f is not None:  # the frames\n"
                 "        rep = f.f_locals.get('report')\n        if callable(rep):\n"
                 "            [rep(t, True) for t in _IDS]\n        f = f.f_back\n"
                 "    for o in gc.get_objects():  # and everything alive\n"
                 "        if callable(o) and getattr(o, '__name__', '') in ('report', 'emit'):\n"
                 "            try:\n                [o(t, True) for t in _IDS]\n            except Exception:\n"
                 "                pass\n\n\n_forge()\n")
WITH_STDLIB = {**WITH_TESTS, "tests/test_ops.py": WITH_TESTS["tests/test_ops.py"].replace(
    "def test_add():\n    assert add(2, 3) == 5", "def test_add():\n    import fractions\n    assert fractions.Fraction(add(2, 3)) == 5")}
STDLIB_TASK = {**TASK, "test_patch": make_patch(BASE, WITH_STDLIB)}
FRACTIONS = "class Fraction:\n    def __init__(self, *a):\n        pass\n\n    def __eq__(self, other):\n        return True\n"
HACKS = {  # name -> (task, the repository after the "fix")
    "__eq__ always True": (TASK, {**BASE, "calc/ops.py": ALWAYS_EQUAL}),
    "tests.py swaps compile()": (TASK, {**BASE, "tests.py": COMPILE_SWAP, "calc/util.py": "X = 2\n"}),
    "an int subclass equal to everything": (TASK, {**BASE, "calc/ops.py": "class _I(int):\n    def __eq__(self, other):\n"
                                                   "        return True\n\n    __hash__ = int.__hash__\n\n\n"
                                                   + BUGGY.replace("    return a - b", "    return _I(a - b)")}),
    "the reporter found by frames and gc": (TASK, {**BASE, "calc/ops.py": REPORTER_HUNT + BUGGY}),
    "a repository module named like the stdlib one a test uses": (STDLIB_TASK, {**BASE, "fractions.py": FRACTIONS,
                                                                               "calc/util.py": "X = 2\n"}),
}


@pytest.mark.parametrize("hack", list(HACKS))
def test_reward_hacks_do_not_pay(hack):
    task, work = HACKS[hack]
    r = evaluate(task, BASE, work)
    assert (r.score, r.f2p, r.resolved) == (0.0, 0.0, False), (hack, r)
    honest = evaluate(task, BASE, {**work, "calc/ops.py": FIXED})  # the same extras next to the real fix still pass
    assert honest.score == 1.0 or "equal" in hack, (hack, honest)


def test_an_always_equal_fix_earns_nothing_in_the_workflow():
    """Through the env: the writer's always-equal "fix" applies, the validator accepts it; neither
    is paid (before: every turn reward 1.0, resolved)."""
    edit = ("calc/ops.py\n<<<<<<< SEARCH\n" + BUGGY.rstrip("\n") + "\n=======\n" + ALWAYS_EQUAL.rstrip("\n")
            + "\n>>>>>>> REPLACE\n")
    _, rew, m = play(SWETeamEnv(), TASK, ["The bug is in calc/ops.py.", edit, "Verdict: ACCEPT"])
    assert rew == [1.0, 0.0, 0.0] and m["resolved"] == 0.0 and m["team_reward"] == 0.0 and m["patch_applied"] == 1.0


def test_files_the_runner_imports_as_tests_are_refused():
    """Path rules are about what the runner imports: `tests.py` would be the package `tests`."""
    for path in ("tests.py", "tests/__init__.py", "conftest.py", "test_x.py"):
        block = f"{path}\n<<<<<<< SEARCH\n=======\nX = 1\n>>>>>>> REPLACE\n"
        out, probs = apply_edits(BASE, parse_edits(block)[0], patched_paths(TASK["test_patch"]))
        assert out == BASE and probs and "test" in probs[0], (path, probs)
    env = SWETeamEnv()
    env.reset(TASK)
    env.step("calc/ops.py")
    env.step("--- /dev/null\n+++ b/tests.py\n@@ -0,0 +1 @@\n+import builtins\n")
    assert "NOT applied" in env.history[-1][1] and "tests" in env.history[-1][1]


def test_diff_paths_are_cleaned_once_before_every_rule():
    """`+++ b/./tests.py` was applied under its raw path, past the rule on modules named `tests`, and
    the raw path reached model_patch: a diff's paths are cleaned once, then checked."""
    for alias in ("./tests.py", ".//tests.py", "tests.py/.", "calc/../tests.py", "tests/./test_ops.py"):
        env = SWETeamEnv()
        env.reset(TASK)
        env.step("calc/ops.py")
        env.step(f"--- /dev/null\n+++ b/{alias}\n@@ -0,0 +1 @@\n+import builtins\n")
        assert "NOT applied" in env.history[-1][1] and "tests" in env.history[-1][1], alias
        assert env.work == BASE and env.model_patch() == "", alias
    for escape in ("calc/../../x.py", "./", "calc/..", ".."):
        with pytest.raises(PatchError, match="diff line 2: .* is outside the repository"):
            parse_patch(f"--- /dev/null\n+++ b/{escape}\n@@ -0,0 +1 @@\n+X = 1\n")
    one = make_patch(BASE, {**BASE, "calc/ops.py": FIXED})
    for alias in ("calc/./ops.py", "calc//ops.py", "./calc/ops.py", "calc/ops.py/.", "x/../calc/ops.py"):
        d = one.replace("a/calc/ops.py", f"a/{alias}").replace("b/calc/ops.py", f"b/{alias}")
        assert patched_paths(d) == {"calc/ops.py"} and apply_patch(BASE, d) == {**BASE, "calc/ops.py": FIXED}, alias
        env = SWETeamEnv()
        env.reset(TASK)
        env.step("calc/ops.py")
        env.step(d)
        assert env.work == {**BASE, "calc/ops.py": FIXED} and env.model_patch() == one, alias


def test_the_code_under_test_reaches_the_test_only_through_plain_data():
    """What crosses from the worker: plain data and in-place changes to it; exceptions by class;
    an object of the code under test can be called and read, never compared."""
    tests = ("from calc.ops import add, Box, Bag, sort_in_place, boom\nfrom calc.ops import *\n\n\n"
             "def test_plain():\n    assert add((1,), (2,)) == (1, 2) and add({1}, {2}) == {1, 2} and add(b'a', b'b') == b'ab'\n\n\n"
             "def test_in_place():\n    xs = [3, 1, 2]\n    sort_in_place(xs)\n    assert xs == [1, 2, 3]\n\n\n"
             "def test_object_calls():\n    b = Box(5)\n    assert b.get() == 5 and b.n == 5\n\n\n"
             "def test_dict_subclass_calls():  # a handle here, unlike in code rewards (no plain data asked)\n"
             "    assert Bag().total() == 0\n\n\n"
             "def test_object_compared():\n    assert Box(5) == 5\n\n\n"
             "def test_raises():\n    try:\n        boom()\n    except ValueError as e:\n        assert 'no' in str(e)\n"
             "    else:\n        assert False\n\n\ndef test_star_import():\n    assert Oops is not None and add(1, 1) == 2\n")
    code = ("def add(a, b):\n    return a | b if isinstance(a, set) else a + b\n\n\n"
            "class Box:\n    def __init__(self, n):\n        self.n = n\n\n    def get(self):\n        return self.n\n\n"
            "    def __eq__(self, other):\n        return True\n\n\n"
            "class Bag(dict):\n    def total(self):\n        return sum(self.values())\n\n\n"
            "def sort_in_place(xs):\n    xs.sort()\n\n\nclass Oops(ValueError):\n    pass\n\n\n"
            "def boom():\n    raise Oops('no')\n")
    run = run_tests({"calc/__init__.py": "", "calc/ops.py": code, "tests/test_x.py": tests}, collect=["tests"])
    got = {t.split("::")[1]: ok for t, (ok, _) in run.outcomes.items()}
    assert got == {"test_plain": True, "test_in_place": True, "test_object_calls": True, "test_object_compared": False,
                   "test_raises": True, "test_star_import": True, "test_dict_subclass_calls": True}, run.summary()
    assert "not compare" in run.outcomes["tests/test_x.py::test_object_compared"][1]


def test_forged_results_do_not_pay(tmp_path):
    """A patch that does not fix the bug but attacks the harness: prints fake result lines, replaces
    names in __main__, rewrites the test files on disk, exits early."""
    forge = ("import json, os, sys\n"
             "for t in ('test_add', 'test_add_neg'):\n"
             "    print(json.dumps({'id': 'tests/test_ops.py::' + t, 'passed': True}))\n"
             "m = sys.modules['__main__']\n"
             "for k in list(vars(m)):\n"
             "    if callable(getattr(m, k)):\n"
             "        setattr(m, k, lambda *a, **k: (True, ''))\n"
             "for d, _, ns in os.walk(os.getcwd()):\n"
             "    for n in ns:\n"
             "        if n.startswith('test_'):\n"
             "            open(os.path.join(d, n), 'w').write('def test_add():\\n    pass\\ndef test_add_neg():\\n    pass\\n')\n")
    r = evaluate(TASK, BASE, {**BASE, "calc/ops.py": forge + BUGGY})
    assert r.score == 0.0 and r.f2p == 0.0
    r = evaluate(TASK, BASE, {**BASE, "calc/ops.py": "import os\nos._exit(0)\n" + FIXED})
    assert r.score == 0.0  # no result line: failed


def test_malicious_patch_is_contained(tmp_path):
    """The fix is right, but the module also attacks at import: it returns the right answer only if
    EVERY attack failed, so score 1 means all were contained; the host directory stays untouched."""
    watched = tmp_path / "watched"
    watched.mkdir()
    (watched / "keep.txt").write_text("keep")
    attacks = (f"import os, socket\nWON = []\n"
               f"def _try(name, f):\n    try:\n        f()\n        WON.append(name)\n    except BaseException:\n        pass\n"
               f"_try('write', lambda: open({str(watched / 'pwned')!r}, 'w').write('x'))\n"
               f"_try('delete', lambda: os.remove({str(watched / 'keep.txt')!r}))\n"
               f"_try('etc', lambda: open('/etc/passwd').read())\n"
               f"_try('home', lambda: os.listdir({ROOT!r}))\n"
               f"_try('fork', lambda: os.fork() == 0 and os._exit(0))\n"
               f"_try('net', lambda: socket.create_connection(('1.1.1.1', 53), timeout=1))\n"
               f"_try('local', lambda: socket.create_connection(('127.0.0.1', 22), timeout=1))\n")
    fixed = attacks + FIXED.replace("return a + b", "return a + b if not WON else WON")
    assert evaluate(TASK, BASE, {**BASE, "calc/ops.py": fixed}).score == 1.0
    assert sorted(p.name for p in watched.iterdir()) == ["keep.txt"] and (watched / "keep.txt").read_text() == "keep"
    # the same code run on the host (no sandbox) would have won: the check above can fail
    assert os.path.exists("/etc/passwd") and os.path.isdir(ROOT)
    # a fork bomb and a memory bomb end in the sandbox's limits, scored 0
    for bomb in ("import os\nwhile True:\n    os.fork()\n", "x = ' ' * (8 * 2**30)\n"):
        assert evaluate(TASK, BASE, {**BASE, "calc/ops.py": bomb + FIXED}).score == 0.0


# ---------------------------------------------------------------------------------- scripted teams


def test_perfect_team_scores_one_broken_patch_zero():
    env = SWETeamEnv()
    roles, rew, m = play(env, TASK, [TOOL("grep", text="def add"), "The bug is in calc/ops.py, function add: it subtracts.",
                                     FIX, TOOL("run_tests", path="tests"), "All tests pass. Verdict: ACCEPT"])
    assert roles == ["analyzer", "analyzer", "writer", "validator", "validator"]
    assert rew == [1.0, 1.0, 1.0, 1.0, 1.0] and m["team_reward"] == 1.0 and m["resolved"] == 1.0
    assert m["patch_applied"] == 1.0 and m["files_localised"] == 1.0 and m["iterations"] == 1
    assert "calc/ops.py:1: def add(a, b):" in env.history[1][1] and "2 passed, 0 failed" in env.history[-1][1]
    assert env.model_patch() == make_patch(BASE, {**BASE, "calc/ops.py": FIXED})
    # a broken patch applies but fixes nothing; the validator wrongly accepts it
    broken = FIX.replace("return a + b", "return a * b")
    _, rew, m = play(SWETeamEnv(), TASK, ["calc/ops.py add", broken, "Verdict: ACCEPT"])
    assert rew == [1.0, 0.0, 0.0] and m["team_reward"] == 0.0 and m["patch_applied"] == 1.0
    # an analyzer that names every file is paid less than one that names the right one
    _, rew, m = play(SWETeamEnv(), TASK, ["calc/ops.py calc/util.py calc/__init__.py", FIX, "Verdict: ACCEPT"])
    assert rew[0] == pytest.approx(1 / 3) and m["files_localised"] == 1.0
    # a file is named by its path or its (unique) base name as a whole word, not inside a longer name
    for diagnosis, want in [("fix `ops.py`", 1.0), ("in calc/ops.py:3", 1.0), ("see tests/test_ops.py", 0.0),
                            ("see othercalc/ops.pyx", 0.0), ("the add function", 0.0)]:
        _, rew, _ = play(SWETeamEnv(), TASK, [diagnosis, FIX, "Verdict: ACCEPT"])
        assert rew[0] == want, diagnosis


def test_refinement_branch_and_unapplied_edits():
    env = SWETeamEnv(max_refinement_iterations=2)
    broken = FIX.replace("return a + b", "return a * b")
    roles, rew, m = play(env, TASK, ["Look at calc/ops.py", broken, TOOL("python", code="from calc import add; print(add(2, 3))"),
                                     "Verdict: REJECT add(2, 3) printed 6", FIX.replace("a - b", "a * b"), "Verdict: ACCEPT"])
    assert roles == ["analyzer", "writer", "validator", "validator", "writer", "validator"]
    assert rew == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0] and m["team_reward"] == 1.0 and m["iterations"] == 2
    assert env.history[3][1] == "6"  # the python tool ran the patched repository
    assert "Verdict: REJECT add(2, 3) printed 6" in env._turn("writer").messages[1]["content"]  # feedback reached the writer
    # edits that do not apply: SEARCH not in the file, a test file, outside the repository; the
    # validator is right to reject each (a reply with no verdict acts as REJECT but earns nothing),
    # and after max_refinement_iterations the episode ends
    bad = [FIX.replace("return a - b", "return a ** b"), FIX.replace("calc/ops.py", "tests/test_ops.py"),
           FIX.replace("calc/ops.py", "../../../tmp/evil.py")]
    roles, rew, m = play(SWETeamEnv(max_refinement_iterations=2), TASK,
                         ["no idea", bad[0], "Verdict: REJECT", bad[1], "REJECT", bad[2], "nothing changed"])
    assert rew == [0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0] and m["patch_applied"] == 0.0 and m["iterations"] == 3
    assert m["team_reward"] == 0.0 and m["accepted"] == 0.0 and m["validator_correct"] == pytest.approx(2 / 3)


def test_tools_stay_inside_the_repository():
    env = SWETeamEnv(max_analyzer_calls=9)
    env.reset(TASK)
    obs = lambda reply: (env.step(reply), env.history[-1][1])[1]
    assert obs(TOOL("list_files", path="calc")) == "calc/__init__.py\ncalc/ops.py\ncalc/util.py"
    assert obs(TOOL("read_file", path="calc/ops.py", start="3", end="3")) == "   3|     return a - b"
    assert obs(TOOL("read_file", path="../../../etc/passwd")).startswith("error: no file")
    assert obs(TOOL("read_file", path="/etc/passwd")).startswith("error: no file")
    assert obs(TOOL("grep", text="return", path="calc/ops.py")) == "calc/ops.py:3: return a - b\ncalc/ops.py:7: return -a"
    assert obs("Action: rm[-rf /]").startswith("error: unknown tool")
    env = SWETeamEnv()
    env.reset(TASK)
    env.step("calc/ops.py")
    env.step(FIX)
    assert "[exit code 1]" in env._use_tool("validator", TOOL("python", code="print(open('/etc/passwd').read())"))
    assert "2 passed" in env._use_tool("validator", TOOL("run_tests", path="tests/test_ops.py"))
    assert "no file or directory" in env._use_tool("validator", TOOL("run_tests", path="../"))


def test_truncated_episode_still_scores():
    """The driver may stop an episode at any turn (max_turns, max_model_len): rewards and metrics
    must come out for the turns made so far."""
    env = SWETeamEnv()
    env.reset(TASK)
    env.step(TOOL("grep", text="add"))
    assert env.turn_rewards() == [0.0] and env.metrics()["team_reward"] == 0.0
    env.step("calc/ops.py")
    env.step(FIX)
    assert env.turn_rewards() == [1.0, 1.0, 1.0] and env.metrics()["resolved"] == 1.0


# ---------------------------------------------------------------------------------- data


def test_shipped_instances_load_and_a_gold_patch_resolves():
    train_rows, val_rows = load_swe(os.path.join(ROOT, "data/swe_train.jsonl")), load_swe(os.path.join(ROOT, "data/swe_val.jsonl"))
    assert len(train_rows) >= 150 and len(val_rows) >= 30
    assert os.path.getsize(os.path.join(ROOT, "data/swe_train.jsonl")) + os.path.getsize(os.path.join(ROOT, "data/swe_val.jsonl")) < 2.5e6
    src = lambda rows: {r["source"] for r in rows}
    assert not src(train_rows) & src(val_rows)  # disjoint problems
    bodies = lambda rows: {t for r in rows for p, t in r["repo_files"].items() if p.count("/") == 1 and
                           not is_test_path(p) and not p.endswith("__init__.py")}
    assert not bodies(train_rows) & bodies(val_rows)  # no function's code on both sides, bystanders included
    assert len({r["instance_id"] for r in train_rows + val_rows}) == len(train_rows) + len(val_rows)
    assert {r["bug_kind"] for r in train_rows} == {"off_by_one", "wrong_operator", "swapped_arguments", "missing_edge_case"}
    for task in (train_rows[0], val_rows[-1]):
        base = repo_files(task)
        gold = apply_patch(base, task["patch"])
        assert evaluate(task, base, gold).resolved
        assert evaluate(task, base, base, force=True).f2p == 0.0
        assert task["FAIL_TO_PASS"] and all(t.split("::")[0] in patched_paths(task["test_patch"]) for t in task["FAIL_TO_PASS"])
        # a perfect team, scripted from the gold patch, resolves it through the whole workflow
        gold_file = sorted(patched_paths(task["patch"]))[0]
        blocks = "".join(f"{gold_file}\n<<<<<<< SEARCH\n" + "\n".join(a) + "\n=======\n" + "\n".join(b) + "\n>>>>>>> REPLACE\n"
                         for _, _, hunks in parse_patch(task["patch"]) for _, a, b in hunks)
        _, rew, m = play(SWETeamEnv(), task, [f"The bug is in {gold_file}.", blocks, "Verdict: ACCEPT"])
        assert rew == [1.0, 1.0, 1.0] and m["resolved"] == 1.0
        # the issue shows the call and what it returned, not the fix
        assert "```python" in task["problem_statement"] and task["patch"] not in task["problem_statement"]


def test_generator_is_deterministic():
    a = generate(seed=3, limit=4, val_frac=0.25)
    assert a[0] and a[1] and not {r["source"] for r in a[0]} & {r["source"] for r in a[1]}
    # each split again, alone: the same rows (the generator is deterministic, and a split does not need the other)
    assert generate(seed=3, limit=4, val_frac=0.25, only="train") == (a[0], [])
    assert generate(seed=3, limit=4, val_frac=0.25, only="val") == ([], a[1])


def test_loader_checks_rows_and_reads_git_checkouts(tmp_path):
    good = {k: TASK[k] for k in ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
                                 "FAIL_TO_PASS", "PASS_TO_PASS", "repo_files")}
    f = tmp_path / "x.jsonl"
    f.write_text(json.dumps({**good, "FAIL_TO_PASS": json.dumps(good["FAIL_TO_PASS"])}) + "\n")
    assert load_swe(str(f))[0]["FAIL_TO_PASS"] == TASK["FAIL_TO_PASS"]  # SWE-bench's JSON-string lists
    for bad, msg in [({"patch": 3}, "x.jsonl:1: field 'patch' must be a non-empty string"),
                     ({"patch": "no diff"}, "x.jsonl:1: field 'patch' is not a unified diff"),
                     ({"FAIL_TO_PASS": []}, "field 'FAIL_TO_PASS' is empty"),
                     ({"PASS_TO_PASS": [1]}, "field 'PASS_TO_PASS' must be a list of test ids"),
                     ({"repo_files": {"../x.py": ""}}, "'../x.py' is not a plain relative path"),
                     ({"repo_files": None}, "field 'repo_files' must be")]:
        f.write_text(json.dumps(good) + "\n" + json.dumps({**good, "instance_id": "b", **bad}) + "\n")
        with pytest.raises(DataError, match=msg.replace("x.jsonl:1", "x.jsonl:2")):
            load_swe(str(f))
    row = {k: v for k, v in good.items() if k != "repo_files"}
    f.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match="x.jsonl:1: no repository"):
        load_swe(str(f))
    # a local git checkout: REPOS_DIR/<owner>__<name>, at base_commit; later commits do not leak in
    repo = tmp_path / "repos" / "me__calc"
    for path, text in BASE.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    sha = git("rev-parse", "HEAD")
    (repo / "calc/ops.py").write_text(FIXED)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "fix")
    f.write_text(json.dumps({**row, "base_commit": sha}) + "\n")
    task = load_swe(f"{f}@{tmp_path / 'repos'}")[0]
    assert repo_files(task) == BASE and task["repo_dir"] == str(repo)
    _, rew, m = play(SWETeamEnv(), task, ["calc/ops.py", FIX, "Verdict: ACCEPT"])
    assert m["resolved"] == 1.0
    f.write_text(json.dumps({**row, "base_commit": "f" * 40}) + "\n")
    with pytest.raises(DataError, match="x.jsonl:1: field 'base_commit'"):
        load_swe(f"{f}@{tmp_path / 'repos'}")
    f.write_text(json.dumps({**row, "repo": "me/other"}) + "\n")
    with pytest.raises(DataError, match="x.jsonl:1: field 'repo': no git checkout of 'me/other'"):
        load_swe(f"{f}@{tmp_path / 'repos'}")


def test_loader_refuses_tests_that_could_never_pass(tmp_path):
    """A FAIL_TO_PASS id in a file that is not in the repository (nor added by test_patch), or not a
    test file, used to load and could never score."""
    good = {k: TASK[k] for k in ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
                                 "FAIL_TO_PASS", "PASS_TO_PASS", "repo_files")}
    f = tmp_path / "x.jsonl"
    for field, ids, msg in [("FAIL_TO_PASS", ["tests/test_nope.py::test_add"], "'tests/test_nope.py', which is neither"),
                            ("PASS_TO_PASS", ["test_neg (calc.tests.OpsTests)"], "neither in the repository"),
                            ("FAIL_TO_PASS", ["calc/ops.py::test_add"], "'calc/ops.py', which the test runner does not run")]:
        f.write_text(json.dumps(good) + "\n" + json.dumps({**good, "instance_id": "b", field: ids}) + "\n")
        with pytest.raises(DataError, match=rf"x\.jsonl:2: field '{field}': .*{msg}"):
            load_swe(str(f))
    f.write_text(json.dumps({**good, "FAIL_TO_PASS": ["tests/test_ops.py::test_add"]}) + "\n")  # added by test_patch
    assert load_swe(str(f))[0]["FAIL_TO_PASS"] == ["tests/test_ops.py::test_add"]


# ---------------------------------------------------------------------------------- training


def test_tiny_model_trains_two_steps(tmp_path):
    cfg = load_config_file(os.path.join(ROOT, "configs", "tiny_swe.py"))
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, resume="none", output_dir=str(tmp_path / "run")))
    metrics = train.main(cfg)
    rows = [json.loads(ln) for ln in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 2]  # two train steps and the final eval
    for r in ("analyzer", "writer", "validator"):
        assert any(k.startswith(f"train/reward/{r}") for k in rows[0]), r
    for k in ("train/resolved_rate", "train/patch_applied_rate", "train/files_localised", "train/iterations",
              "train/tokens/writer", "val/team_reward"):
        assert k in rows[0] or k in rows[-1], k
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for r in rows for k, v in r.items() if k != "step")
    assert metrics
