"""Nothing a model writes can crash or stall training: every reply parser
and every workflow's `step`.

Replies are at most ~1024 tokens (4-8 kB); every hostile reply here is >= 32 kB (4x that, and
more) of the shapes that break regexes and number parsing: long runs of one character, a phrase a
parser looks for followed by 32k spaces, 10k-deep nesting, 5000-digit integers (past Python's
4300-digit int-from-str limit), NUL bytes, lone surrogates. Every parser gets every input and must
return its type, without raising, within a generous budget of this process's CPU time (a SIGPROF
interrupts a stuck regex, so a regression fails here in seconds instead of hanging the suite; CPU
time, not wall time, so a loaded machine does not fail it: a sandbox or worker subprocess it waits
for is not counted; the measured worst cases are milliseconds: `python bench/hostile_parsers.py`
prints them). Before the fix,
"Verdict" + 1000 spaces took 20 s in parse_verdict and "The answer is" + 2000 spaces + "x$ y"
60 s in extract_answer (both cubic), and parse_query("Query: ") raised IndexError.

A later search found a shape the set missed: a marker, one character, a long blank run, one more
character. "<tool_call>a" + 64k spaces + "b" took 53 s in parse_tool_call (a lazy `.*?` followed by
`\s*` and an alternative backtracks over every blank), and the research env's step inherited it;
2000 one-line hunks against a 20k-line file took 12-31 s in envs/swe.apply_patch. So every marker any
parser looks for (MARKERS) now comes in that shape, with newlines, and repeated; every workflow's
`step` is fuzzed with the whole set (each step under STEP_BOUND_S CPU seconds) and with 1 MB replies
of the shapes that were slow (a step should take ~1 s; the bound is generous, and `python
bench/hostile_parsers.py` prints the measured wall times).
"""
from __future__ import annotations

import math
import random
import re
import time
from pathlib import Path

import pytest

from agents import swe_team
from agents.math_team import parse_verdict
from agents.research_team import clean_doc_id, parse_citations, parse_plan, parse_report
from agents.search_team import MAX_QUERY_CHARS, parse_answer, parse_query
from agents.tool_agent import read_final
from envs.debate import DebateEnv, parse_pick
from envs import split_info
from envs.split_info import SplitInfoEnv, SplitInfoSingleEnv
from envs.reason_code import ReasonCodeEnv
from envs.code_team import CodeTeamEnv, complete_code
from envs.math_3agent import MathTeamEnv
from envs.math_single import MathSingleEnv
from envs.math_tool import MathToolEnv, plan_expression, plan_right
from envs.swe import PatchError, SWETeamEnv, apply_edits, apply_patch
from runtime.tools import ANSWER, CALCULATOR, PYTHON, ToolCall, calculate, parse_tool_call
from envs.toy import ToyEnv
from helpers import bounded
from rewards import qa
from rewards.code import extract_code
from rewards.math import TIMEOUT_S, _answer_is, _last_boxed, extract_answer, is_equiv, math_reward, normalize

N = 32 * 1024  # 4x the longest configured reply, rounded up
BIG = "7" * 5000  # past int("...")'s 4300-digit limit


