"""A small offline multi-hop QA set for the search workflow, generated with a fixed seed.

A made-up world (so no model can answer from memory): countries with capitals, cities in
countries, people born in cities. Documents describe one entity each; questions need one hop
("In which country is Vorla?") or two ("What is the capital of the country where Ana Brell was
born?"). Each question lists the ids of the documents that support it.

    python data/search_data.py   # writes data/search_{corpus,train,val}.jsonl
"""
import json
import os
import random

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


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    docs, qs = generate()
    for name_, rows in (("search_corpus", docs), ("search_train", qs[:-30]), ("search_val", qs[-30:])):
        with open(os.path.join(here, f"{name_}.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"{len(docs)} documents, {len(qs) - 30} train and 30 val questions")
