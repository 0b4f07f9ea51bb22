"""Prompts and parsing for the deep-research team (envs/research.py): planner, researcher, writer.

    planner     the question -> a numbered list of sub-questions, answered in order (later ones may
                refer to earlier answers: "that person")
    researcher  one sub-question: one tool call per reply (search / read_doc / note), its
                messages growing round by round (reply, then observation) so its rounds can train
                as one sequence (rollout.merge_turns)
    writer      the notes -> 'Answer: <short answer>' and 'Citations: [doc id] ...'

Replies are untrusted text: every parser here never raises and runs in linear time (quantifiers
next to each other on the same characters are possessive, `\\s*+`, so 30k spaces cannot backtrack).
Tool calls are read by runtime/tools.parse_tool_call (ReAct `Action: search[...]` or <tool_call> JSON).
"""
from __future__ import annotations

import re

SYSTEM = {
    "planner": "You plan research for a question that needs several facts. Split it into 2 to 4 short "
               "sub-questions, to be answered in order; a later one may refer to an earlier answer ('that "
               "person'). Reply with a numbered list only:\n1. <sub-question>\n2. <sub-question>",
    "researcher": "You research one sub-question in a document collection. Each reply is one action:\n"
                  "Action: search[<words>]   lists matching documents (id and title)\n"
                  "Action: read_doc[<id>]    shows one document\n"
                  "Action: note[<the fact you found, with its document id>]   records it and ends your turn\n"
                  "Example: Action: search[Kalo Works founder]",
    "writer": "You write the final report from the research notes: a short answer and the ids of the documents "
              "it rests on. Reply exactly:\nAnswer: <short answer>\nCitations: [<doc id>] [<doc id>]",
}


def planner_messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM["planner"]},
            {"role": "user", "content": f"Question: {question}\n\nWrite the sub-questions."}]


def _notes_block(notes: list[tuple[str, str | None, list[str]]]) -> str:
    """[(sub-question, note or None, ids read)] as text, one block per researched sub-question."""
    out = []
    for i, (sq, note, read) in enumerate(notes, 1):
        out.append(f"{i}. {sq}\n   Note: {note if note else '(none)'}\n   Documents read: "
                   f"{' '.join(f'[{d}]' for d in read) if read else '(none)'}")
    return "\n".join(out)


def researcher_messages(question: str, plan: list[str], notes, i: int, rounds: int) -> list[dict]:
    """The first message pair of sub-question i (0-based); later rounds append reply + observation."""
    parts = [f"Question: {question}", "Plan:\n" + "\n".join(f"{k}. {s}" for k, s in enumerate(plan, 1))]
    if notes:
        parts.append("Notes so far:\n" + _notes_block(notes))
    parts.append(f"Your sub-question ({i + 1} of {len(plan)}): {plan[i]}\nYou have {rounds} actions.")
    return [{"role": "system", "content": SYSTEM["researcher"]}, {"role": "user", "content": "\n\n".join(parts)}]


def next_sub_message(plan: list[str], i: int, rounds: int) -> dict:
    """The per-role layout's message that starts sub-question i in the researcher's ongoing conversation."""
    return {"role": "user", "content": f"Your sub-question ({i + 1} of {len(plan)}): {plan[i]}\nYou have {rounds} actions."}


def writer_messages(question: str, notes) -> list[dict]:
    body = _notes_block(notes) if notes else "(no notes)"
    return [{"role": "system", "content": SYSTEM["writer"]},
            {"role": "user", "content": f"Question: {question}\n\nResearch notes:\n{body}\n\n"
                                        "Write the answer with citations."}]


def observation_message(text: str) -> dict:
    return {"role": "user", "content": f"Observation:\n{text}"}


# --------------------------------------------------------------------------------------------
# parsing (never raises)

MAX_ITEM_CHARS = 200
MAX_LINES = 200
# a list item: "Sub-question 2:", "Q2.", "Step 2)", "2.", "(2)", "- ", "* ", "• "; then the item
_ITEM = re.compile(r"\s*+(?:(?:sub[- ]?questions?|q(?:uestion)?|step)\s*+\d{0,3}\s*+[:.)\-]"
                   r"|\(?\d{1,3}\s*+[.):]|[-*•])\s*+(.*)", re.IGNORECASE)
_WORD = re.compile(r"\w")
# "1. Who founded X? 2. Where was that person born?" on one line (what SmolLM2 writes): split before
# each " N. " / " N) " that follows a '?' or '.', so "3.5" or "Bob 2. Jr" inside an item stays whole
_INLINE = re.compile(r"(?<=[?.!])\s++(?=\(?\d{1,2}[.)]\s)")


