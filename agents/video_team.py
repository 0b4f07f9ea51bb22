"""Prompts and parsing for the video-QA team (envs/video_qa.py): captioner, grapher, organizer.

The "video" is a list of timestamped clip captions ("[c3 0:08-0:12] Anna picks up the red cup.").

    captioner   the question, its choices and every caption -> the clips that matter, one line each
                citing its id ("[c4] Anna washes the cup."), then "Choice: <letter>"
    grapher     the same view -> the scene graph that matters, one triple a line with its clip
                ("(Anna, wash, cup) [c4]") and links between clips ("(c4, before, c6)",
                "(c2, causes, c3)"), then "Choice: <letter>"
    organizer   the question, its choices and the shared history (both reports, never the
                captions) -> "Answer: <letter>" and a one-line "Reason: ..."

The captioner and the grapher work independently (each sees the captions, not the other's report),
as the published system's agents do: their stated choices are two votes, which the env's
agreement skip reads. Each prompt carries a short example of its format (small models copy it), whose
choice is `<letter>`, never a letter: with `Choice: B` there, SmolLM2-135M after the recipe's SFT stated
`B` on 87 to 101 of 102 val questions in every role, and `D` on 26 of 30 with a `D` (docs/recipes.md).

Replies are untrusted text: every parser here never raises and runs in linear time (possessive
quantifiers next to one another on the same characters; bounded work per line, bounded lines).
"""
from __future__ import annotations

import re
from collections import deque

LETTERS = "ABCDE"
SYSTEM = {
    "captioner": "You are the text agent of a video question-answering team. You cannot see the video, only its "
                 "clip captions (clip id, time, what a captioner saw; captions can be noisy). Pick the clips that "
                 "matter for the question and say what happens in them, one line per clip starting with its id. "
                 "End with the choice they support.\nExample:\n[c4] Anna washes the cup.\n[c6] Then Anna puts the "
                 "cup down.\nChoice: <letter>",
    "grapher": "You are the graph agent of a video question-answering team. From the clip captions, write the "
               "scene graph that matters for the question: one triple per line, (person, action, object) and its "
               "clip id, and links between clips, (c2, causes, c3) or (c4, before, c6). End with the choice the "
               "graph supports.\nExample:\n(Anna, wash, cup) [c4]\n(Anna, put down, cup) [c6]\n(c4, before, c6)\n"
               "Choice: <letter>",
    "organizer": "You are the organizer of a video question-answering team. You cannot see the video: a text agent "
                 "and a graph agent report on it. Weigh their reports and answer with one letter and a short "
                 "reason.\nExample:\nAnswer: <letter>\nReason: both agents say Anna put the cup down right after "
                 "washing it [c6].",
}
LABEL = {"captioner": "Text agent (captioner)", "grapher": "Graph agent (grapher)"}
TASK = {
    "captioner": "Report the clips that answer the question, citing their ids, then 'Choice: <letter>'.",
    "grapher": "Write the triples with their clip ids and the links between clips, then 'Choice: <letter>'.",
    "organizer": "Answer with 'Answer: <letter>' and one line 'Reason: ...'.",
}


def fmt_time(sec) -> str:
    """Seconds -> 'm:ss' ('' when unknown, or not a finite time of under ten years)."""
    if isinstance(sec, bool) or not isinstance(sec, (int, float)) or not 0 <= sec < 3e8:  # NaN, inf: ""
        return ""
    s = int(round(sec))
    return f"{s // 60}:{s % 60:02d}"


def clip_lines(clips, max_chars: int = 6000) -> str:
    """'[c3 0:08-0:12] caption' per clip ('[c3] caption' without times), at most max_chars; the
    clips that do not fit are counted on a last line. A first caption longer than max_chars is cut
    (ending ' ...'), so one huge caption cannot make a huge prompt."""
    out, used = [], 0
    for i, c in enumerate(clips):
        a, b = fmt_time(c.get("start")), fmt_time(c.get("end"))
        text = " ".join(str(c["caption"])[:2 * max_chars].split())
        line = f"[{c['id']}{' ' + a + '-' + b if a and b else ''}] {text}"
        if used + len(line) > max_chars:
            if out:
                out.append(f"(... {len(clips) - i} more clips not shown)")
                break
            line = line[:max_chars - 4] + " ..."
        out.append(line)
        used += len(line) + 1
    return "\n".join(out)


def choice_lines(choices) -> str:
    return "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))


