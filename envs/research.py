"""Deep research: a planner splits a multi-hop question into sub-questions, a researcher works
through each one with tools (search, read a document by id, take a note; a few rounds each), and a
writer answers with citations to document ids.

    planner      one turn: a numbered list of sub-questions (agents/research_team.parse_plan; at
                 most max_sub_questions; none -> the question itself is researched, planner paid 0)
    researcher   for each sub-question in order, up to max_rounds turns, one action each:
                   search[words]  -> the top-k documents' ids and titles (BM25 over the corpus)
                   read_doc[id]   -> that document's text
                   note[text]     -> the note is kept and this sub-question ends
                 a reply with no action is taken as its note; a malformed action or an unknown id
                 is an error observation (it costs a round). All sub-questions share the one
                 "researcher" role (one adapter); each sees the notes of the ones before it, and its
                 own rounds extend one conversation (rollout.merge_turns can train them as one).
                 `parallel` (off by default): every sub-question's researcher starts at once, seeing
                 the plan and no other researcher's notes, and their rounds are handed out together (one
                 engine call a round for all of them, not one a round each); for plans whose
                 sub-questions stand alone (a comparison), not for a chain whose later hops need the
                 earlier answers ("that person": the made-up world's questions are such chains).
                 `layout`: "per_sub" (default) starts each sub-question's conversation afresh (the notes
                 so far in its first message); "per_role" keeps ONE researcher conversation through the
                 sub-questions in turn (the next sub-question arrives as a new message after its last
                 note), so all its turns extend one another: the prefix cache reuses the whole episode and
                 algo.pack_turns packs them in one row (not rollout.merge_turns, which would pay every
                 sub-question the last one's reward: check_config refuses it).
                 Each turn's Prompt.key is its place, ("sub", i, round) (the planner's ("plan",), the
                 writer's ("write",)): algo.group_by_turn compares sub-question i across a task's chains
                 however many rounds the earlier ones took.
    writer       one turn: 'Answer: ...' and citations '[doc id]' (agents/research_team.parse_report)

Rewards, against the task's gold answer and supporting documents S (its "support" ids):
    writer       EM(answer) * ((1 - citation_weight) + citation_weight * F1(citations)), where the
                 citations' precision = |cited ∩ S| / |cited| and recall = |cited ∩ S| / |S|: the
                 citations decide a share of a right answer's reward and earn nothing beside a wrong one
                 (an additive mix with F1(answer) paid a constant wrong answer for its citations, and RL
                 collapsed the writer onto it; F1 in the gate would pay a hedge, 'Answer: <country>
                 <capital>' earning 2/3 on any question whose chain was read). Exact match is SQuAD's
                 (case, articles and punctuation aside), as Search-R1's reward; F1 is logged beside it.
    researcher   every round of sub-question i: (1 - note_weight) * (0.5 * [a document of S not read
                 before i appeared in its search results] + 0.5 * [it read such a document])
                 + note_weight * [its note names where such a newly read document leads (another
                 supporting document's title or the answer that its text names and the question does not:
                 the next hop's entity; a document that leads nowhere, the read itself pays) and names no
                 document title it had not seen (the question, earlier precise notes, what it read);
                 names match as SQuAD-normalised runs of whole words]. note_weight (default 1/3: the
                 three count alike) pays the note, the one thing of its work the writer sees: without it
                 (0: the reward before 2026-11-27) RL on the recipe kept the searching and reading and lost
                 the answer from the notes (val episodes whose notes held the answer: 9/20 -> 0/20, the
                 recipe run of 2026-11-27 in docs/recipes.md), and the writer only copies what they hold.
                 round_credit (off by default): each round earns what it did instead, 1 or 0: a search
                 whose results list a supporting document not read before i nor listed by its earlier
                 searches, that the sub-question then reads (a find never read earns nothing, so
                 searching alone cannot farm it), a read of such a document, a note as above (an error:
                 0). For training the rounds as separate sequences, grouped round for round
                 (rollout.merge_turns False, algo.group_by_turn True: check_config says so). Built to
                 test whether the note, sharing one sub-question reward with the search, rode on its
                 credit (RL on the recipe moved every note of a company's document to its first
                 sentence); run on the recipe (2026-11-29, docs/recipes.md) it shifted the notes the same.
    planner      [the team reached the answer: a precise note names it or the writer's answer matches]
                 * the harmonic mean of precision = (sub-questions whose researcher read a new document of
                 S) / (sub-questions) and recall = |documents of S read by all researchers| / |S|.
                 The gate (planner_gate, default on) is there because F1 alone pays dropping a hop that
                 failed: a four-hop chain planned as 3 sub-questions, all read, earns 0.86, and as 4 whose
                 last was missed 0.75; RL on the recipe (2026-11-29, docs/recipes.md) learned to plan 3 for
                 36 of 50 four-hop questions, which then scored 0.06. Gated, neither earns anything, and the
                 plan that reaches the answer earns the most. planner_gate=false: the reward before.
Team reward = the writer's. Metrics: f1, em, cite_precision / cite_recall / cite_f1,
support_retrieved / support_read (fractions of S), facts_noted (of the supporting documents that lead
somewhere, the fraction whose lead a precise note names; 1 where none does), answer_noted (a precise note names the answer),
each role's reward, sub_questions, rounds,
tool_errors, no_answer, no_plan, hops; `aggregate` adds micro-averaged citation precision / recall
and F1 per number of hops.

Documents: the corpus file (`corpus`, default data/search_corpus.jsonl: the made-up world), or a
task's own "docs" (HotpotQA tasks from data/research_data.load_research bring their paragraphs).
Config (two files: this + configs/research.py): data.env="envs.research:ResearchEnv", the knobs in
data.env_kwargs (corpus, search_k, max_sub_questions, max_rounds, citation_weight, note_weight,
planner_gate, round_credit).
"""
from __future__ import annotations

