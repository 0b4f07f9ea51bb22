"""Prompts and reply parsing for the software-engineering team (envs/swe.py): analyzer (localises the
bug through repository tools), writer (search/replace edit blocks), validator (tests, then a verdict).

Every parser here reads untrusted model text: it never raises and runs in linear time (a state
machine over lines, no backtracking regex over the whole reply).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

SYSTEM = {
    "analyzer": "You are a software engineer localising a bug in a Python repository. Reply with your diagnosis: "
                "the file(s) and function(s) to change, and why.",
    "writer": "You are a software engineer fixing a bug. Reply with edit blocks, one per change:\n"
              "path/to/file.py\n<<<<<<< SEARCH\nexact lines from the file\n=======\nthe new lines\n>>>>>>> REPLACE\n"
              "SEARCH must match the file exactly once. Do not edit the tests.",
    "validator": "You review a patch for an issue. Reply 'Verdict: ACCEPT' if the patch fixes the issue, or "
                 "'Verdict: REJECT' followed by what is still wrong.",
}
WITH_TOOLS = {  # added to the system prompt while the role may still call tools
    "analyzer": "First explore the repository with the tools below, one call per reply; your first reply without a "
                "tool call is the diagnosis.",
    "validator": "First check the patch with the tools below (run the tests, or Python that reproduces the issue), "
                 "one call per reply; your first reply without a tool call is the verdict.",
}
LABEL = {"analyzer": "Analyzer", "observation": "Tool result", "diagnosis": "Diagnosis", "writer": "Writer",
         "applied": "Applying the edits", "validator": "Validator", "feedback": "Validator feedback"}
ASK = {"analyzer": "Write your diagnosis.", "analyzer_tools": "Call one tool, or write your diagnosis.",
       "analyzer_last": "No more tool calls: write your diagnosis now.", "writer": "Write the edit blocks.",
       "validator": "Give your verdict.", "validator_tools": "Call one tool, or give your verdict.",
       "validator_last": "No more tool calls: give your verdict now."}


def build_messages(role: str, issue: str, history: list[tuple[str, str]], context: str = "", tools: str = "",
                   rounds: list[tuple[str, str]] = (), cap: int = 0) -> list[dict]:
    """The chat a role sees: its system prompt (+ the tools it may call, `cap` calls in all), the issue,
    the history entries the env shows it (label, text), extra context (files, the patch) and what to do
    now: with tools, call one or answer while calls remain, else answer now; without, the role's task.

    rounds: the (reply, tool result) pairs of the role's tool calls so far in this sequence (the
    analyzer's exploration, the validator's checks of one patch): they follow as the conversation's
    assistant / user messages, each result followed by what to do next, so each round's prompt is the
    last one's prompt + reply + the result, token for token (the engine prefills only the new text, the
    update packs the rounds in one row)."""
    def ask(calls: int) -> str:
        return ASK[role] if not tools else ASK[f"{role}_last" if calls >= cap else f"{role}_tools"]

    system = SYSTEM[role] + (f"\n{WITH_TOOLS[role]}\n\n{tools}" if tools else "")
    parts = [f"Issue:\n{issue.strip()}"] + [f"{LABEL.get(w, w)}:\n{t.strip()}" for w, t in history]
    if context:
        parts.append(context.strip())
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts + [ask(0)])}]
    for k, (reply, result) in enumerate(rounds, 1):
        msgs += [{"role": "assistant", "content": reply},
                 {"role": "user", "content": f"{LABEL['observation']}:\n{result.strip()}\n\n{ask(k)}"}]
    return msgs


# --------------------------------------------------------------------------------------------
# the writer's reply: search/replace blocks (Aider's format) or, failing that, a unified diff

@dataclass
class Edit:
    path: str  # as written by the model: checked by the env (envs/swe.py apply_edits)
    search: str
    replace: str


_OPEN = re.compile(r"^\s*<{5,9}\s*SEARCH\s*$", re.IGNORECASE)
_MID = re.compile(r"^\s*={5,9}\s*$")
_CLOSE = re.compile(r"^\s*>{5,9}\s*REPLACE\s*$", re.IGNORECASE)
_FENCE = re.compile(r"^\s*```")


_PATHLIKE = re.compile(r"[\w.\-/\\]*[\w\-]\.[A-Za-z]\w{0,7}|[\w.\-/\\]*/[\w.\-]+")


def _path_of(line: str) -> str:
    """The file name a model writes above a block: `pkg/x.py`, **pkg/x.py**, File: pkg/x.py,
    # pkg/x.py, "In pkg/x.py:" -- the last path-like word of the line, else the line itself."""
    s = line.strip()[:500].strip("`*").strip()
    s = re.sub(r"^(?:#+|file\s*:|path\s*:|filename\s*:)\s*", "", s, flags=re.IGNORECASE)
    found = _PATHLIKE.findall(s)
    return found[-1] if found else s.strip().strip("`*'\":").strip()


