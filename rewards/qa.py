"""QA rewards with SQuAD's normalisation: lower case, no punctuation, no articles, single spaces.

Never raise (None or a non-string counts as an empty answer) and run in linear time.
"""
from __future__ import annotations

import re
import string
from collections import Counter

_NO_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    if not isinstance(s, str):
        try:
            s = "" if s is None else str(s)
        except Exception:  # noqa: BLE001 — e.g. an int past Python's 4300-digit str() limit
            s = ""
    s = s.lower().translate(_NO_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(pred: str, gold: str) -> float:
    return float(normalize_answer(pred or "") == normalize_answer(gold or ""))


def f1(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred or "").split(), normalize_answer(gold or "").split()
    if not p or not g:
        return float(p == g)
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)