import copy
import re
from functools import lru_cache

from agents.research_team import (clean_doc_id, next_sub_message, observation_message, parse_plan, parse_report,
                                  planner_messages, researcher_messages, writer_messages)
from data.research_data import load_research
from envs import Prompt, need_choice, need_file
from data.search_data import search_tool
from runtime.tools import MAX_OBS, SearchTool, Tool, ToolCall, parse_tool_call
from rewards.qa import exact_match, f1, normalize_answer

ROLES = ("planner", "researcher", "writer")


def _arg(name, desc):
    return {"type": "object", "properties": {name: {"type": "string", "description": desc}}, "required": [name]}


# the researcher's tools: the env runs them itself (they read and write the episode's state)
TOOLS = [Tool("search", "List the documents that match the words: their ids and titles.", _arg("query", "words"),
              lambda a: ""),
         Tool("read_doc", "Show the text of a document by its id.", _arg("id", "a document id"), lambda a: ""),
         Tool("note", "Record what you found (with the document id); ends your sub-question.",
              _arg("text", "the finding"), lambda a: "")]


@lru_cache(maxsize=4)
def _corpus(path: str, k: int) -> tuple[SearchTool, dict]:
    tool = search_tool(path, k)  # a bad corpus: DataError naming file:line and the field
    return tool, {d["id"]: d for d in tool.docs}


def _titles(docs) -> tuple[str, ...]:
    """The documents' titles, SQuAD-normalised (what a note may name)."""
    return tuple({n for d in docs if (n := normalize_answer(d["title"]))})


@lru_cache(maxsize=4)
def _corpus_titles(path: str, k: int) -> tuple[str, ...]:
    return _titles(_corpus(path, k)[1].values())


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r else 0.0


def _names(text: str, name: str) -> bool:
    """Whether `text` names `name`: after SQuAD normalisation (case, punctuation, articles), the name's words
    appear in the text as a contiguous run of whole words ("Yrwes-Foundry" does not name "Yrwes Foundry")."""
    n = normalize_answer(name)
    return bool(n) and f" {n} " in f" {normalize_answer(text)} "