def parse_edits(text: str) -> tuple[list[Edit], list[str]]:
    """(edits, problems) read from a reply. Tolerant: the file name is the last non-blank, non-fence
    line before `<<<<<<< SEARCH`; 5-9 marker characters, any case. Never raises."""
    if not isinstance(text, str):
        return [], ["the reply is not text"]
    edits, problems = [], []
    state, last, path, search, replace = "out", "", "", [], []
    for line in text.split("\n"):
        if state == "out":
            if _OPEN.match(line):
                state, path, search, replace = "search", _path_of(last), [], []
            elif line.strip() and not _FENCE.match(line):
                last = line
        elif state == "search":
            if _MID.match(line):
                state = "replace"
            elif _OPEN.match(line) or _CLOSE.match(line):
                problems.append(f"edit block {len(edits) + len(problems) + 1}: expected ======= after the SEARCH lines")
                state, last = "out", ""
            else:
                search.append(line)
        else:  # replace
            if _CLOSE.match(line):
                if not path:
                    problems.append(f"edit block {len(edits) + len(problems) + 1}: no file name on the line above "
                                    "<<<<<<< SEARCH")
                else:
                    edits.append(Edit(path, "\n".join(search), "\n".join(replace)))
                state, last = "out", ""
            elif _OPEN.match(line):
                problems.append(f"edit block {len(edits) + len(problems) + 1}: no >>>>>>> REPLACE line")
                state, path, search, replace = "search", _path_of(last), [], []
            else:
                replace.append(line)
    if state != "out":
        problems.append(f"edit block {len(edits) + len(problems) + 1}: the reply ends inside the block "
                        "(no >>>>>>> REPLACE line)")
    return edits, problems


def extract_diff(text: str) -> str | None:
    """A unified diff in the reply (its ```diff / ```patch fenced block, else the bare text), when
    the reply has one. Line by line: linear in the reply's length."""
    if not isinstance(text, str) or "\n+++ " not in text or "@@" not in text:
        return None
    inside = None
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            if inside is None:
                inside = []
                continue
            if any(x.startswith("+++ ") for x in inside):
                return "\n".join(inside) + "\n"
            inside = None
        elif inside is not None:
            inside.append(line)
    if inside and any(x.startswith("+++ ") for x in inside):  # an unclosed fence
        return "\n".join(inside) + "\n"
    return text


# --------------------------------------------------------------------------------------------
# the validator's verdict

_VERDICT = re.compile(r"verdict[\s:=*\-]{0,20}(accept|reject)", re.IGNORECASE)  # bounded: linear time
_BARE = re.compile(r"\b(ACCEPT|REJECT)(?:ED)?\b")


def parse_verdict(text: str) -> bool | None:
    """True (ACCEPT), False (REJECT) or None (neither): the last 'Verdict: X', else the last
    capitalised ACCEPT / REJECT word. Never raises."""
    if not isinstance(text, str):
        return None
    m = list(_VERDICT.finditer(text)) or list(_BARE.finditer(text))
    return None if not m else m[-1].group(1).lower() == "accept"