def agent_messages(role: str, question: str, choices, clips, max_caption_chars: int = 6000) -> list[dict]:
    """The captioner's or the grapher's view: the question, the choices and the captions."""
    user = (f"Question: {question}\nChoices:\n{choice_lines(choices)}\n\nClip captions:\n"
            f"{clip_lines(clips, max_caption_chars)}\n\n{TASK[role]}")
    return [{"role": "system", "content": SYSTEM[role]}, {"role": "user", "content": user}]


def organizer_messages(question: str, choices, history, max_report_chars: int = 1200) -> list[dict]:
    """The organizer's view: the question, the choices and the reports of the shared history
    [(role, text)], each cut to max_report_chars."""
    parts = [f"Question: {question}\nChoices:\n{choice_lines(choices)}"]
    for who, text in history:
        t = (text or "").strip()
        t = t[:max_report_chars] + (" ..." if len(t) > max_report_chars else "")
        parts.append(f"{LABEL.get(who, who)}:\n{t or '(no report)'}")
    parts.append(TASK["organizer"])
    return [{"role": "system", "content": SYSTEM["organizer"]}, {"role": "user", "content": "\n\n".join(parts)}]


# --------------------------------------------------------------------------------------------
# parsing (never raises)

MAX_LINES = 400
MAX_CITATIONS = 64
MAX_TRIPLES = 100
# the answer labels are matched on an ASCII-lowered copy of the reply (same length, same offsets):
# a pattern that starts with a literal is scanned ~10x faster than a case-insensitive one
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_LABELLED = re.compile(r"(?:final\s++answer|answer|choice|option)\b\s*+(?:is\s++)?[:\-=]?\s*+[(\[*\"']*+"
                       r"([a-z])(?![a-z0-9])")
_LABEL_TEXT = re.compile(r"(?:final\s++answer|answer|choice|option)\b\s*+(?:is\s++)?[:\-=]?[ \t]*+([^\n]{1,200})")
_BARE = re.compile(r"[\s(\[*\"']*+([A-Z])(?:[\s)\].:*\"']*+|[.)]\s[^\n]*+)")
_NORM = re.compile(r"[^a-z0-9 ]")
_CLIP = re.compile(r"[cC](?<![A-Za-z0-9_][cC])(?:lip\s?#?)?0*(\d{1,4})(?![A-Za-z0-9_])")  # c3, C03, clip 3
_GROUP = re.compile(r"\(([^()\n]{1,300})\)")
_SEP = re.compile(r"\s*+[,|;]\s*+")
_REASON = re.compile(r"\b(?i:reason|because|since)\b")
_TEMPORAL = re.compile(r"\b\d{1,2}:\d{2}\b|\b(?i:before|after|then|first|later|earlier|next|finally|while|when|until|"
                       r"afterwards|previously|causes?|caused|because)\b")


def _norm(s: str) -> str:
    s = _NORM.sub(" ", s[:300].lower())
    return " ".join(w for w in s.split() if w not in ("a", "an", "the"))


def _labels(pattern, text: str, low: str):
    """Matches of `pattern` in `low` (the lowered text) that start a word."""
    for m in pattern.finditer(low):
        i = m.start()
        if i == 0 or not (low[i - 1].isalnum() or low[i - 1] == "_"):
            yield m


def _labelled_letter(text: str, low: str, n: int) -> int | None:
    """The index of the last 'Answer: B' / 'Choice: (B)' letter (upper case, one of the first n)."""
    last = None
    for m in _labels(_LABELLED, text, low):
        letter = text[m.start(1)]
        if letter in LETTERS[:n]:
            last = LETTERS.index(letter)
    return last


def parse_choice(text, choices) -> int | None:
    """The index of the choice a reply names, or None. In order of trust: the last 'Answer: B' /
    'Choice: (B)' / 'The answer is B' (a letter within the choices); else the last such label
    followed by a choice's own text ('Answer: put down the cup', '3'); else the last line that is a
    bare letter ('B', '(B)', 'B.') or starts 'B. '/'B) '; else a last line that names exactly one
    choice's text."""
    if not isinstance(text, str) or not isinstance(choices, (list, tuple)) or not choices:
        return None
    try:
        n = min(len(choices), len(LETTERS))
        low = text.translate(_LOWER)
        last = _labelled_letter(text, low, n)
        if last is not None:
            return last
        normed = [_norm(str(c)) for c in choices[:n]]
        tail = deque(_labels(_LABEL_TEXT, text, low), maxlen=20)  # bounded work: the last 20 labels
        for m in reversed(tail):
            said = _norm(text[m.start(1):m.end(1)])
            for i, c in enumerate(normed):
                if c and (said == c or said.startswith(c + " ") or said.endswith(" " + c)):
                    return i
        lines = [ln for ln in text.rsplit("\n", MAX_LINES)[-MAX_LINES:] if ln.strip()]
        for ln in reversed(lines):
            m = _BARE.fullmatch(ln[:300])
            if m and m.group(1) in LETTERS[:n]:
                return LETTERS.index(m.group(1))
        if lines:
            said = _norm(lines[-1])
            hits = [i for i, c in enumerate(normed) if c and (said == c or f" {c} " in f" {said} ")]
            if len(hits) == 1:
                return hits[0]
        return None
    except Exception:  # noqa: BLE001 — a reply never crashes the episode
        return None


