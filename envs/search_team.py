"""The search team: query writer -> search (the env: BM25 over a local corpus) -> answerer, with
query-refinement cycles.

    query_writer  writes a query; the env retrieves the top-k passages and appends them
    answerer      'Answer: x' ends the episode; 'Search again: ...' (or no answer) starts a new cycle
                  with the query writer, up to max_refinement_iterations cycles
Rewards per turn: answerer = QA F1 of the final answer (SQuAD normalisation) on each of its turns;
query_writer = 1 if its results contain a supporting document of the question, else 0.
Team reward = F1 of the final answer; exact match is reported too.
"""
from __future__ import annotations


from agents.search_team import build_messages, parse_answer, parse_query
from data.search_data import search_tool
from envs import Prompt, need_file, need_int
from envs.tools import SearchTool
from rewards.qa import exact_match, f1

ROLES = ("query_writer", "answerer")


class SearchTeamEnv:
    roles = ROLES

    def __init__(self, corpus: str = "data/search_corpus.jsonl", search_k: int = 3, max_refinement_iterations: int = 2):
        need_file("corpus", corpus)
        self.max_cycles = need_int("max_refinement_iterations", max_refinement_iterations, 0, 100)
        self.tool = search_tool(corpus, need_int("search_k", search_k, 1, 1000))

    def reset(self, task):
        self.q, self.gold, self.support = task["question"], str(task["answer"]), set(task.get("support", []))
        self.history, self.turns, self.hits, self.cycles, self.final = [], [], [], 1, None
        return self._turn("query_writer")

    def _turn(self, role):
        self.role = role
        return Prompt(role, build_messages(role, self.q, self.history))

    def step(self, reply):
        self.turns.append(self.role)
        if self.role == "query_writer":
            query = parse_query(reply)
            docs = self.tool.search(query) if query else []
            self.hits.append(float(any(d["id"] in self.support for d in docs)))
            self.history += [("query_writer", query or "(empty)"), ("results", SearchTool.format(docs))]
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

    def turn_rewards(self):
        team = f1(self.final, self.gold) if self.final is not None else 0.0
        hits = iter(self.hits)
        return [next(hits) if r == "query_writer" else team for r in self.turns]

    def metrics(self):
        team = f1(self.final, self.gold) if self.final is not None else 0.0
        return {"f1": team, "em": exact_match(self.final, self.gold) if self.final is not None else 0.0,
                "team_reward": team, "final_correct": team, "retrieval_hit": max(self.hits, default=0.0),
                "cycles": self.cycles, "no_answer": float(self.final is None)}
