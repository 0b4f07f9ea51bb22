"""Prompts and parsing for the search team: query writer and answerer. Three layouts (SearchTeamEnv's
`layout`): "transcript" (default; transcript_messages, agents.team_transcript: one team conversation, so every
turn extends the last), "per_role" (role_messages, agents.role_conversation: each role its own growing chat,
the results and the other role's words as new messages) and "message" (build_messages: each role its own
system prompt and the history folded into one user message, the parsed query in place of the query writer's
reply)."""
from __future__ import annotations

import re

from agents import role_conversation, team_transcript

SYSTEM = {
    "query_writer": "You write search queries. Reply with one short query on a single line: Query: <words>",
    "answerer": "You answer questions from search results. If the results contain the answer, reply "
                "'Answer: <short answer>'. If you need more information, reply 'Search again: <what is missing>'.",
}
LABEL = {"query_writer": "Query", "results": "Search results", "answerer": "Answerer"}
TASK = {"query_writer": "Write the next search query.", "answerer": "Answer, or ask to search again."}


def build_messages(role: str, question: str, history: list[tuple[str, str]]) -> list[dict]:
    parts = [f"Question: {question}"] + [f"{LABEL[w]}:\n{t.strip()}" for w, t in history] + [TASK[role]]
    return [{"role": "system", "content": SYSTEM[role]}, {"role": "user", "content": "\n\n".join(parts)}]


TEAM_SYSTEM = "You are a search team of a query writer and an answerer, taking turns. Each message says whose turn it is."
ASK = {"query_writer": "Query writer: reply with one short query on a single line: Query: <words>",
       "answerer": "Answerer: if the results contain the answer, reply 'Answer: <short answer>'; if you need more "
                   "information, reply 'Search again: <what is missing>'."}


def transcript_messages(role: str, question: str, history: list[tuple[str, str]]) -> list[dict]:
    """The team as one conversation up to `role`'s turn (agents.team_transcript): history's "results"
    entries are the engine's, the others the roles' replies, verbatim."""
    return team_transcript(TEAM_SYSTEM, f"Question: {question}", history, ASK, {"results": "Search results"}, role)


def role_messages(role: str, question: str, history: list[tuple[str, str]]) -> list[dict]:
    """`role`'s own conversation up to its turn (agents.role_conversation)."""
    return role_conversation(SYSTEM[role], f"Question: {question}", history, TASK[role], LABEL, role)


LAYOUTS = {"transcript": transcript_messages, "per_role": role_messages, "message": build_messages}


# Replies are untrusted text: every parser below never raises and runs in linear time. Quantifiers
# that sit next to each other on the same characters are possessive (`\s*+`), so "Query" + 30k
# spaces cannot backtrack.
_QUERY = re.compile(r"query\s*+:\s*+([^\n]*)", re.IGNORECASE)
_ANSWER = re.compile(r"answer\s*+:\s*+([^\n]*)", re.IGNORECASE)
_SEARCH_AGAIN = re.compile(r"search\s++again", re.IGNORECASE)
MAX_QUERY_CHARS = 200


def parse_query(text: str) -> str:
    """The query after the last non-empty 'Query:'; without any 'Query:', the first non-empty line.
    "" when there is none (the env then searches nothing)."""
    if not isinstance(text, str):
        return ""
    found, q = False, ""
    for m in _QUERY.finditer(text):
        found = True
        if m.group(1).strip():
            q = m.group(1)
    if not found:
        q = next((line for line in text.splitlines() if line.strip()), "")
    return q.strip().strip('"').strip()[:MAX_QUERY_CHARS]


def parse_answer(text: str) -> str | None:
    """The answer after the last 'Answer:', or None when the answerer asks to search again / gives
    none (an empty 'Answer:' is none)."""
    if not isinstance(text, str) or _SEARCH_AGAIN.search(text):
        return None
    last = None
    for last in _ANSWER.finditer(text):
        pass
    if last is None:
        return None
    return last.group(1).strip().strip(".").strip() or None
