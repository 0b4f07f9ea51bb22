"""A small offline multi-hop QA set for the search workflow, generated with a fixed seed.

A made-up world (so no model can answer from memory): countries with capitals, cities in
countries, people born in cities. Documents describe one entity each; questions need one hop
("In which country is Vorla?") or two ("What is the capital of the country where Ana Brell was
born?"). Each question lists the ids of the documents that support it.

    python data/search_data.py   # writes data/search_{corpus,train,val}.jsonl, data/search_world_*.jsonl and
                                 # (data/research_data.py) research_{train,val}.jsonl + its documents in the corpus,
                                 # and research_world_*.jsonl

data/search_{corpus,train,val}.jsonl is the small world (12 countries, 60 people: 78 train and 30 val
questions) the search, react and research configs use; data/search_world_*.jsonl is a larger one of the
same kind (30 countries, 180 people, seed 1: 100 train and 200 val questions), for a val set that can
measure a recipe (configs/cpu/search.py).

The questions load with data.math_data.load_math (rows {"question", "answer", "support", "hops"});
the corpus with `load_corpus`, which checks every document before the BM25 index is built.
"""
import functools
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from data.math_data import DataError, read_rows, write_jsonl  # noqa: E402

SYL = ["ka", "lo", "mi", "ren", "sa", "tor", "vel", "qui", "zan", "bo", "dri", "fel", "gar", "hul", "ix", "jor", "ne",
       "pa", "ru", "sol", "tem", "ul", "wes", "yr"]
JOBS = ["baker", "painter", "engineer", "sailor", "teacher", "farmer", "poet", "doctor"]


def name(rng, n=2):
    return "".join(rng.choice(SYL) for _ in range(n)).capitalize()


def generate(seed=0, n_countries=12, cities_per=4, n_people=60):
    rng = random.Random(seed)
    used, docs, qs = set(), [], []

    def fresh(n=2):
        while True:
            x = name(rng, n)
            if x not in used:
                used.add(x)
                return x
    countries = []
    for i in range(n_countries):
        c = fresh(3)
        cities = [fresh() for _ in range(cities_per)]
        capital = cities[0]
        countries.append((c, capital, cities))
        docs.append({"id": f"country{i}", "title": c, "text": f"{c} is a country. Its capital is {capital}. It has "
                                                               f"{len(cities)} large cities."})
        for j, city in enumerate(cities):
            docs.append({"id": f"city{i}_{j}", "title": city, "text": f"{city} is a city in {c}, known for its "
                                                                     f"{rng.choice(['river', 'market', 'towers', 'port', 'gardens'])}."})
            qs.append({"question": f"In which country is the city of {city}?", "answer": c, "support": [f"city{i}_{j}"],
                       "hops": 1})
    for k in range(n_people):
        i, j = rng.randrange(n_countries), rng.randrange(cities_per)
        c, capital, cities = countries[i]
        person = f"{fresh()} {fresh()}"
        docs.append({"id": f"person{k}", "title": person, "text": f"{person} is a {rng.choice(JOBS)} who was born in "
                                                                   f"{cities[j]}."})
        qs.append({"question": f"What is the capital of the country where {person} was born?", "answer": capital,
                   "support": [f"person{k}", f"city{i}_{j}", f"country{i}"], "hops": 2})
    rng.shuffle(qs)
    return docs, qs


def load_corpus(path) -> list[dict]:
    """The documents [{"id", "title", "text"}, ...] of a .jsonl/.json corpus, checked: every row an
    object with string fields id (unique, non-empty), title and text. Raises DataError naming
    `file:line` and the field (FileNotFoundError when the file does not exist)."""
    docs, seen = [], {}
    for where, row in read_rows(path, "search corpus"):
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object (a document with 'id', 'title', 'text'), "
                            f"got {type(row).__name__}")
        for field in ("id", "title", "text"):
            if field not in row:
                raise DataError(f"{where}: missing field {field!r}; has {sorted(row)}")
            if not isinstance(row[field], str):
                raise DataError(f"{where}: field {field!r} must be a string, got {type(row[field]).__name__}")
        if not row["id"].strip():
            raise DataError(f"{where}: field 'id' is empty")
        if row["id"] in seen:
            raise DataError(f"{where}: field 'id' {row['id'][:80]!r} repeats the document at {seen[row['id']]}")
        if not (row["title"].strip() or row["text"].strip()):
            raise DataError(f"{where}: fields 'title' and 'text' are both empty (nothing to search)")
        seen[row["id"]] = where
        docs.append(row)
    return docs


WORLDS = {"search": ({}, 30), "search_world": ({"seed": 1, "n_countries": 30, "n_people": 180}, 200)}
"""file prefix -> (generate's arguments, val questions). data/research_data.py builds on the small world with
generate()'s defaults, so "search" keeps none."""
HERE = os.path.dirname(os.path.abspath(__file__))


def write(dirpath: str = HERE) -> None:
    """Every file of the made-up worlds into dirpath, seeded (the shipped ones are this output): per WORLDS entry
    <prefix>_{corpus,train,val}.jsonl, then data/research_data.write, whose documents follow the small world's in
    search_corpus.jsonl (rewriting that world alone would drop them). research_data imports this module, so it runs
    as a process here, not an import."""
    assert WORLDS["search"][0] == {}, "data/research_data.py builds on generate()'s defaults"
    for prefix, (kw, n_val) in WORLDS.items():
        docs, qs = generate(**kw)
        for name_, rows in (("corpus", docs), ("train", qs[:-n_val]), ("val", qs[-n_val:])):
            write_jsonl(rows, os.path.join(dirpath, f"{prefix}_{name_}.jsonl"))
        print(f"{prefix}: {len(docs)} documents, {len(qs) - n_val} train and {n_val} val questions")
    subprocess.run([sys.executable, os.path.join(HERE, "research_data.py"), dirpath], check=True)


if __name__ == "__main__":
    write()


@functools.lru_cache(maxsize=4)
def search_tool(corpus_path: str = "data/search_corpus.jsonl", k: int = 3):
    """The BM25 search tool (runtime.tools.SearchTool) over a corpus file, built once per (path, k); a bad
    corpus is a DataError naming file:line and the field."""
    from runtime.tools import SearchTool
    return SearchTool(load_corpus(corpus_path), k=int(k))
