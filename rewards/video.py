"""Scoring for the video-QA team (envs/video_qa.py): clip-citation F1 and scene-graph triple F1.

    citation_scores(cited, support)              precision = |cited ∩ S| / |cited|, recall = |cited ∩ S| / |S|
    graph_scores(triples, gold, aliases)         the same over normalised triples

Names are normalised before they are compared (`normalise_name`): lower case, punctuation and the
articles a / an / the dropped, each word stemmed by a small suffix stripper (-ies -> y, then -ing,
-ed, -es or -s, then a final -e, then a doubled final consonant: "Picked up", "picks up" and "pick
up" are all "pick up"; "glasses" and "glass" are both "glas"). A relation then goes through the
task's `aliases` (normalised form -> canonical relation: "grabs" -> "pick up", "swept up" -> "sweep
up"), so the paraphrases the captions use count as the gold graph's names.

A triple is (subject, relation, object, clip): an event ("Anna", "pick up", "cup", "c3") or a link
between two clips ("c3", "before", "c5", "") / ("c2", "causes", "c3", ""). Links are read in either
direction: "after" is "before" with its ends swapped, "because of" / "caused by" / "due to" are
"causes" swapped; "then", "precedes", "followed by" mean "before"; "leads to", "results in" mean
"causes". Duplicates count once. Never raises; linear time.
"""
from __future__ import annotations

import re

_PUNCT = re.compile(r"[^\w\s]")
_POSSESSIVE = re.compile(r"['’]s\b")
_ARTICLES = {"a", "an", "the"}
_CLIP = re.compile(r"(?:c|clip\s?#?)0*(\d{1,4})", re.IGNORECASE)
VOWELS = set("aeiou")
BEFORE = {"before", "then", "precede", "precedes", "followed by", "is followed by", "earlier than", "prior to"}
AFTER = {"after", "follows", "follow", "later than", "followed"}
CAUSES = {"causes", "cause", "caused", "leads to", "led to", "lead to", "results in", "resulted in", "so", "triggers",
          "triggered", "makes"}
CAUSED_BY = {"because", "because of", "caused by", "is caused by", "due to", "results from", "resulted from"}


def _stem(w: str) -> str:
    if len(w) <= 3 or not w.isalpha():
        return w
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("ing") and len(w) > 5:
        w = w[:-3]
    elif w.endswith("ed") and len(w) > 4:
        w = w[:-2]
    elif w.endswith("es") and len(w) > 4:
        w = w[:-2]
    elif w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    if w.endswith("e") and len(w) > 3:
        w = w[:-1]
    if len(w) > 3 and w[-1] == w[-2] and w[-1] not in VOWELS:
        w = w[:-1]
    return w


def normalise_name(s) -> str:
    """'The Red-Cup' -> 'red cup'; 'Picked up' -> 'pick up' (see the module docstring). '' for a non-string."""
    if not isinstance(s, str):
        return ""
    words = _PUNCT.sub(" ", _POSSESSIVE.sub("", s[:300].lower())).split()
    return " ".join(_stem(w) for w in words if w not in _ARTICLES)


def clip_id(s) -> str | None:
    """'c3', '[C3]', 'clip 3', 'c03' -> 'c3'; None when `s` is not one clip id."""
    if not isinstance(s, str):
        return None
    m = _CLIP.fullmatch(s.strip().strip("[]()<>{}.,;:'\"` ")[:40])
    return f"c{int(m.group(1))}" if m else None


def prf(n_pred: int, n_gold: int, n_hit: int) -> tuple[float, float, float]:
    """(precision, recall, F1) from counts; 0 where a denominator is 0."""
    p = n_hit / n_pred if n_pred else 0.0
    r = n_hit / n_gold if n_gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def citation_counts(cited, support) -> tuple[int, int, int]:
    """(clips cited, supporting clips, cited clips that support), each clip once."""
    c = {x for x in map(clip_id, cited or []) if x}
    s = {x for x in map(clip_id, support or []) if x}
    return len(c), len(s), len(c & s)


def citation_scores(cited, support) -> tuple[float, float, float]:
    """(precision, recall, F1) of the cited clip ids against the supporting ones."""
    return prf(*citation_counts(cited, support))


def _norm_aliases(aliases) -> dict:
    out = {}
    for k, v in (aliases or {}).items() if isinstance(aliases, dict) else ():
        out[normalise_name(k)] = normalise_name(v)
    return out


def triple_key(triple, aliases: dict | None = None, _norm: dict | None = None):
    """The comparable form of one triple (3 or 4 strings), or None when it is not a triple.
    `aliases` maps a relation's forms to its canonical name (normalised here, or pass `_norm`)."""
    if not isinstance(triple, (list, tuple)) or len(triple) not in (3, 4) or \
            not all(isinstance(x, str) for x in triple):
        return None
    s, r, o = triple[:3]
    clip = triple[3] if len(triple) == 4 else ""
    a, b = clip_id(s), clip_id(o)
    rel = " ".join(_PUNCT.sub(" ", r[:100].lower()).split())
    if a and b:  # a link between two clips
        if rel in BEFORE:
            return (a, "before", b, "")
        if rel in AFTER:
            return (b, "before", a, "")
        if rel in CAUSES:
            return (a, "causes", b, "")
        if rel in CAUSED_BY:
            return (b, "causes", a, "")
        return (a, normalise_name(rel), b, "")
    norm = _norm if _norm is not None else _norm_aliases(aliases)
    r2 = normalise_name(r)
    return (normalise_name(s), norm.get(r2, r2), normalise_name(o), clip_id(clip) or "")


def graph_counts(triples, gold, aliases: dict | None = None) -> tuple[int, int, int]:
    """(distinct predicted triples, gold triples, predicted triples in the gold graph), normalised."""
    norm = _norm_aliases(aliases)
    pred = {k for k in (triple_key(t, _norm=norm) for t in (triples or [])) if k}
    want = {k for k in (triple_key(t, _norm=norm) for t in (gold or [])) if k}
    return len(pred), len(want), len(pred & want)


def graph_scores(triples, gold, aliases: dict | None = None) -> tuple[float, float, float]:
    """(precision, recall, F1) of the predicted triples against the gold ones, both normalised."""
    return prf(*graph_counts(triples, gold, aliases))