class ResearchEnv:
    roles = ROLES

    def __init__(self, corpus: str = "data/search_corpus.jsonl", search_k: int = 3, max_sub_questions: int = 4,
                 max_rounds: int = 3, citation_weight: float = 0.5, max_doc_chars: int = 1200,
                 note_weight: float = 1 / 3, planner_gate: bool = True, round_credit: bool = False,
                 parallel: bool = False, layout: str = "per_sub"):
        from config import ConfigError  # a ValueError that train.py prints as one line
        for name, v, lo in (("search_k", search_k, 1), ("max_sub_questions", max_sub_questions, 1),
                            ("max_rounds", max_rounds, 1), ("max_doc_chars", max_doc_chars, 50)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"config field data.env_kwargs.{name}: must be an integer >= {lo}, got {v!r}")
        for name, v in (("citation_weight", citation_weight), ("note_weight", note_weight)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ConfigError(f"config field data.env_kwargs.{name}: must be in [0, 1], got {v!r}")
        for name, v in (("planner_gate", planner_gate), ("round_credit", round_credit), ("parallel", parallel)):
            if not isinstance(v, bool):
                raise ConfigError(f"config field data.env_kwargs.{name}: must be true or false, got {v!r}")
        self.note_w, self.gate, self.round_credit, self.parallel = float(note_weight), planner_gate, round_credit, parallel
        self.per_role = need_choice("layout", layout, ("per_sub", "per_role")) == "per_role"
        if self.per_role and parallel:
            raise ConfigError("config field data.env_kwargs.layout: 'per_role' keeps one researcher conversation "
                              "through the sub-questions in turn; parallel researchers each have their own")
        self.corpus, self.k = need_file("corpus", corpus), search_k
        self.max_subs, self.max_rounds, self.w, self.max_doc = max_sub_questions, max_rounds, float(citation_weight), \
            max_doc_chars
        self.tool, self.by_id = _corpus(self.corpus, self.k)

    def scripted_replies(self, task) -> list[str]:
        """A perfect team's replies for this env's corpus, search_k and budgets (module scripted_replies), in the
        order this env hands the turns out (with `parallel`: round by round across the sub-questions)."""
        out = scripted_replies(task, self.corpus, self.k, self.max_subs, self.max_rounds)
        if not (self.parallel and out):
            return out
        subs = [out[1 + 3 * i:4 + 3 * i] for i in range((len(out) - 2) // 3)]  # search, read, note each
        return [out[0], *(sub[r] for r in range(3) for sub in subs), out[-1]]

    def fork(self):
        """A copy for ReMax's greedy twin that shares the (read-only) search index and documents."""
        return copy.deepcopy(self, {id(self.tool): self.tool, id(self.by_id): self.by_id})

    # ---------------------------------------------------------------------------------- the episode

    def reset(self, task):
        self.q, self.gold = str(task["question"]), str(task["answer"])
        self.support = list(dict.fromkeys(str(s) for s in task.get("support", [])))
        if task.get("docs"):  # a task with its own documents (HotpotQA): its own small index
            self.tool = SearchTool(list(task["docs"]), k=self.k)
            self.by_id = {d["id"]: d for d in self.tool.docs}
            self.titles = _titles(self.tool.docs)
        else:
            self.tool, self.by_id = _corpus(self.corpus, self.k)
            self.titles = _corpus_titles(self.corpus, self.k)
        self.lower_ids = {i.lower(): i for i in self.by_id}
        hops = task.get("hops")
        self.hops = hops if isinstance(hops, int) and not isinstance(hops, bool) else len(self.support)
        self.plan, self.planned, self.subs, self.turns = [], False, [], []
        self.answer, self.citations = None, []
        self.role = "planner"
        return Prompt("planner", planner_messages(self.q), key=("plan",))

    def _notes(self):
        return [(s["question"], s["note"], s["read"]) for s in self.subs if s["done"]]

    def _start_sub(self, i):
        if self.per_role and i > 0:  # the researcher's one conversation goes on with the next sub-question
            msgs = self.subs[i - 1]["messages"] + [next_sub_message(self.plan, i, self.max_rounds)]
        else:
            msgs = researcher_messages(self.q, self.plan, self._notes(), i, self.max_rounds)
        self.subs.append({"question": self.plan[i], "messages": msgs, "retrieved": [], "read": [], "note": None,
                          "rounds": 0, "errors": 0, "done": False, "acts": []})  # acts: (what, ids) a round
        self.role = "researcher"
        return Prompt("researcher", list(msgs), key=("sub", i, 0))

    def _researchers(self):
        """After the plan: the first sub-question; with `parallel`, every sub-question at once (each researcher
        sees the plan and none of the others' notes), their turns handed out together round after round."""
        if not self.parallel:
            return self._start_sub(0)
        self.active = list(range(len(self.plan)))
        return [self._start_sub(i) for i in self.active]

    def _writer(self):
        self.role = "writer"
        return Prompt("writer", writer_messages(self.q, self._notes()), key=("write",))

    def _next(self):
        """After a sub-question ends: the next one, or the writer."""
        return self._start_sub(len(self.subs)) if len(self.subs) < len(self.plan) else self._writer()

    def step(self, reply):
        replies, reply = reply, reply if isinstance(reply, str) else ""  # replies: the list a parallel round gets
        if self.role == "planner":
            self.turns.append(("planner", None))
            self.plan = parse_plan(reply, self.max_subs)
            self.planned = bool(self.plan)
            if not self.plan:
                self.plan = [self.q]
            return self._researchers()
        if self.role == "writer":
            self.turns.append(("writer", None))
            self.answer, self.citations = parse_report(reply)
            return None
        if self.parallel:  # [a reply per active sub-question, in order]: those not done go on together
            replies = list(replies) if isinstance(replies, (list, tuple)) else [reply]
            nxt = [(i, self._research(i, r if isinstance(r, str) else "")) for i, r in zip(self.active, replies)]
            self.active = [i for i, p in nxt if p is not None]
            return [p for _, p in nxt if p is not None] or self._writer()
        return self._research(len(self.subs) - 1, reply) or self._next()

    def _research(self, i: int, reply: str):
        """Sub-question i's round: its action's observation as its next prompt, or None when it is done."""
        sub = self.subs[i]
        self.turns.append(("researcher", i))
        sub["rounds"] += 1
        sub["messages"].append({"role": "assistant", "content": reply})
        call = parse_tool_call(reply, TOOLS)
        obs = None
        if call is None:  # no action: the reply is the note
            sub["note"] = " ".join(reply.split())[:300] or None
            sub["acts"].append(("note", ()))
        elif isinstance(call, str):
            obs, sub["errors"] = call, sub["errors"] + 1
            sub["acts"].append(("error", ()))
        elif call.name == "note":
            sub["note"] = " ".join(call.arguments["text"].split())[:300] or None
            sub["acts"].append(("note", ()))
        else:
            obs = self._run(call, sub)
        if obs is None or sub["rounds"] >= self.max_rounds:
            sub["done"] = True
            return None
        sub["messages"].append(observation_message(obs))
        return Prompt("researcher", list(sub["messages"]), key=("sub", i, sub["rounds"]))

    def _run(self, call: ToolCall, sub) -> str:
        if call.name == "search":
            docs = self.tool.search(call.arguments["query"][:500])
            sub["retrieved"] += [d["id"] for d in docs if d["id"] not in sub["retrieved"]]
            sub["acts"].append(("search", tuple(d["id"] for d in docs)))
            return "\n".join(f"[{d['id']}] {d['title']}" for d in docs) or "(no results)"
        want = clean_doc_id(call.arguments["id"])
        doc_id = want if want in self.by_id else self.lower_ids.get(want.lower())
        if doc_id is None:
            sub["errors"] += 1
            sub["acts"].append(("error", ()))
            return f"error: no document with id {want[:60]!r}; use an id from the search results, e.g. read_doc[<id>]"
        if doc_id not in sub["read"]:
            sub["read"].append(doc_id)
        sub["acts"].append(("read", (doc_id,)))
        d = self.by_id[doc_id]
        return f"[{doc_id}] {d['title']}: {d['text']}"[:min(self.max_doc, MAX_OBS)]

    # ---------------------------------------------------------------------------------- rewards

    def _leads(self) -> dict[str, list[str]]:
        """Where each supporting document leads: the other supporting documents' titles and the answer that its
        text names and the question does not (order-free: a chain's next hop; a HotpotQA pair in any order)."""
        sup = [x for x in self.support if x in self.by_id]
        names = [self.by_id[x]["title"] for x in sup] + [self.gold]
        return {x: [n for n in dict.fromkeys(names) if n != self.by_id[x]["title"] and _names(self.by_id[x]["text"], n)
                    and not _names(self.q, n)] for x in sup}

    def _precise(self, s, earlier_notes: list[str]) -> bool:
        """Whether sub-question s's note names no document title beyond what it had before it: the question, the
        precise notes before it, and the titles and texts of the documents it read (not its sub-question: the
        planner could list names there). A note that lists names it never read (every country and capital of
        the world, say) earns nothing for naming a lead, and a later note cannot launder it."""
        note = normalize_answer(s["note"] or "")
        if not note:
            return True
        had = normalize_answer(" ".join([self.q, *earlier_notes]
                                        + [self.by_id[d]["title"] + " " + self.by_id[d]["text"] for d in s["read"]]))
        return all(f" {t} " in f" {had} " for t in self.titles if f" {t} " in f" {note} ")

    def _scores(self):
        """Everything the rewards and metrics need, from the turns taken so far (an episode cut
        short by rollout.max_turns is scored on what it did)."""
        S = set(self.support)
        leads = self._leads()
        seen, sub_r, useful, precise_notes = set(), [], [], []  # precise_notes: a dump launders nothing later
        round_r = []  # round_credit: each round's own reward, sub-question by sub-question
        retrieved_all, read_all = set(), set()
        for s in self.subs:
            new_ret = (set(s["retrieved"]) & S) - seen
            new_read = (set(s["read"]) & S) - seen
            precise = self._precise(s, precise_notes)
            to_note = [n for x in new_read for n in leads.get(x, [])]
            # noted where what it newly read leads (a document that leads nowhere: reading it is the job)
            new_fact = precise and (any(_names(s["note"] or "", n) for n in to_note) if to_note else bool(new_read))
            if precise:
                precise_notes.append(s["note"] or "")
            sub_r.append((1 - self.note_w) * (0.5 * bool(new_ret) + 0.5 * bool(new_read)) + self.note_w * bool(new_fact))
            listed, got, rr = set(), set(), []
            for what, ids in s["acts"]:
                if what == "search":  # it lists a supporting document new to i, which i then reads
                    rr.append(float(bool((set(ids) & S & set(s["read"])) - seen - listed)))
                    listed.update(ids)
                elif what == "read":  # a supporting document new to i
                    rr.append(float(bool((set(ids) & S) - seen - got)))
                    got.update(ids)
                else:  # the note earns what the note component pays; an error, nothing
                    rr.append(float(new_fact) if what == "note" else 0.0)
            round_r.append(rr)
            useful.append(bool(new_read))
            seen |= set(s["read"])
            retrieved_all |= set(s["retrieved"])
            read_all |= set(s["read"])
        n_sub = len(self.plan) if self.planned else 0
        p = sum(useful) / n_sub if n_sub else 0.0
        r = len(read_all & S) / len(S) if S else 0.0
        em = exact_match(self.answer, self.gold) if self.answer is not None else 0.0
        answer_noted = any(_names(n, self.gold) for n in precise_notes)
        # gated: a plan earns its F1 only where the team reached the answer (a precise note names it, or the writer
        # matched it: a yes/no answer is in no note)
        planner = _f1(p, r) * (answer_noted or em > 0 or not self.gate) if self.planned else 0.0
        cited = self.citations
        hit = len(set(cited) & S)
        cp = hit / len(cited) if cited else 0.0
        cr = hit / len(S) if S else 0.0
        led = [names for names in leads.values() if names]  # the supporting documents that lead somewhere
        ans_f1 = f1(self.answer, self.gold) if self.answer is not None else 0.0
        writer = em * ((1 - self.w) + self.w * _f1(cp, cr))
        return {"planner": planner, "researcher": sub_r, "rounds": round_r, "writer": writer, "f1": ans_f1, "em": em,
                "cite_precision": cp, "cite_recall": cr, "cite_f1": _f1(cp, cr), "cited": len(cited),
                "cited_support": hit,
                "support_retrieved": len(retrieved_all & S) / len(S) if S else 0.0,
                "support_read": r, "useful_subs": sum(useful),
                "facts_noted": sum(any(_names(n, f) for n in precise_notes for f in names) for names in led) / len(led)
                if led else 1.0,  # no document leads anywhere: nothing was left to note
                "answer_noted": float(answer_noted)}

    def turn_rewards(self):
        s = self._scores()
        if not self.round_credit:
            return [s["researcher"][i] if role == "researcher" else s[role] for role, i in self.turns]
        rounds = [iter(sub) for sub in s["rounds"]]  # round_credit: each researcher turn, its sub-question's next round
        return [next(rounds[i]) if role == "researcher" else s[role] for role, i in self.turns]

    def metrics(self):
        s = self._scores()
        subs = s["researcher"]
        return {"team_reward": s["writer"], "final_correct": s["f1"], "f1": s["f1"], "em": s["em"],
                "cite_precision": s["cite_precision"], "cite_recall": s["cite_recall"], "cite_f1": s["cite_f1"],
                "support_retrieved": s["support_retrieved"], "support_read": s["support_read"],
                "facts_noted": s["facts_noted"], "answer_noted": s["answer_noted"],
                "planner_reward": s["planner"], "researcher_reward": sum(subs) / len(subs) if subs else 0.0,
                "writer_reward": s["writer"], "sub_questions": float(len(self.plan)),
                "rounds": float(sum(x["rounds"] for x in self.subs)),
                "tool_errors": float(sum(x["errors"] for x in self.subs)),
                "no_answer": float(self.answer is None), "no_plan": float(not self.planned), "hops": float(self.hops),
                # counts, for aggregate's micro averages
                "n_cited": float(s["cited"]), "n_cited_support": float(s["cited_support"]),
                "n_support": float(len(self.support))}


def check_config(cfg, grouped: tuple) -> tuple[str, str] | None:
    """round_credit and the trainer (workflows.check_roles): each round is paid for itself, so a sub-question's
    rounds must stay separate sequences (a merged one keeps only its last round's reward) and, for an estimator
    centred per group, be compared round for round (group_by_turn: ("sub", i, round))."""
    if cfg.data.env_kwargs.get("layout") == "per_role" and cfg.rollout.merge_turns:
        return ("rollout.merge_turns", "layout='per_role' keeps the researcher's sub-questions in one conversation, "
                "each paid on its own; merging it would pay every sub-question the last one's reward: set merge_turns "
                "False (algo.pack_turns still packs the turns in one row)")
    if not cfg.data.env_kwargs.get("round_credit"):
        return None
    if cfg.rollout.merge_turns:
        return ("rollout.merge_turns", "round_credit pays each researcher round for itself; merging a sub-question's "
                "rounds would train them all on the last round's reward: set merge_turns False")
    res = next((r for r in cfg.roles if r.name == "researcher"), None)
    if res is not None and cfg.estimator_of(res) in grouped and not cfg.algo.group_by_turn:
        return ("algo.group_by_turn", f"round_credit with the researcher's {cfg.estimator_of(res)!r} (centred per "
                "group): its searches, reads and notes would share one baseline; set algo.group_by_turn True")
    return None


def aggregate(episodes) -> dict:
    """Citation precision / recall summed over episodes (micro), and answer F1 per hop count."""
    ms = [e.metrics for e in episodes if e.metrics and "n_cited" in e.metrics]
    out = {"cite_precision_micro": sum(m["n_cited_support"] for m in ms) / max(1.0, sum(m["n_cited"] for m in ms)),
           "cite_recall_micro": sum(m["n_cited_support"] for m in ms) / max(1.0, sum(m["n_support"] for m in ms))}
    for h in sorted({int(m["hops"]) for m in ms}):
        group = [m["f1"] for m in ms if int(m["hops"]) == h]
        out[f"f1_{h}hop"] = sum(group) / len(group)
    return out


def load_tasks(spec: str) -> list[dict]:
    """Our rows ({"question", "answer", "support", "hops"}) or HotpotQA's; data/research_data.py."""
    return load_research(spec)


# ---------------------------------------------------------------------------------- the scripted teacher

# the question forms of data/research_data.py -> the planner's sub-questions, one per supporting document
_THAT_CITY, _THAT_COUNTRY = "In which country is that city?", "What is the capital of that country?"
_PLANS = [(re.compile(r"In which country was the founder of (.+) born\?"),
           ["Who founded {}?", "Where was that person born?", _THAT_CITY]),
          (re.compile(r"What is the capital of the country where the founder of (.+) was born\?"),
           ["Who founded {}?", "Where was that person born?", _THAT_CITY, _THAT_COUNTRY]),
          (re.compile(r"In which country are the headquarters of the company that makes (.+)\?"),
           ["Which company makes {}?", "Where are the headquarters of that company?", _THAT_CITY]),
          (re.compile(r"What is the capital of the country where the company that makes (.+) has its headquarters\?"),
           ["Which company makes {}?", "Where are the headquarters of that company?", _THAT_CITY, _THAT_COUNTRY])]


def _fact(doc: dict, target: str) -> str | None:
    """The sentence of the document that names `target` (the chain's next entity, or the answer), as a
    note that stands alone ("Its capital is X." -> "<title>'s capital is X."), with the document's id."""
    for s in re.split(r"(?<=\.)\s+", doc["text"]):
        if target.lower() in s.lower():
            if s.startswith("Its "):
                s = f"{doc['title']}'s {s[4:]}"
            elif doc["title"].lower() not in s.lower():
                s = f"{doc['title']}: {s}"
            return f"{s} [{doc['id']}]"
    return None


def scripted_replies(task, corpus: str = "data/search_corpus.jsonl", search_k: int = 3, max_sub_questions: int = 4,
                     max_rounds: int = 3) -> list[str]:
    """A perfect team's replies, in turn order, for the made-up world's 3-/4-hop questions
    (data/research_data.py): the planner splits the question into one sub-question per hop (from the
    question alone: its form and its first entity); each researcher searches the entity its
    sub-question is about (named in the question or in the note before it), reads the supporting
    document that search lists, and notes the sentence that names the next hop's entity (the last
    one: the answer) with the document's id; the writer answers from the last note and cites every
    document read. [] for a task with no such play: a question of another form (HotpotQA's), more hops
    than max_sub_questions, fewer than 3 actions per sub-question (search, read, note), or a
    supporting document its search does not list. The keywords are the env's (defaults: the env's and
    configs/research.py's); `ResearchEnv.scripted_replies(task)` plays with that env's own."""
    q, support = str(task["question"]).strip(), [str(s) for s in task.get("support") or []]
    plan = None
    for rx, subs in _PLANS:
        m = rx.fullmatch(q)
        if m and len(subs) == len(support):
            plan = [s.format(m.group(1)) for s in subs]
    if plan is None or len(plan) > max_sub_questions or max_rounds < 3:
        return []
    if task.get("docs"):  # the env searches a task's own documents
        tool = SearchTool(list(task["docs"]), k=search_k)
        by_id = {d["id"]: d for d in tool.docs}
    else:
        tool, by_id = _corpus(corpus, search_k)
    if any(s not in by_id for s in support):
        return []
    docs = [by_id[s] for s in support]
    if docs[0]["title"] not in plan[0]:
        return []
    out = ["\n".join(f"{i}. {s}" for i, s in enumerate(plan, 1))]
    for i, d in enumerate(docs):
        note = _fact(d, docs[i + 1]["title"] if i + 1 < len(docs) else str(task["answer"]))
        if note is None or d["id"] not in {x["id"] for x in tool.search(d["title"])}:
            return []
        out += [f"Action: search[{d['title']}]", f"Action: read_doc[{d['id']}]", f"Action: note[{note}]"]
    return out + [f"Answer: {task['answer']}\nCitations: " + " ".join(f"[{s}]" for s in support)]
