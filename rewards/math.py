"""Math answer rewards: `extract_answer(text)` and `math_reward(response, ground_truth) -> float`.

The answer is the last `\\boxed{...}` (nested braces; `\\fbox` too), else the last `#### x`
(GSM8K), else a final "the answer is x". Equivalence, in order of cost:
  1. identical after normalisation (spaces, $, \\left/\\right, \\dfrac->\\frac, trailing period,
     text wrappers, thousands separators, currency signs, a trailing %),
  2. both plain numbers (ints, decimals, a/b fractions) equal within 1e-6 relative,
  3. math-verify (symbolic + numeric: latex fractions, \\sqrt, tuples, intervals, sets, ...),
     unless the answer is too large to be the truth (`too_big`: 10^{10^{10}}, (10^9)!, (x+y+1)^{60}
     far past the caps and the truth's own size), which scores 0 at once.
Step 3 runs in a persistent worker subprocess with a hard deadline (`TIMEOUT_S`): math-verify's
own timeout is signal.alarm, which works only on the main thread and cannot interrupt a C-level
big-int power such as 9^9^9^9. A worker that misses the deadline is killed and restarted, and
the answer scores 0: a last resort, since `too_big` turns away the answers built to be slow.
`math_reward` never raises and returns 1.0 or 0.0 (no answer found -> 0.0).

Replies are untrusted text: extraction and normalisation are linear in the reply's length (no
regex here can backtrack on it: quantifiers that meet on the same characters are possessive, and
"the answer is" is read by a scan, not a regex); tests/test_hostile_text.py checks them on 32 kB
hostile strings and bench/hostile_parsers.py prints the worst cases.
"""
from __future__ import annotations

import json
import math
import os
import re
import select
import subprocess
import sys
import threading
from fractions import Fraction

TIMEOUT_S = 5.0
STARTUP_TIMEOUT_S = 120.0  # for a fresh worker to import math-verify (sympy); not charged to an answer
MAX_ANSWER_CHARS = 300  # longer answers (raw or normalised) are compared as normalised strings only

# --------------------------------------------------------------------------------------------
# extraction


_BOX = re.compile(r"\\(?:boxed|fbox)")
_WS = re.compile(r"\s*+")
_BARE_BOX_ARG = re.compile(r"[^\s$]+")  # "\boxed 5"


# A revision paid relative to the answer it was given (the team's refiner, self-refine's second look):
# (was right, is right) -> reward. A fix +1, a break -1, keeping a right answer +0.5, staying wrong 0.
REVISION_REWARD = {(False, True): 1.0, (True, False): -1.0, (True, True): 0.5, (False, False): 0.0}


def _last_boxed(text: str) -> str | None:
    """The contents of the last \\boxed{...} / \\fbox{...} (nested braces), or of "\\boxed 5";
    None when there is none or the last one is unbalanced. One pass: linear time."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    end = _BOX.match(text, start).end()
    i = _WS.match(text, end).end()
    if i == len(text) or text[i] != "{":
        m = _BARE_BOX_ARG.match(text, i)
        return m.group(0) if m and i > end else None
    depth = 0
    for j in range(i, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None  # unbalanced


_HASHES = re.compile(r"####\s*+([^\n]+)")
_ANSWER_IS = re.compile(r"answer is", re.IGNORECASE)
_SKIP = re.compile(r"[:\s]*+")
_STOP = re.compile(r"[$\n]")
_TAIL = re.compile(r"[^\S\n]*+(?:\.[^\S\n]*+)?(?:\n|\Z)")  # after a closing $: spaces, one ".", spaces, end of line


def _answer_is(text: str) -> str | None:
    """x of the last "the answer is x" whose x runs to the end of its line: "answer is" [: or spaces,
    newlines too] [$] x [$] [.]; x itself holds no $ ("the answer is $x$ and $y$" is no answer).

    A single backtracking regex for this was cubic ("The answer is" + 2000 spaces + "x$ y" took a
    minute). Here every character is looked at a bounded number of times: occurrences are visited
    last to first, the skip runs after them are disjoint, the search for the stopping $ or newline
    of one occurrence covers only the stretch up to the next occurrence (beyond that the answer is
    known), and each stopping $ has its tail checked once.
    """
    starts = [m.end() for m in _ANSWER_IS.finditer(text)]
    n, later_cs, later_stop, tail_ok = len(text), None, None, {}
    for pos in reversed(starts):
        cs = _SKIP.match(text, pos).end()
        if cs < n and text[cs] == "$":
            cs += 1
        m = _STOP.search(text, cs, later_cs if later_cs is not None else n)
        stop = m.start() if m else (later_stop if later_cs is not None else n)
        later_cs, later_stop = cs, stop
        if stop < n and text[stop] == "$":
            if stop not in tail_ok:
                tail_ok[stop] = _TAIL.match(text, stop + 1) is not None
            if not tail_ok[stop]:
                continue
        x = text[cs:stop].rstrip()
        x = x.removesuffix(".").strip()
        if x:
            return x
    return None


def extract_answer(text: str) -> str | None:
    """The final answer in a model reply, or None. Never raises; linear time in len(text)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        b = _last_boxed(text)
        if b is not None:
            return b.strip()
        last = None
        for last in _HASHES.finditer(text):
            pass
        if last is not None:
            return last.group(1).strip()
        return _answer_is(text)
    except Exception:  # noqa: BLE001 — extraction must never take the trainer down
        return None


