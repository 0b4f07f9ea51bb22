"""Prompts and parsing for the search team: query writer and answerer."""
from __future__ import annotations

import re

SYSTEM = {
    "query_writer": "You write search queries. Reply with one short query on a single line: Query: <words>",
    "answerer": "You answer questions from search results. If the results contain the answer, reply "
                "'Answer: <short answer>'. If you need more information, reply 'Search again: <what is missing>'.",
}


def build_messages(role: str, question: str, history: list[tuple[str, str]]) -> list[dict]:
    labels = {"query_writer": "Query", "results": "Search results", "answerer": "Answerer"}
    parts = [f"Question: {question}"] + [f"{labels[w]}:\n{t.strip()}" for w, t in history]
    parts.append("Write the next search query." if role == "query_writer" else "Answer, or ask to search again.")
    return [{"role": "system", "content": SYSTEM[role]}, {"role": "user", "content": "\n\n".join(parts)}]


def parse_query(text: str) -> str:
    m = re.findall(r"query\s*:\s*(.+)", text, re.IGNORECASE)
    q = (m[-1] if m else text).strip().splitlines()[0] if (m or text.strip()) else ""
    return q.strip().strip('"')[:200]


def parse_answer(text: str) -> str | None:
    """The answer after 'Answer:', or None when the answerer asks to search again / gives none."""
    if re.search(r"search\s+again", text, re.IGNORECASE):
        return None
    m = re.findall(r"answer\s*:\s*(.+)", text, re.IGNORECASE)
    return m[-1].strip().strip(".").strip() if m else None
