"""The search team: query writer -> search (the env: BM25 over a local corpus) -> answerer, with
query-refinement cycles.

    query_writer  writes a query; the env retrieves the top-k passages and appends them
    answerer      'Answer: x' ends the episode; 'Search again: ...' (or no answer) starts a new cycle
                  with the query writer, up to max_refinement_iterations cycles
Rewards per turn: answerer = QA F1 of the final answer (SQuAD normalisation) on each of its turns;
query_writer = 1 if its results contain a supporting document of the question, else 0.
Team reward = F1 of the final answer; exact match is reported too.
Prompts (`layout`, agents/search_team.py): "transcript" (default) shows the episode as one team
conversation, so every turn extends the last; "per_role" gives each role its own growing chat (the results
and the other role's words arrive as new messages), so each role's later cycle extends its earlier one;
"message": each role's own prompt with the history in one message, as before.
"""
from __future__ import annotations


from agents.search_team import LAYOUTS, parse_answer, parse_query
from data.search_data import search_tool
from envs import Prompt, need_choice, need_file, need_int
from runtime.tools import SearchTool
from rewards.qa import exact_match, f1

ROLES = ("query_writer", "answerer")


class SearchTeamEnv:
    roles = ROLES

    def __init__(self, corpus: str = "data/search_corpus.jsonl", search_k: int = 3, max_refinement_iterations: int = 2,
                 layout: str = "transcript"):
        need_file("corpus", corpus)
        self.layout = need_choice("layout", layout, tuple(LAYOUTS))
        self.max_cycles = need_int("max_refinement_iterations", max_refinement_iterations, 0, 100)
        self.tool = search_tool(corpus, need_int("search_k", search_k, 1, 1000))

    def reset(self, task):
        self.q, self.gold, self.support = task["question"], str(task["answer"]), set(task.get("support", []))
        self.history, self.turns, self.hits, self.cycles, self.final = [], [], [], 1, None
        return self._turn("query_writer")

    def _turn(self, role):
        self.role = role
        return Prompt(role, LAYOUTS[self.layout](role, self.q, self.history))

    def step(self, reply):
        self.turns.append(self.role)
        if self.role == "query_writer":
            query = parse_query(reply)
            docs = self.tool.search(query) if query else []
            self.hits.append(float(any(d["id"] in self.support for d in docs)))
            shown = query or "(empty)" if self.layout == "message" else reply  # a conversation keeps the reply verbatim
            self.history += [("query_writer", shown), ("results", SearchTool.format(docs))]
            return self._turn("answerer")
        self.history.append(("answerer", reply))
        ans = parse_answer(reply)
        if ans is not None:
            self.final = ans
            return None
        if self.cycles >= self.max_cycles:
            return None
        self.cycles += 1
        return self._turn("query_writer")

    def scripted_replies(self, task) -> list[str]:
        """A perfect team's replies for this env's corpus and search_k (module scripted_replies)."""
        return _script(task, self.tool)

    def turn_rewards(self):
        team = f1(self.final, self.gold) if self.final is not None else 0.0
        hits = iter(self.hits)
        return [next(hits) if r == "query_writer" else team for r in self.turns]

    def metrics(self):
        team = f1(self.final, self.gold) if self.final is not None else 0.0
        return {"f1": team, "em": exact_match(self.final, self.gold) if self.final is not None else 0.0,
                "team_reward": team, "final_correct": team, "retrieval_hit": max(self.hits, default=0.0),
                "cycles": self.cycles, "no_answer": float(self.final is None)}


def _missing(doc: dict) -> str:
    """What the answerer asks the next search for: the fact the next document of the chain holds."""
    kind, title = doc["id"].rstrip("0123456789_"), doc["title"]
    return {"person": f"where was {title} born?", "city": f"which country is {title} in?",
            "country": f"what is the capital of {title}?"}.get(kind, f"more about {title}")


def scripted_replies(task, corpus: str = "data/search_corpus.jsonl", search_k: int = 3) -> list[str]:
    """A perfect team's replies, in turn order, walking the task's chain of supporting documents
    (data/search_data.py: the city for a 1-hop question; person -> city -> country for a 2-hop one)
    with only what each role sees: the query writer names the chain's next entity (in the question,
    or in the results so far), the answerer asks for the missing fact ('Search again: ...') until every
    supporting document has come up, then answers 'Answer: <gold>' (which those results state). The
    searches are replayed here (BM25 over `corpus` with `search_k`, the env's defaults) to know when
    that is. A task whose chain cannot be walked that way (an entity named nowhere visible, a document
    its search misses) has no scripted play: [].

    A 2-hop question takes 3 cycles unless the city's search also brings up its country (the city is
    the capital): with max_refinement_iterations=2 (the env's cycles) the episode ends at the second
    'Search again' unanswered, as a real team's would. `SearchTeamEnv.scripted_replies(task)` plays
    with that env's own corpus and search_k."""
    return _script(task, search_tool(corpus, search_k))


def _script(task, tool: SearchTool) -> list[str]:
    by_id = {d["id"]: d for d in tool.docs}
    chain = [by_id.get(str(s)) for s in task.get("support") or []]
    if not chain or any(d is None for d in chain):
        return []
    need, found, seen = {d["id"] for d in chain}, set(), str(task["question"])
    replies = []
    for doc in chain:
        if doc["id"] in found:
            continue
        if doc["title"].lower() not in seen.lower():
            return []
        replies.append(f"Query: {doc['title']}")
        docs = tool.search(doc["title"])
        if doc["id"] not in {d["id"] for d in docs}:
            return []
        found |= {d["id"] for d in docs}
        seen += "\n" + SearchTool.format(docs)
        if need <= found:
            return replies + [f"Answer: {task['answer']}"] if str(task["answer"]).lower() in seen.lower() else []
        replies.append(f"Search again: {_missing(next(d for d in chain if d['id'] not in found))}")
    return []