def parse_clip_ids(text) -> list[str]:
    """Every clip id a reply names ('c3', '[c3]', 'C03', 'clip 3' -> 'c3'), in order, once each, at
    most MAX_CITATIONS."""
    if not isinstance(text, str):
        return []
    out = dict.fromkeys(f"c{int(d)}" for d in dict.fromkeys(_CLIP.findall(text)))  # "c03" and "c3" are one
    return list(out)[:MAX_CITATIONS]


def _part(s: str) -> str:
    return " ".join(s.strip().strip("*`\"'[]").split())[:80]


def parse_triples(text) -> list[tuple[str, str, str, str]]:
    """The scene-graph triples of a reply as (subject, relation, object, clip), raw (rewards/video.py
    normalises them): '(Anna, picks up, cup) [c3]', '(Anna, picks up, cup, c3)', 'Anna | picks up |
    cup | c3', and links '(c3, before, c5)' (clip ''). A 3-part triple takes the first clip id written
    on its line outside the parentheses. At most MAX_TRIPLES; malformed groups are skipped."""
    if not isinstance(text, str):
        return []
    out = []
    try:
        for line in text.splitlines()[:MAX_LINES]:
            line = line[:2000]
            groups = [g for g in _GROUP.findall(line)][:10]
            rest = _GROUP.sub(" ", line)
            if not groups and line.count("|") >= 2:
                groups, rest = [line.strip().strip("|")], ""
            for g in groups:
                parts = [_part(p) for p in _SEP.split(g.strip())]
                if len(parts) not in (3, 4) or not all(parts[:3]):
                    continue
                s, r, o = parts[:3]
                a, b = _CLIP.fullmatch(s), _CLIP.fullmatch(o)
                if a and b:
                    clip = ""
                elif len(parts) == 4:
                    clip = parts[3]
                else:
                    m = _CLIP.search(rest)
                    clip = m.group(0) if m else ""
                out.append((s, r, o, clip))
                if len(out) >= MAX_TRIPLES:
                    return out
        return out
    except Exception:  # noqa: BLE001
        return out


def has_reason(text) -> bool:
    """Whether a reply gives a reason: a 'Reason:' / 'because' / 'since', or a line of three words or
    more besides its answer line."""
    if not isinstance(text, str):
        return False
    if _REASON.search(text[:20000]):
        return True
    for ln in text.splitlines()[:MAX_LINES]:
        if not _LABEL_TEXT.search(ln[:300].translate(_LOWER)) and len(ln[:300].split()) >= 3:
            return True
    return False


def answer_format(text, choices, choice: int | None = -1) -> float:
    """1.0 for a labelled letter ('Answer: B', 'Choice: (B)'), 0.5 for a choice read any other way
    (parse_choice; pass its result as `choice` when you have it), 0.0 for none."""
    if not isinstance(text, str) or not isinstance(choices, (list, tuple)):
        return 0.0
    if _labelled_letter(text, text.translate(_LOWER), min(len(choices), len(LETTERS))) is not None:
        return 1.0
    choice = parse_choice(text, choices) if choice == -1 else choice
    return 0.5 if choice is not None else 0.0


def temporal_reference(text, max_chars: int = 65536) -> bool:
    """Whether a reply places events in time or in a causal order: a timestamp ('0:12'), or before /
    after / then / first / later / next / while / when / until / because / causes ... (in its first
    max_chars characters: a reply is a few kB; the cap bounds the work on a hostile one)."""
    return isinstance(text, str) and _TEMPORAL.search(text[:max_chars]) is not None


def report_lines(text) -> int:
    """Lines holding a letter or digit, besides answer / choice lines (a report's steps)."""
    if not isinstance(text, str):
        return 0
    return sum(1 for ln in text.splitlines()[:MAX_LINES]
               if any(ch.isalnum() for ch in ln[:300]) and not _LABEL_TEXT.search(ln[:300].translate(_LOWER)))
