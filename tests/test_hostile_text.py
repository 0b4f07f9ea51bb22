"""Nothing a model writes can crash or stall training (issue 11 §3): math, search and tool-call parsers.

Replies are at most ~1024 tokens (4-8 kB); every hostile reply here is >= 32 kB (4x that, and
more) of the shapes that break regexes and number parsing: long runs of one character, a phrase a
parser looks for followed by 32k spaces, 10k-deep nesting, 5000-digit integers (past Python's
4300-digit int-from-str limit), NUL bytes, lone surrogates. Every parser gets every input and must
return its type, without raising, before a generous deadline (a SIGALRM that interrupts a stuck
regex, so a regression fails here in seconds instead of hanging the suite; the measured worst
cases are milliseconds: `python bench/hostile_parsers.py` prints them). Before the fix,
"Verdict" + 1000 spaces took 20 s in parse_verdict and "The answer is" + 2000 spaces + "x$ y"
60 s in extract_answer (both cubic), and parse_query("Query: ") raised IndexError.
"""
from __future__ import annotations

import math
import random
import signal
import time
from contextlib import contextmanager

import pytest

from agents.math_team import parse_verdict
from agents.search_team import MAX_QUERY_CHARS, parse_answer, parse_query
from envs.math_3agent import MathTeamEnv
from envs.tools import ANSWER, CALCULATOR, PYTHON, ToolCall, calculate, parse_tool_call
from envs.math_single import MathSingleEnv
from rewards import qa
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
}
# a deadline, not a speed target: parsers take milliseconds; math_reward may spend its worker's
# whole deadline on one answer plus a worker restart
BOUND_S = {name: 2.0 for name in PARSERS} | {"math_reward(reply)": TIMEOUT_S + 10, "math_reward(gold)": TIMEOUT_S + 10}


class Overtime(BaseException):  # not an Exception: the never-raise guards must not swallow it
    pass


@contextmanager
def deadline(seconds: float):
    """Interrupt the block after `seconds` (CPython's regex engine checks for signals)."""
    def _raise(*_):
        raise Overtime
    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextmanager
def bounded(seconds: float, label: str):
    """pytest.fail (not a hang) when the block runs past `seconds`."""
    try:
        with deadline(seconds):
            yield
    except Overtime:
        pytest.fail(f"{label}: still running after {seconds} s")


def timed(fn, text: str, bound: float, label: str = ""):
    """(result, seconds); pytest.fail when the call runs past `bound`."""
    t = time.perf_counter()
    with bounded(bound, label or getattr(fn, "__name__", str(fn))):
        r = fn(text)
    return r, time.perf_counter() - t


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
    """The three cases of the issue, at 32k and 128k: the old code took days (cubic) or raised."""
    for n in (N, 4 * N):
        assert timed(parse_verdict, "Verdict" + " " * n, 2.0)[0] is None
        assert timed(parse_verdict, "Verdict" + " " * n + ": Incorrect", 2.0)[0] is False
        assert timed(extract_answer, "The answer is" + " " * n + "x$ y", 2.0)[0] is None
        assert timed(extract_answer, "The answer is" + " " * n + "$x$.", 2.0)[0] == "x"
        assert timed(lambda s: math_reward(s, "1"), "The answer is" + " " * n + "x$ y", TIMEOUT_S + 10)[0] == 0.0
    assert parse_query("Query: ") == "" and parse_query("") == "" and parse_query("Query:\n") == ""


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


def _drive(env, task, replies, max_turns=12):
    turn, n = env.reset(task), 0
    while turn is not None and n < max_turns:
        turn = env.step(replies[n % len(replies)])
        n += 1
    assert turn is None, "the episode did not end"
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