def _rep(unit: str, n: int = N) -> str:
    return (unit * (n // len(unit) + 1))[:n]


def _random_text(seed: int, alphabet: str) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(N))


# name -> generator of one hostile reply (>= 32 kB each)
HOSTILE = {
    "tool call: name is a list": lambda: '<tool_call>{"name": ["calculator"], "arguments": {}}</tool_call>' + " " * N,
    "tool call: 100k-deep JSON": lambda: "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>",
    "tool call: 5000-digit integer": lambda: _rep('<tool_call>{"name": "calculator", "arguments": {"expression": '
                                                  + BIG + "}}</tool_call>"),
    "tool call + 64k spaces": lambda: "<tool_call>" + " " * (2 * N),
    "Action + spaces": lambda: "Action:" + " " * N + "calculator[" + " " * N,
    "Action Input + spaces": lambda: "Action: calculator\nAction Input:" + " " * N + "x" + " " * N,
    "fenced json + spaces": lambda: "```json\n{" + " " * N + '"name"' + " " * N,
    "calculator: huge power": lambda: _rep("9**9**9**9 "),
    "spaces": lambda: " " * N,
    "newlines": lambda: "\n" * N,
    "mixed whitespace": lambda: _rep(" \t\r\n\x0b\x0c\u00a0\u2028"),
    "Verdict + spaces": lambda: "Verdict" + " " * N,
    "Verdict + spaces + is + spaces + x": lambda: "Verdict" + " " * N + "is" + " " * N + "x",
    "Verdict: the solution is + spaces": lambda: "Verdict:" + " " * N + "the solution is" + " " * N + "x",
    "verdict repeated": lambda: _rep("verdict is the solution is "),
    "not + spaces": lambda: "not" + " " * N + "x",
    "The answer is + spaces + x$ y": lambda: "The answer is" + " " * N + "x$ y",
    "the answer is repeated": lambda: _rep("the answer is "),
    "answer is $x$ y repeated": lambda: _rep("The answer is $x$ y "),
    "answer is repeated + $ $y": lambda: _rep("answer is ") + "$ $y",
    "answer is + colons": lambda: "The answer is" + ":" * N + "\n",
    "answer is + dots": lambda: "The answer is" + " ." * (N // 2),
    "answer is x$ + spaces, repeated": lambda: _rep("answer is x$" + " " * 500 + "y\n"),
    "answer is + 5000 digits": lambda: _rep("The answer is " + BIG + ".\n"),
    "digits": lambda: "9" * N,
    "boxed 5000-digit": lambda: _rep("\\boxed{" + BIG + "} "),
    "#### 5000-digit": lambda: _rep("#### -" + BIG + "\n"),
    "#### + spaces": lambda: "####" + " " * N,
    "#### + newlines": lambda: "####" + "\n" * N,
    "hashes": lambda: "#" * N,
    "boxed nested 10k, balanced": lambda: "\\boxed{" * 10_000 + "1" + "}" * 10_000,
    "boxed nested 10k, unbalanced": lambda: "\\boxed{" * 10_000 + "1",
    "boxed + open braces": lambda: "\\boxed{" + "{" * N,
    "boxed + spaces, no brace": lambda: "\\boxed" + " " * N,
    "open braces": lambda: "{" * N,
    "close braces": lambda: "}" * N,
    "text{ nested": lambda: "\\boxed{" + "\\text{" * 5000 + "}" * 4999,
    "frac nesting": lambda: "\\boxed{" + "\\frac{1}{" * 4000 + "2" + "}" * 4001,
    "dollars": lambda: "$" * N,
    "dollar space": lambda: _rep("$ "),
    "backslashes": lambda: "\\" * N,
    "thousands commas": lambda: "\\boxed{" + _rep("1,000,") + "}",
    "unicode digits": lambda: "\\boxed{" + "\u0663" * N + "}",
    "Query + spaces": lambda: "Query" + " " * N + "x",
    "Query: + spaces": lambda: "Query:" + " " * N,
    "Query: + newlines": lambda: "Query:" + "\n" * N,
    "Query: repeated": lambda: _rep("Query: "),
    "Answer: + spaces": lambda: "Answer:" + " " * N,
    "search + spaces": lambda: "search" + " " * N + "x",
    "a an the": lambda: _rep("a an the "),
    "punctuation": lambda: _rep("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    "NUL bytes": lambda: "\x00" * N,
    "NUL mixed": lambda: _rep("\\boxed{\x00} answer is \x00 Verdict: \x00 Query: \x00 Answer: \x00\n"),
    "lone surrogates": lambda: "\ud800" * N,
    "surrogates mixed": lambda: _rep("\\boxed{\udfff} The answer is \ud800$ Verdict \udc00 Query: \ud83d\n"),
    "random latex": lambda: _random_text(0, "0123456789{}\\$^_ ()[],.#:\nxboxed"),
    "random printable": lambda: _random_text(1, "".join(map(chr, range(32, 127))) + "\n\t"),
}

# what any parser looks for (agents/, rewards/, runtime/tools.py, envs/swe.py): each in the shape that
# backtracks (marker + a + blanks + b: the lazy-then-blanks regex), with newlines, and repeated
MARKERS = ("<tool_call>", "</tool_call>", "```json\n{", "```", '"name":', "Action:", "Action: calculator[",
           "Action: calculator\nAction Input:", "[", "]", "\\boxed{", "####", "The answer is", "Verdict:", "verdict",
           "not", "$", "Query:", "Answer:", "Search again", "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE",
           "--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1 +1 @@\n", "@@", "ACCEPT", "```diff\n", "```python\n",
           "def add(", "Sub-question 1:", "1.", "Citations:", "[doc", "search[", "read_doc[", "note[", "id:", "?",
           "\\", "{", "}", "(", '"', ":")
for _k in MARKERS:
    HOSTILE[f"{_k!r} + a + spaces + b"] = lambda k=_k: k + "a" + " " * N + "b"
    HOSTILE[f"{_k!r} + a + newlines + b"] = lambda k=_k: k + "a" + "\n" * N + "b"
    HOSTILE[f"({_k!r} + a) repeated"] = lambda k=_k: _rep(k + "a ")


def _kind(*types):
    return lambda r: isinstance(r, types)


# name -> (call on one hostile text, check of the result); internal helpers too, since a reply
# reaches each of them whole
PARSERS = {
    "parse_verdict": (parse_verdict, lambda r: r is None or isinstance(r, bool)),
    "parse_query": (parse_query, lambda r: isinstance(r, str) and len(r) <= MAX_QUERY_CHARS),
    "parse_answer": (parse_answer, _kind(str, type(None))),
    "extract_answer": (extract_answer, _kind(str, type(None))),
    "_last_boxed": (_last_boxed, _kind(str, type(None))),
    "_answer_is": (_answer_is, _kind(str, type(None))),
    "normalize": (normalize, _kind(str)),
    "is_equiv": (lambda s: is_equiv(s, "1"), _kind(bool)),
    "math_reward(reply)": (lambda s: math_reward(s, "1"), lambda r: r in (0.0, 1.0)),
    "math_reward(gold)": (lambda s: math_reward("\\boxed{1}", s), lambda r: r in (0.0, 1.0)),
    "qa.normalize_answer": (qa.normalize_answer, _kind(str)),
    "qa.exact_match": (lambda s: qa.exact_match(s, "Paris"), lambda r: r in (0.0, 1.0)),
    "qa.f1": (lambda s: qa.f1(s, "the city of Paris"), lambda r: isinstance(r, float) and 0.0 <= r <= 1.0),
    "parse_tool_call": (lambda s: parse_tool_call(s, [CALCULATOR, PYTHON, ANSWER]), _kind(ToolCall, str, type(None))),
    "calculate": (calculate, _kind(str)),
    "calculate(short)": (lambda s: calculate(s[:150]), _kind(str)),
    "swe parse_edits": (swe_team.parse_edits, lambda r: isinstance(r, tuple) and len(r) == 2),
    "swe extract_diff": (swe_team.extract_diff, _kind(str, type(None))),
    "swe parse_verdict": (swe_team.parse_verdict, _kind(bool, type(None))),
    "swe apply_patch": (lambda s: _patched(apply_patch, s), _kind(dict, str)),
    "swe apply_edits": (lambda s: apply_edits(REPO, swe_team.parse_edits(s)[0], set()), _kind(tuple)),
    "parse_plan": (parse_plan, _kind(list)),
    "parse_report": (parse_report, _kind(tuple)),
    "parse_citations": (parse_citations, _kind(list)),
    "clean_doc_id": (clean_doc_id, _kind(str)),
    "read_final": (read_final, _kind(str, type(None))),
    "debate parse_pick": (lambda s: parse_pick(s, 2), lambda r: r in (None, 0, 1)),
    "extract_code": (extract_code, _kind(str)),
    "plan_expression": (plan_expression, _kind(str, type(None))),
    "split_info parse_answer": (split_info.parse_answer, _kind(str, type(None))),
    "split_info carries": (lambda s: split_info.carries(s, ["Vela", "5"]), _kind(bool)),
    "plan_right": (lambda s: plan_right(s, "3"), _kind(bool)),
    "complete_code": (lambda s: complete_code(s, {"prompt": "def add(a, b):\n", "entry_point": "add"}), _kind(str)),
}
REPO = {"calc/__init__.py": "from .ops import add\n", "calc/ops.py": "def add(a, b):\n    return a - b\n",
        "tests/test_ops.py": "from calc.ops import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"}


def _patched(fn, text):
    try:
        return fn(REPO, swe_team.extract_diff(text) or text)
    except PatchError as e:
        return str(e)

# a deadline, not a speed target: parsers take milliseconds; math_reward may spend its worker's
# whole deadline on one answer plus a worker restart
BOUND_S = {name: 2.0 for name in PARSERS} | {"math_reward(reply)": TIMEOUT_S + 10, "math_reward(gold)": TIMEOUT_S + 10}


def timed(fn, text: str, bound: float, label: str = ""):
    """(result, CPU seconds); pytest.fail when the call uses more than `bound` CPU seconds."""
    t = time.process_time()
    with bounded(bound, label or getattr(fn, "__name__", str(fn))):
        r = fn(text)
    return r, time.process_time() - t


@pytest.fixture(scope="module")
def hostile():
    texts = {name: gen() for name, gen in HOSTILE.items()}
    assert all(len(t) >= N for t in texts.values())
    return texts


def test_hostile_set_has_the_shapes_the_issue_names(hostile):
    for needle in ("Verdict" + " " * 1000, "The answer is" + " " * 2000, "\\boxed{" * 10_000, BIG, "\x00", "\ud800"):
        assert any(needle in t for t in hostile.values()), needle[:20]


@pytest.mark.parametrize("parser", list(PARSERS))
def test_parser_survives_every_hostile_reply(parser, hostile):
    fn, ok = PARSERS[parser]
    math_reward("\\boxed{2\\sqrt{2}}", "\\sqrt{8}")  # start the math-verify worker outside the timing
    for name, text in hostile.items():
        r, _ = timed(fn, text, BOUND_S[parser], f"{parser} on {name!r}")
        assert ok(r), f"{parser} on {name!r} returned {r!r:.80}"


def test_known_regressions_are_fixed_and_linear():
    """The three cases above (parse_verdict, extract_answer, parse_query), at 32k and 128k: the old code took days
    (cubic) or raised."""
    for n in (N, 4 * N):
        assert timed(parse_verdict, "Verdict" + " " * n, 2.0)[0] is None
        assert timed(parse_verdict, "Verdict" + " " * n + ": Incorrect", 2.0)[0] is False
        assert timed(extract_answer, "The answer is" + " " * n + "x$ y", 2.0)[0] is None
        assert timed(extract_answer, "The answer is" + " " * n + "$x$.", 2.0)[0] == "x"
        assert timed(lambda s: math_reward(s, "1"), "The answer is" + " " * n + "x$ y", TIMEOUT_S + 10)[0] == 0.0
    assert parse_query("Query: ") == "" and parse_query("") == "" and parse_query("Query:\n") == ""
    # plan_expression reads 4000 characters: a backtracking pattern took ~2 CPU s on a run of digits or of "("
    # there (quadratic in the run); the possessive one takes about a millisecond
    for shape in ("7" * N, "(" * N, "1 " * N, "(1" * N):
        assert timed(plan_expression, shape, 0.25)[0] is None


def test_parsers_keep_their_meaning():
    """The linear rewrites read what the old regexes read (and a little more)."""
    cases = [("The answer is: $12$.", "12"), ("Thus the answer is 42.", "42"), ("The answer is\n42", "42"),
             ("the answer is 4, so the answer is 5.", "5"), ("answer is $x$ y. The answer is 5.", "5"),
             ("The answer is $\\frac{1}{2}$", "\\frac{1}{2}"), ("The answer is 3.5", "3.5"),
             ("answer is 5 $ .", "5"), ("answer is 5$ y", None), ("The answer is ", None),
             ("\\boxed 5 and {x}", "5"), ("\\boxedx{3}", None), ("#### ", None), ("blah\n#### 72", "72"),
             ("\\boxed{1} \\fbox{2}", "2"), ("x \\boxed {7} y", "7")]
    for text, want in cases:
        assert extract_answer(text) == want, text
    assert parse_answer("Answer: Paris.") == "Paris" and parse_answer("Answer: a\nAnswer: b") == "b"
    assert parse_answer("Search again: x. Answer: y") is None and parse_answer("Answer: .") is None
    assert parse_query('Query: "x y"') == "x y" and parse_query("  \n first line\nsecond") == "first line"
    assert parse_query("Query: a\nQuery:   ") == "a" and len(parse_query("Query: " + "w " * 500)) == MAX_QUERY_CHARS
    assert parse_verdict("Verdict is correct") is True and parse_verdict("verdict = not correct") is False


def test_5000_digit_answers_compare_exactly():
    assert math_reward(f"\\boxed{{{BIG}}}", BIG) == 1.0
    assert math_reward(f"\\boxed{{{BIG}}}", BIG[:-1] + "8") == 0.0
    assert math_reward(f"The answer is {BIG}.", BIG) == 1.0
    assert math_reward("\\boxed{1}", BIG) == 0.0
    assert qa.f1(10 ** 100, "1") == 0.0 and qa.exact_match(None, "") == 1.0


def test_short_garbage_never_raises():
    rng = random.Random(0)
    alphabet = list("0123456789abcxyz+-*/^{}()[]$\\,.: %#\n\x00") + [
        "\\boxed{", "\\fbox", "\\frac", "####", "answer is ", "Answer:", "Query:", "verdict", "not ", "correct",
        "search again", "\ud800", "\u0663"]
    for _ in range(1500):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        for name, (fn, ok) in PARSERS.items():
            if name.startswith("math_reward") or name == "is_equiv":
                continue  # the worker path: covered by test_math's garbage test, 5 s deadline each
            assert ok(fn(s)), (name, s)


# ---------------------------------------------------------------------------------- envs


STEP_BOUND_S = 3.0  # CPU seconds of one env.step on one hostile reply (the aim: ~1 s; bench/hostile_parsers.py)


def _drive(env, task, replies, max_turns=12, label="step"):
    """Play one episode with these replies in turn; each step must use at most STEP_BOUND_S CPU seconds
    of this process (a stuck regex is interrupted, so a regression fails here instead of hanging the
    suite; a sandbox run it waits for is not counted)."""
    from envs import prompts_of
    handed, n = env.reset(task), 0  # n: model turns; a set of prompts handed out at once gets a reply each
    while prompts_of(handed) and n < max_turns:
        said = [replies[(n + j) % len(replies)] for j in range(len(prompts_of(handed)))]
        t = time.process_time()
        with bounded(STEP_BOUND_S + 1, f"{label}, step {n}"):
            handed = env.step(said if isinstance(handed, list) else said[0])
        took = time.process_time() - t
        assert took <= STEP_BOUND_S, f"{label}, step {n} ({[p.role for p in prompts_of(handed)]}) took {took:.2f} CPU s"
        n += len(said)
    assert not prompts_of(handed), "the episode did not end"
    rewards, metrics = env.turn_rewards(), env.metrics()
    assert len(rewards) == n and all(isinstance(r, float) and math.isfinite(r) for r in rewards)
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in metrics.values())
    return rewards


ENVS = {
    "math_3agent": lambda: MathTeamEnv(max_refinement_iterations=1),
    "math_single": MathSingleEnv,
}


@pytest.mark.parametrize("env", list(ENVS))
def test_math_envs_never_raise_on_hostile_replies(env, hostile):
    task = {"question": "What is 2 + 3?", "answer": "5"}
    texts = list(hostile.values())
    for i, text in enumerate(texts):
        # hostile everywhere, and hostile mixed with replies that move the episode on (refinements)
        with bounded(4 * (TIMEOUT_S + 10), f"{env} on {list(hostile)[i]!r}"):
            _drive(ENVS[env](), task, [text])
            _drive(ENVS[env](), task, [text, "Verdict: Incorrect", texts[(i + 1) % len(texts)], text])


def test_search_env_never_raises_on_hostile_replies(hostile):
    pytest.importorskip("bm25s")
    from envs.search_team import SearchTeamEnv
    task = {"question": "In which country is the city of Vorla?", "answer": "Kalomi", "support": ["city0_0"]}
    texts = list(hostile.values())
    for i, text in enumerate(texts):
        with bounded(4 * (TIMEOUT_S + 10), f"search on {list(hostile)[i]!r}"):
            _drive(SearchTeamEnv(max_refinement_iterations=2), task, [text])
            _drive(SearchTeamEnv(max_refinement_iterations=2), task,
                   [text, "Search again: more", "Query: " + text, texts[(i + 3) % len(texts)]])


MATH_TASK = {"question": "What is 2 + 3?", "answer": "5"}
SPLIT_TASK = {"question": "How many coins do Vela and Tomi have together?", "answer": "13", "work": "5 + 8 = 13",
              "facts": ["Vela has 5 coins.", "Tomi has 8 coins."], "facts_a": [0], "facts_b": [1], "needed": [0, 1],
              "keys": [["Vela", "5"], ["Tomi", "8"]]}
CODE_TASK = {"prompt": "def add(a, b):\n", "tests": ["assert add(1, 2) == 3"], "entry_point": "add", "question": "add"}
BIG_FILE = "".join(f"x{i} = {i}\n" for i in range(20_000))  # 20k lines: apply_patch's nearest-match scan


def _swe_task(big: bool = False):
    from envs.swe import make_patch
    base = {**REPO, "calc/big.py": BIG_FILE} if big else dict(REPO)
    tests = {**base, "tests/test_ops.py": base["tests/test_ops.py"] + "\n\ndef test_add2():\n    assert add(1, 1) == 2\n"}
    return {"instance_id": "calc-1", "repo": "me/calc", "base_commit": "0" * 40, "repo_files": base,
            "problem_statement": "add(2, 3) returns -1", "patch": make_patch(base, {**base, "calc/ops.py": "def add(a, b):\n"
                                                                                   "    return a + b\n"}),
            "test_patch": make_patch(base, tests), "FAIL_TO_PASS": ["tests/test_ops.py::test_add2"],
            "PASS_TO_PASS": []}


def _research():
    from envs.research import ResearchEnv
    return ResearchEnv(max_sub_questions=2, max_rounds=2)


def _react(style, tools, reward="math"):
    from envs.react import ToolAgentEnv
    return lambda: ToolAgentEnv(style, tools, reward=reward)


# every built-in workflow (config.py's list): name -> (make env, task, every k-th hostile reply). The
# math and search envs have their own tests above (every reply, twice); envs whose step runs the
# reply in the sandbox take a sample (such a step costs a sandbox start, not parsing time)
WORKFLOWS = {
    "toy": (ToyEnv, {"question": "Say something.", "answer": ""}, 1),
    "math_single": (MathSingleEnv, MATH_TASK, 0),
    "math_3agent": (lambda: MathTeamEnv(max_refinement_iterations=1), MATH_TASK, 0),
    "math_tool": (lambda: MathToolEnv(max_refinement_iterations=1), MATH_TASK, 8),
    "code": (lambda: CodeTeamEnv(max_refinement_iterations=1), CODE_TASK, 32),
    "search": (None, {"question": "In which country is the city of Vorla?", "answer": "Kalomi", "support": ["city0_0"]}, 0),
    "react": (_react("react", ("calculator", "search")), MATH_TASK, 1),
    "react (code)": (_react("code", ("python",), "code"), CODE_TASK, 32),
    "research": (_research, {"question": "In which country was the founder of Zorblax born?", "answer": "Kalomi",
                             "support": ["company0", "person0", "country0"]}, 2),
    "swe": (lambda: SWETeamEnv(max_analyzer_calls=1, max_validator_calls=1, max_refinement_iterations=1), None, 3),
    "video_qa": (None, None, 1),
    "debate": (lambda: DebateEnv(candidates=3, rounds=2), MATH_TASK, 1),
    "split_info": (lambda: SplitInfoEnv(max_rounds=3), SPLIT_TASK, 1),
    "split_info_single": (lambda: SplitInfoSingleEnv(turns=2), SPLIT_TASK, 1),
    "reason_code": (lambda: ReasonCodeEnv(max_rounds=2), MATH_TASK, 2),
}


def _workflow(name):
    make, task, every = WORKFLOWS[name]
    if name in ("search", "research", "react"):
        pytest.importorskip("bm25s")
    if name == "search":
        from envs.search_team import SearchTeamEnv
        make = lambda: SearchTeamEnv(max_refinement_iterations=1)  # noqa: E731
    if name == "video_qa":  # captioner, grapher and organizer each read the hostile reply
        from envs.video_qa import VideoQAEnv, load_tasks
        return VideoQAEnv, load_tasks(str(Path(__file__).resolve().parent.parent / "data" / "video_val.jsonl"))[0], every
    return make, task if task is not None else _swe_task(), every


def test_every_builtin_workflow_is_fuzzed():
    from workflows import BUILTINS
    assert set(BUILTINS) == {n.split(" ")[0] for n in WORKFLOWS}


@pytest.mark.parametrize("name", [n for n, (_, _, every) in WORKFLOWS.items() if every])
def test_every_workflow_step_is_fast_on_hostile_replies(name, hostile):
    """Each hostile reply as every turn of an episode; every step within STEP_BOUND_S."""
    make, task, every = _workflow(name)
    math_reward("\\boxed{2\\sqrt{2}}", "\\sqrt{8}")  # the math-verify worker starts outside the timing
    for text_name in list(hostile)[::every]:
        _drive(make(), task, [hostile[text_name]], label=f"{name} on {text_name!r}")


MB = 2 ** 20
# the shapes that were once slow, at 1 MB (far more than any reply a role's token budget allows)
SLOW_BEFORE = {
    "<tool_call>a + 1 MB of spaces + b": lambda: "<tool_call>a" + " " * MB + "b",
    "<tool_call>a + 1 MB of newlines + b": lambda: "<tool_call>a" + "\n" * MB + "b",
    "Action: a + 1 MB of spaces + b": lambda: "Action: a" + " " * MB + "b",
    "Action Input: a + 1 MB of spaces + b": lambda: "Action: calculator\nAction Input:a" + " " * MB + "b",
    "```json { repeated to 1 MB": lambda: _rep("```json\n{", MB),
    "Action: calculator[ repeated to 1 MB": lambda: _rep("Action: calculator[", MB),
}


@pytest.mark.parametrize("name", list(WORKFLOWS))
def test_1mb_replies_keep_every_step_within_budget(name):
    make, task, every = _workflow(name)
    math_reward("\\boxed{2\\sqrt{2}}", "\\sqrt{8}")
    for text_name, gen in list(SLOW_BEFORE.items())[::3 if every > 8 else 2 if every > 1 else 1]:
        text = gen()
        assert len(text) >= MB
        _drive(make(), task, [text], label=f"{name} on {text_name!r}")


def test_swe_writer_step_is_linear_in_the_patch():
    """2000 one-line hunks against a 20k-line file (12-31 s before), as a diff and as edit blocks."""
    task = _swe_task(big=True)
    hunks = "".join(f"@@ -{i + 1},1 +{i + 1},1 @@\n-x{i} = {i}\n+x{i} = {i + 1}\n" for i in range(0, 20_000, 10))
    diff = "--- a/calc/big.py\n+++ b/calc/big.py\n" + hunks
    blocks = "".join(f"calc/big.py\n<<<<<<< SEARCH\nx{i} = {i}\n=======\nx{i} = {i + 1}\n>>>>>>> REPLACE\n"
                     for i in range(0, 20_000, 10))
    for reply in (diff, "```diff\n" + diff + "```", blocks, blocks.replace(" = ", " =  ")):
        env = SWETeamEnv(max_analyzer_calls=0)
        env.reset(task)
        env.step("calc/big.py")
        t = time.process_time()
        with bounded(STEP_BOUND_S + 1, "writer step"):
            env.step(reply)
        assert time.process_time() - t <= STEP_BOUND_S
    assert env.history[-1][1].startswith("NOT applied") and "at most" in env.history[-1][1]  # 2000 blocks: too many
    env = SWETeamEnv(max_analyzer_calls=0)
    env.reset(task)
    env.step("calc/big.py")
    env.step(diff)
    assert env.work["calc/big.py"].count("\n") == 20_000 and "x10 = 11\n" in env.work["calc/big.py"]


def test_the_cpu_budget_interrupts_a_stuck_regex_and_ignores_waiting():
    """bounded() counts this process's CPU time: a catastrophic regex is stopped; a sleep (a process
    waiting on a sandbox, or on a loaded machine's scheduler) is not counted."""
    with pytest.raises(pytest.fail.Exception, match="still running"):
        with bounded(0.2, "regex"):
            re.match(r"(a*)*b", "a" * 40)
    with bounded(0.2, "sleep"):
        time.sleep(0.5)
