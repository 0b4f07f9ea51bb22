"""Math answer rewards: `extract_answer(text)` and `math_reward(response, ground_truth) -> float`.

The answer is the last `\\boxed{...}` (nested braces; `\\fbox` too), else the last `#### x`
(GSM8K), else a final "the answer is x". Equivalence, in order of cost:
  1. identical after normalisation (spaces, $, \\left/\\right, \\dfrac->\\frac, trailing period,
     text wrappers, thousands separators, currency signs, a trailing %),
  2. both plain numbers (ints, decimals, a/b fractions) equal within 1e-6 relative,
  3. math-verify (symbolic + numeric: latex fractions, \\sqrt, tuples, intervals, sets, ...).
Step 3 runs in a persistent worker subprocess with a hard deadline (`TIMEOUT_S`): math-verify's
own timeout is signal.alarm, which works only on the main thread and cannot interrupt a C-level
big-int power such as 9^9^9^9. A worker that misses the deadline is killed and restarted, and
the answer scores 0. `math_reward` never raises and returns 1.0 or 0.0 (no answer found -> 0.0).
"""
from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import threading
from fractions import Fraction

TIMEOUT_S = 5.0
MAX_ANSWER_CHARS = 300  # longer "answers" are compared as normalised strings only

# --------------------------------------------------------------------------------------------
# extraction


def _last_boxed(text: str) -> str | None:
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        m = re.match(r"\\(?:boxed|fbox)\s+([^\s$]+)", text[start:])  # "\boxed 5"
        return m.group(1) if m else None
    depth, j = 0, i
    while j < len(text):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
        j += 1
    return None  # unbalanced


def extract_answer(text: str) -> str | None:
    """The final answer in a model reply, or None. Never raises."""
    if not isinstance(text, str) or not text:
        return None
    try:
        b = _last_boxed(text)
        if b is not None:
            return b.strip()
        m = list(re.finditer(r"####\s*([^\n]+)", text))
        if m:
            return m[-1].group(1).strip()
        m = list(re.finditer(r"answer is[:\s]*\$?([^\n$]+?)\$?\s*(?:\.\s*)?$", text, re.IGNORECASE | re.MULTILINE))
        if m:
            return m[-1].group(1).strip()
    except Exception:  # noqa: BLE001 — extraction must never take the trainer down
        return None
    return None


# --------------------------------------------------------------------------------------------
# cheap equivalence


def normalize(ans: str) -> str:
    s = ans.strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:mathrm|textbf|mathbf)\{([^{}]*)\}", r"\1", s)
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


def _as_number(s: str):
    s = s.lstrip("\\$€£")
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    if not _NUM.match(s) or len(s) > 40:
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


# --------------------------------------------------------------------------------------------
# math-verify in a worker process with a hard deadline


class _Worker:
    def __init__(self):
        self.proc = None
        self.lock = threading.Lock()

    def _start(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen([sys.executable, "-m", "rewards.math"], cwd=root, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def _kill(self):
        if self.proc is not None:
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
                ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
                if not ready:
                    self._kill()
                    return None
                line = self.proc.stdout.readline()
                return bool(json.loads(line)) if line else None
            except (OSError, ValueError):
                self._kill()
                return None


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
    if len(a) > MAX_ANSWER_CHARS or len(b) > MAX_ANSWER_CHARS:
        return False
    return bool(_worker.equal(str(pred), str(gold), timeout))


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
