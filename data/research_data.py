"""3- and 4-hop questions over the made-up world of data/search_data.py, for the deep-research team
(envs/research.py), and a loader for them and for HotpotQA-format files.

The world gains companies (founded by one of its people, with headquarters in one of its cities)
and products (made by a company). Each question needs a chain of documents, one hop per document,
and lists their ids in "support" (in chain order):

    3 hops  In which country was the founder of {company} born?           company, person, city
            In which country are the headquarters of the company that makes {product}?
                                                                           product, company, city
    4 hops  What is the capital of the country where the founder of {company} was born?
                                                                           company, person, city, country
            What is the capital of the country where the company that makes {product} has its
            headquarters?                                                  product, company, city, country

    python data/research_data.py   # rewrites data/search_corpus.jsonl as search_data.py's small world (120
                                   # documents, unchanged) + these 40, and writes research_{train,val}.jsonl;
                                   # and research_world_{corpus,train,val}.jsonl (below)
                                   # (python data/search_data.py writes every world's files, these included)

Two sets: the small one (20 companies and 20 products over the small world: 60 train and 20 val questions) and
a larger one, research_world_*.jsonl (LARGER: 60 companies and 60 products over search_data's larger world of 30
countries and 180 people: 140 train and 100 val questions, 450 documents), for a val set that can measure a
recipe (configs/cpu/research.py). Its val questions are new questions, not new facts: 26 of the 100 share a
train question's chain after the first hop (10 of the small set's 20), and 92 of their answers are train answers
too (there are 30 countries); the first entity, and so the first search, is never one train asks about.

Train and val are disjoint by the question's first entity: a company or product asked about in
val is never asked about in train. Everything is seeded: generate(seed) is the same every time.

`load_research(spec)` reads either format, detected per row:
    ours      {"question", "answer", "support": [doc ids], "hops"}   (documents: the env's corpus)
    HotpotQA  {"question", "answer", "supporting_facts", "context"}  (the official JSON list or JSONL,
              lists of [title, ...] pairs, or the Hugging Face export's dicts of lists). Each task
              carries its own documents ("docs": one per context paragraph, id "p0", "p1", ...) and
              "support" = the ids of the supporting paragraphs' titles.
A bad row raises DataError naming file:line and the field.
"""
from __future__ import annotations

import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from data.math_data import DataError, read_rows
from data.search_data import SYL, WORLDS
from data.search_data import generate as generate_world

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ["lamp", "boat", "clock", "bicycle", "radio", "kettle", "loom", "telescope"]
SUFFIX = ["Works", "Guild", "Trading", "Foundry"]
N_VAL_HEADS = 5  # companies and products whose questions go to val (each)
LARGER = {"n_companies": 60, "n_products": 60, "n_val_heads": 25, "world": WORLDS["search_world"][0]}
"""generate's arguments for research_world_*.jsonl: 25 + 25 val heads, 2 questions each = 100 val questions."""


def generate(seed: int = 1, n_companies: int = 20, n_products: int = 20, world: dict | None = None,
             n_val_heads: int = N_VAL_HEADS):
    """(new documents, train questions, val questions). The world (countries, cities, people) is
    search_data.generate(**world): by default the small one data/search_corpus.jsonl ships. The questions about
    n_val_heads companies and n_val_heads products go to val."""
    docs0, qs0 = generate_world(**(world or {}))
    title = {d["id"]: d["title"] for d in docs0}
    born = {q["support"][0]: q["support"][1] for q in qs0 if q["hops"] == 2}  # person id -> city id
    persons, cities = sorted(born, key=lambda x: int(x[6:])), sorted(i for i in title if i.startswith("city"))
    country_of = {c: "country" + c[4:].split("_")[0] for c in cities}
    capital = {k: title[k.replace("country", "city") + "_0"] for k in set(country_of.values())}
    rng = random.Random(seed)
    used = {w for d in docs0 for w in d["title"].split()}
    free = len({(a + b).capitalize() for a in SYL for b in SYL} - used)  # fresh(2) would otherwise loop forever
    if n_companies > free:
        raise ValueError(f"research_data.generate: {n_companies} companies, but the world leaves {free} two-syllable "
                         f"names free")

    def fresh(n):
        while True:
            x = "".join(rng.choice(SYL) for _ in range(n)).capitalize()
            if x not in used:
                used.add(x)
                return x

    docs, heads = [], []  # heads: (head kind, head index, [(question, answer, support)])
    companies = []
    for n in range(n_companies):
        name_, founder, hq = f"{fresh(2)} {rng.choice(SUFFIX)}", rng.choice(persons), rng.choice(cities)
        cid = f"company{n}"
        companies.append((cid, name_, founder, hq))
        docs.append({"id": cid, "title": name_, "text": f"{name_} is a company founded by {title[founder]}. "
                                                        f"Its headquarters are in {title[hq]}."})
        city, country = born[founder], country_of[born[founder]]
        heads.append(("company", n, [
            (f"In which country was the founder of {name_} born?", title[country], [cid, founder, city], 3),
            (f"What is the capital of the country where the founder of {name_} was born?", capital[country],
             [cid, founder, city, country], 4)]))
    for n in range(n_products):
        name_, kind = fresh(3), rng.choice(KINDS)
        cid, cname, _, hq = rng.choice(companies)
        pid = f"product{n}"
        docs.append({"id": pid, "title": name_, "text": f"{name_} is a {kind} made by {cname}."})
        country = country_of[hq]
        heads.append(("product", n, [
            (f"In which country are the headquarters of the company that makes {name_}?", title[country],
             [pid, cid, hq], 3),
            (f"What is the capital of the country where the company that makes {name_} has its headquarters?",
             capital[country], [pid, cid, hq, country], 4)]))
    val_heads = {("company", i) for i in rng.sample(range(n_companies), n_val_heads)} | \
                {("product", i) for i in rng.sample(range(n_products), n_val_heads)}
    train, val = [], []
    for kind, i, qs in heads:
        for q, a, support, hops in qs:
            (val if (kind, i) in val_heads else train).append({"question": q, "answer": a, "support": support,
                                                                "hops": hops})
    rng.shuffle(train)
    rng.shuffle(val)
    return docs, train, val