def _clean(s: str) -> str:
    s = " ".join(s.split()[:60])
    return s.strip().strip("*").strip().strip('"').strip()[:MAX_ITEM_CHARS]


def parse_plan(text, max_items: int = 4) -> list[str]:
    """The sub-questions of a planner reply: numbered / bulleted / 'Sub-question N:' lines (also several
    numbered items on one line), else the lines ending in '?'; cleaned, de-duplicated, at most `max_items`. [] when there is none (the env
    then researches the question itself and pays the planner 0)."""
    if not isinstance(text, str):
        return []
    try:
        lines = [part for ln in text.splitlines()[:MAX_LINES] for part in _INLINE.split(ln)]
        items = [m.group(1) for m in map(_ITEM.match, lines) if m and m.group(1).strip()]
        if not items:
            items = [ln for ln in lines if ln.rstrip().endswith("?")]
        out, seen = [], set()
        for it in items:
            c = _clean(it)
            if len(_WORD.findall(c[:50])) >= 3 and c.lower() not in seen:
                seen.add(c.lower())
                out.append(c)
        return out[:max(0, int(max_items))]
    except Exception:  # noqa: BLE001 — a reply never crashes the episode
        return []


_ANSWER = re.compile(r"answer\s*+:\s*+([^\n]*)", re.IGNORECASE)
_CITE_LINE = re.compile(r"(?:citations?|sources?|references?)\s*+:\s*+([^\n]*)", re.IGNORECASE)
_BRACKET = re.compile(r"\[([^\[\]\n]{1,80})\]")
_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")
_SPLIT = re.compile(r"[,;\s]+")
MAX_CITATIONS = 20
_NOT_IDS = {"none", "n/a", "na", "and", "doc", "id", "citations", "citation", "sources"}


def _ids(chunk: str) -> list[str]:
    return [t for t in (x.strip(".'\"()[]") for x in _SPLIT.split(chunk)) if t and _ID.fullmatch(t)
            and t.lower() not in _NOT_IDS]


def parse_citations(text) -> list[str]:
    """Document ids cited in a reply: every `[id]` (also `[a, b]`) and the ids on 'Citations:' /
    'Sources:' lines, in order of appearance, once each, at most MAX_CITATIONS."""
    if not isinstance(text, str):
        return []
    try:
        found = []
        for m in _BRACKET.finditer(text):  # linear: brackets do not nest in the pattern
            found.append((m.start(), _ids(m.group(1))))
        for m in _CITE_LINE.finditer(text):
            found.append((m.start(1), _ids(_BRACKET.sub(" ", m.group(1)))))
        out = []
        for _, ids in sorted(found, key=lambda x: x[0]):
            for i in ids:
                if i not in out:
                    out.append(i)
        return out[:MAX_CITATIONS]
    except Exception:  # noqa: BLE001
        return []


_BOXED = re.compile(r"\\boxed\{([^{}\n]{0,200})\}")


def parse_report(text) -> tuple[str | None, list[str]]:
    """(answer, citations) of a writer reply. The answer: the text after the last non-empty
    'Answer:', else a \\boxed{} one, else (no 'Answer:' at all) the first non-empty line that is not a
    citation line;
    [doc id] brackets are taken out of it (unless nothing else is left). None when there is none."""
    if not isinstance(text, str):
        return None, []
    try:
        cites = parse_citations(text)
        ans, labelled = None, False
        for m in _ANSWER.finditer(text):
            labelled = True
            if m.group(1).strip():
                ans = m.group(1)
        if ans is None:
            b = _BOXED.findall(text)
            ans = b[-1] if b else None if labelled else next(
                (ln for ln in text.splitlines()[:MAX_LINES] if ln.strip() and not _CITE_LINE.match(ln.strip())), None)
        if ans is None:
            return None, cites
        ans = _CITE_LINE.split(ans)[0]  # "Answer: X Citations: [a]" on one line
        bare = _BRACKET.sub(" ", ans)
        ans = " ".join((bare if bare.strip() else ans.replace("[", " ").replace("]", " ")).split()[:40])
        ans = ans.strip().strip(".").strip()[:MAX_ITEM_CHARS]
        return (ans or None), cites
    except Exception:  # noqa: BLE001
        return None, []


def clean_doc_id(s) -> str:
    """An id as a model writes it: '[city0_0]', '"city0_0"', 'id: city0_0' -> 'city0_0'."""
    if not isinstance(s, str):
        return ""
    s = s.strip()[:200]
    s = re.sub(r"^(?:doc(?:ument)?[ _]?)?id\s*+[:=]\s*+", "", s, flags=re.IGNORECASE)
    return s.strip().strip("[]()\"'`.,").strip()