# --------------------------------------------------------------------------------------------
# cheap equivalence


def normalize(ans: str) -> str:
    s = ans.strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:mathrm|textbf|mathbf|textit|mathit|emph|mbox|textsf|operatorname)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "").replace("\\ ", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("$", "").replace("\\$", "")
    s = s.replace("\\%", "%").replace("°", "").replace("^\\circ", "").replace("^{\\circ}", "")
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)  # thousands separators
    s = s.strip().rstrip(".").strip()
    s = re.sub(r"\s+", "", s)
    if s.endswith("%"):
        s = s[:-1]
    return s.lower()


_NUM = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)(/\d+)?$")
_WORD = re.compile(r"[^\W\d_]{4,}")  # (normalised) letters only, four or more: a word or a name (xy, abc: algebra)
_MATH_WORDS = {"infinity", "infty", "undefined", "none"}  # words math-verify reads as math


def _as_number(s: str):
    s = s.lstrip("\\$€£")
    if len(s) > 60:
        return None
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    if len(s) > 40 or not _NUM.match(s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answer_key(ans: str) -> str:
    """A canonical form for comparing answers cheaply (majority votes): the exact number when the
    answer is one (7, 7.0 and 14/2 agree), else the normalised string."""
    s = normalize(ans)
    n = _as_number(s)
    return str(n) if n is not None else s


# --------------------------------------------------------------------------------------------
# answers too large to be the answer: scored before math-verify sees them
#
# sympy evaluates exactly, so 10^{10^{10}}, (10^9)! or \binom{10^9}{5\cdot10^8} build integers of
# billions of digits in C code no signal interrupts (each cost the worker's whole deadline and a
# restart, 6 s), and (x+y+1)^{60} or (a+b)(c+d)...(s+t) expand to thousands of terms (3-5 s). `size`
# reads upper bounds of that work off the answer's tokens in linear time; an answer past the caps and
# far past the truth's own size is taken to differ from the truth and scores 0 at once. Bounds only:
# a right answer written with a huge intermediate ((10^{3000})^{2}/10^{5999}) is refused too.

MAX_DIGITS = 2000  # digits of the largest integer exact evaluation may build (10^{2000}: tens of ms)
MAX_TERMS = 100  # terms an expansion may build ((x+1)^{100}: 0.1-0.3 s; (a+b)(c+d)... with 6 factors)
MAX_NESTING = 60  # brackets in brackets; deeper is no answer (and would run out of stack here)
_SIZE_TOKEN = re.compile(r"\d+(?:\.\d*)?|\.\d+|\\[a-z]+|\*\*|\\?.", re.DOTALL)
_CLOSE = {"{": "}", "(": ")", "[": "]"}
_PLUS = {"+", "-", "\\pm", "\\mp"}
_BINOM = {"\\binom", "\\dbinom", "\\tbinom", "\\choose"}
_QUIET = _PLUS | _BINOM | {"\\frac", "\\cdot", "\\times", "\\div", "\\sqrt"}  # no value of their own


class _Size:
    """Recursive descent over the tokens. Each node is (v, d, t, k, sym): v bounds log10 of its value
    (0 for |value| <= 1), d bounds log10 of the largest integer evaluating it builds (a numerator or
    a denominator: 0.1 builds 10), t bounds log10 of the terms an expansion builds, k counts its
    additive terms, sym says it holds a symbol (x, \\pi, i, a root): a power of it expands."""

    def __init__(self, text: str):
        self.toks, self.i, self.depth = _SIZE_TOKEN.findall(text), 0, 0

    def more(self, *toks) -> bool:
        return self.i < len(self.toks) and self.toks[self.i] in toks

    def group(self, close=None):
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise RecursionError("nested too deeply")
        v = term = d = t = spread = most = 0.0  # v: the largest term's value; term: the product so far
        k, sym, start = 1, False, True  # spread: log10 of the terms the product so far expands to
        while self.i < len(self.toks) and self.toks[self.i] != close:
            tok = self.toks[self.i]
            if tok in ("}", ")", "]"):  # a stray closer
                self.i += 1
                continue
            if tok in _PLUS and not start:  # a new term
                v, term, most, spread, k = max(v, term), 0.0, max(most, spread), 0.0, k + 1
            elif tok in (",", ";", "="):  # a new element of a tuple, set or equation
                v, term, most, spread = max(v, term), 0.0, max(most, spread), 0.0
            start = tok in (",", ";", "=")
            nv, nd, nt, nk, ns = self.power()
            term, d, t, sym = term + nv, d + nd, t + nt, sym or ns
            if ns and nk > 1:  # (a+b)(c+d)...: the terms multiply
                spread += math.log10(nk)
        self.i += 1  # the closer (or past the end)
        self.depth -= 1
        return max(v, term) + math.log10(k), d, t + max(most, spread), k, sym

    def power(self):
        v, d, t, k, sym = self.postfix(self.atom())
        if self.more("^", "**"):
            self.i += 1
            ev, ed, et, _, esym = self.power()  # right-associative: 9^9^9 is 9^(9^9)
            e = _exp10(ev)  # the exponent's value
            base = max(v, d)  # the integers a power of the base builds
            grows = max(k - 1, 1 if t > 0 else 0) if sym else 0
            v, d = v * e if v > 0 else 0.0, max(base * e if base > 0 else 0.0, ed)
            t, k, sym = t + et + (grows * ev if grows else 0.0), 1, sym or esym
        return v, d, t, k, sym

    def postfix(self, node):
        v, d, t, k, sym = node
        if self.more("!"):  # n! (n!! is smaller)
            while self.more("!"):
                self.i += 1
            v = _factorial(v)
            d, k = max(d, v), 1
        return v, d, t, k, sym

    def atom(self):
        if self.i >= len(self.toks):  # "2^" at the end
            return 0.0, 0.0, 0.0, 1, False
        tok = self.toks[self.i]
        self.i += 1
        if tok in _CLOSE:
            return self.group(_CLOSE[tok])
        if tok[0].isdigit() or tok[0] == ".":  # a decimal builds its numerator and its denominator 10^len(frac)
            whole, _, frac = tok.partition(".")
            digits = (whole + frac).lstrip("0")
            num = math.log10(int(digits[:15])) + max(0, len(digits) - 15) if digits else 0.0
            return max(0.0, num - len(frac)), max(num, len(frac)), 0.0, 1, False
        if (tok in _BINOM or tok == "\\gamma") and self.i < len(self.toks):
            n = self.power()  # C(n, k) <= 2^n; Gamma(n) = (n - 1)!
            v = _factorial(n[0]) if tok == "\\gamma" else 0.302 * _exp10(n[0])
            return v, max(n[1], v), n[2], 1, n[4]
        if tok in _QUIET or not (tok[0].isalpha() or tok[0] == "\\"):
            return 0.0, 0.0, 0.0, 1, tok == "\\sqrt"
        return 1.0, 1.0, 0.0, 1, True  # a symbol or a function name: counted as 10


def _exp10(v: float) -> float:
    return 10.0 ** v if v < 300 else float("inf")


def _factorial(v: float) -> float:
    """log10(n!) <= n log10(n) for log10(n) <= v."""
    return _exp10(v) * v if v > 0 else 0.0


def size(ans: str) -> tuple[float, float]:
    """(digits, terms) upper bounds, as log10, of the work exact evaluation of `ans` (normalised) may
    do; (inf, inf) when it nests too deeply to read."""
    try:
        _, d, t, _, _ = _Size(ans).group()
        return d, t
    except RecursionError:
        return float("inf"), float("inf")


def too_big(pred: str, gold: str) -> bool:
    """True when `pred` would make math-verify build far more than the caps and than `gold` does."""
    pd, pt = size(pred)
    if pd <= MAX_DIGITS and pt <= math.log10(MAX_TERMS):
        return False
    gd, gt = size(gold)
    return pd > max(MAX_DIGITS, 10 * gd) or pt > max(math.log10(MAX_TERMS), gt + 1)


# --------------------------------------------------------------------------------------------
# math-verify in a worker process with a hard deadline


class _Worker:
    def __init__(self):
        self.proc = None
        self.lock = threading.Lock()
        self.asked = self.killed = 0  # answers sent to math-verify; workers killed (deadline, failure)

    def _start(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen([sys.executable, "-m", "rewards.math"], cwd=root, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        # The worker says "ready" once math-verify is imported, so a slow import on a busy machine
        # is not mistaken for a pathological answer (which would kill and restart it forever).
        ready, _, _ = select.select([self.proc.stdout], [], [], STARTUP_TIMEOUT_S)
        if not ready or self.proc.stdout.readline().strip() != "ready":
            self._kill()
            raise OSError("the math-verify worker did not start")

    def _kill(self):
        if self.proc is not None:
            self.killed += 1
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def equal(self, pred: str, gold: str, timeout: float) -> bool | None:
        """True/False, or None when the worker missed the deadline or failed."""
        with self.lock:
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self._start()
                self.proc.stdin.write(json.dumps([pred, gold]) + "\n")
                self.proc.stdin.flush()
                self.asked += 1
                ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
                if not ready:
                    self._kill()
                    return None
                line = self.proc.stdout.readline()
                return bool(json.loads(line)) if line else None
            except (OSError, ValueError):
                self._kill()
                return None
            except BaseException:  # Ctrl-C or an alarm mid-request: never leave a stale reply in the pipe
                self._kill()
                raise


_worker = _Worker()


def is_equiv(pred: str, gold: str, timeout: float = TIMEOUT_S) -> bool:
    if pred is None or gold is None:
        return False
    a, b = normalize(str(pred)), normalize(str(gold))
    if a == b:
        return True
    x, y = _as_number(a), _as_number(b)
    if x is not None and y is not None:
        return abs(x - y) <= 1e-6 * max(1, abs(y))
    if _WORD.fullmatch(b) and b not in _MATH_WORDS:  # the truth is a name, not algebra: math-verify reads
        return False  # "Zanne" as Z*a*n*n*e, so any anagram (Nezan, "ne \cdot Zan") would score; names match as text
    pred, gold = str(pred).strip(), str(gold).strip()
    # math-verify sees the raw strings, so the cap is on those too: "$" + 32k spaces normalises to
    # "" but takes math-verify past its deadline
    if max(len(a), len(b), len(pred), len(gold)) > MAX_ANSWER_CHARS:
        return False
    if too_big(a, b):  # 10^{10^{10}}, (10^9)!: no work for the worker, no deadline, no restart
        return False
    return bool(_worker.equal(pred, gold, timeout))


def math_reward(response: str, ground_truth: str) -> float:
    """1.0 if the reply's final answer equals ground_truth, else 0.0. Never raises."""
    try:
        return 1.0 if is_equiv(extract_answer(response), str(ground_truth)) else 0.0
    except Exception:  # noqa: BLE001
        return 0.0


def _serve():
    """Worker loop: one JSON [pred, gold] per line in, one JSON bool per line out."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    cfg = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            pred, gold = json.loads(line)
            g = parse(f"${gold}$", extraction_config=cfg, parsing_timeout=None)
            p = parse(f"${pred}$", extraction_config=cfg, parsing_timeout=None)
            ok = bool(g) and bool(p) and verify(g, p, timeout_seconds=None)
        except Exception:  # noqa: BLE001
            ok = False
        sys.stdout.write("true\n" if ok else "false\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