# --------------------------------------------------------------------------------------------
# loading: our rows and HotpotQA's


def _pairs(v, keys, where, field):
    """HotpotQA's [[a, b], ...] or the HF export's {keys[0]: [...], keys[1]: [...]} as [(a, b)]."""
    if isinstance(v, dict):
        if not all(k in v and isinstance(v[k], list) for k in keys) or len(v[keys[0]]) != len(v[keys[1]]):
            raise DataError(f"{where}: field {field!r} must map {keys[0]!r} and {keys[1]!r} to lists of one length")
        return list(zip(v[keys[0]], v[keys[1]]))
    if not isinstance(v, list) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in v):
        raise DataError(f"{where}: field {field!r} must be a list of [{keys[0]}, {keys[1]}] pairs, "
                        f"got {type(v).__name__}")
    return [tuple(p) for p in v]


def _text(v, where, field) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int, float)) or (isinstance(v, str) and not v.strip()):
        raise DataError(f"{where}: field {field!r} must be a non-empty string, got {type(v).__name__}")
    if isinstance(v, float) and v != v:
        raise DataError(f"{where}: field {field!r} is NaN")
    return str(v)


def _hotpot(row, where) -> dict:
    ctx = _pairs(row["context"], ("title", "sentences"), where, "context")
    docs, id_of = [], {}
    for i, (t, sents) in enumerate(ctx):
        if not isinstance(t, str) or not isinstance(sents, list) or not all(isinstance(s, str) for s in sents):
            raise DataError(f"{where}: field 'context'[{i}] must be [title, [sentences]]")
        if t in id_of:
            continue  # a repeated paragraph title: the first one stands
        id_of[t] = f"p{len(docs)}"
        docs.append({"id": id_of[t], "title": t, "text": " ".join(s.strip() for s in sents)})
    support = []
    for t, _ in _pairs(row["supporting_facts"], ("title", "sent_id"), where, "supporting_facts"):
        if t not in id_of:
            raise DataError(f"{where}: field 'supporting_facts' names {str(t)[:80]!r}, which is no 'context' title")
        if id_of[t] not in support:
            support.append(id_of[t])
    if not support:
        raise DataError(f"{where}: field 'supporting_facts' is empty")
    return {"question": _text(row["question"], where, "question"), "answer": _text(row["answer"], where, "answer"),
            "support": support, "hops": len(support), "docs": docs,
            "id": str(row.get("_id", row.get("id", where)))}


def load_research(spec: str) -> list[dict]:
    """Tasks from a .jsonl/.json file in our format or HotpotQA's (see the module docstring)."""
    tasks = []
    for where, row in read_rows(spec, "research data"):
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        for f in ("question", "answer"):
            if f not in row:
                raise DataError(f"{where}: missing field {f!r}; has {sorted(row)[:12]}")
        if "context" in row or "supporting_facts" in row:
            for f in ("context", "supporting_facts"):
                if f not in row:
                    raise DataError(f"{where}: a HotpotQA row needs field {f!r}")
            tasks.append(_hotpot(row, where))
            continue
        sup = row.get("support")
        if not isinstance(sup, list) or not sup or not all(isinstance(s, str) and s.strip() for s in sup):
            raise DataError(f"{where}: field 'support' must be a non-empty list of document ids (strings); got "
                            f"{type(sup).__name__ if sup is not None else 'nothing'}")
        hops = row.get("hops", len(sup))
        if isinstance(hops, bool) or not isinstance(hops, int):
            raise DataError(f"{where}: field 'hops' must be an integer, got {type(hops).__name__}")
        tasks.append({"question": _text(row["question"], where, "question"),
                      "answer": _text(row["answer"], where, "answer"), "support": list(sup), "hops": hops})
    return tasks


def write(seed: int = 1, dirpath: str = HERE) -> list[tuple[str, int, int, int]]:
    """dirpath/search_corpus.jsonl = search_data's small world's documents + ours, research_{train,val}.jsonl;
    research_world_corpus.jsonl = the larger world's documents + LARGER's, research_world_{train,val}.jsonl.
    Returns (corpus file, documents, train, val) per set."""
    out = []
    for corpus, prefix, kw in (("search_corpus", "research", {}), ("research_world_corpus", "research_world", LARGER)):
        docs, train, val = generate(seed, **kw)
        everything = generate_world(**kw.get("world", {}))[0] + docs
        for name_, rows in ((corpus, everything), (f"{prefix}_train", train), (f"{prefix}_val", val)):
            with open(os.path.join(dirpath, f"{name_}.jsonl"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        out.append((corpus, len(everything), len(train), len(val)))
    return out


if __name__ == "__main__":  # python data/research_data.py [DIR]
    for corpus, n, a, b in write(dirpath=sys.argv[1] if len(sys.argv) > 1 else HERE):
        print(f"{corpus}.jsonl: {n} documents; {a} train and {b} val questions")
