"""Split-information tasks: a small made-up world of facts per task, divided between two agents so that the
answer needs both halves (the split-information design of docs/experiments.md; envs/split_info.py plays
them).

Three kinds, in turn:
    chain    a two-hop lookup. One half: where three people live (or work); the other: what each of those
             cities is known for, its flag's colour (or where each of those companies is based). "What is the
             city where Zobe lives famous for?" needs Zobe's city from one half and its fame from the other
    product  one half: how many crates of which colour three people have; the other: how many pears a crate of
             each colour holds. "How many pears are in Vela's crates?" = count x per crate
    sum      one half: how many coins three people have; the other: how many three others have. "How many
             coins do Vela and Tomi have together?" = one number from each half

Which half each agent gets is drawn per task, so each agent plays both parts. Every fact of a half has the
shape of the needed one (two distractors a side), so neither half alone settles the answer: the holder of a
chain's second half can only guess among its three values, a product's or sum's half lacks a number.

A row (answers are one word: an integer, a colour, a food, a made-up city):
    {"id", "kind", "question", "answer",
     "facts": [str],                     the task's whole fact list, shuffled
     "facts_a": [int], "facts_b": [int], which facts agent A / agent B sees (indices into facts; a partition)
     "needed": [int],                    the facts the answer needs, in reasoning order (one in each half)
     "keys": [[str]],                    per needed fact: the words a message must carry to pass it on
     "work": str}                        the step from the needed facts to the answer ("4 * 7 = 28"; "" for a chain)

Splits: one seeded stream of tasks, distinct by question (a question seen before is skipped); the first 200
go to test, the next 200 to val, the next 600 to train, so no question is in two splits. Each task is its
own world (what a name's facts say in one task says nothing of another), so nothing learnt by heart carries
over from train.

    python data/split_info_data.py   # writes data/split_info_{train,val,test}.jsonl (seed 0), byte for byte
"""
from __future__ import annotations

import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from data.math_data import DataError, read_rows, write_jsonl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"test": 200, "val": 200, "train": 600}  # in the stream's order
SEED = 0
KINDS = ("chain", "product", "sum")
SYL = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]  # 70 syllables: people have 2, cities 3, companies 2 + a suffix
COLOURS = ["red", "blue", "green", "yellow", "white", "black", "orange", "purple", "brown", "gray"]
FOODS = ["figs", "cheese", "honey", "olives", "plums", "bread", "melons", "walnuts", "lemons", "rice"]
ITEMS = ["pears", "apples", "eggs", "shells", "stones", "buttons"]
BOXES = ["crates", "boxes", "bags", "baskets", "jars"]
FIRMS = ["tech", "corp", "works", "soft"]


def _names(rng: random.Random, k: int, syllables: int, suffix=("",)) -> list[str]:
    """k distinct made-up names of `syllables` syllables (4 letters for people, 6 for cities: never the same)."""
    out: list[str] = []
    while len(out) < k:
        x = ("".join(rng.choice(SYL) for _ in range(syllables)) + rng.choice(suffix)).capitalize()
        if x not in out:
            out.append(x)
    return out


def _chain(rng: random.Random):
    """(question, answer, first half, second half, needed (first, second), keys, work): index 0 of each half is
    needed."""
    style = rng.choice(("flag", "food", "firm"))
    people = _names(rng, 3, 2)
    if style == "firm":
        firms, cities = _names(rng, 3, 2, FIRMS), _names(rng, 3, 3)
        first = [f"{p} works at {f}." for p, f in zip(people, firms)]
        second = [f"{f} is based in {c}." for f, c in zip(firms, cities)]
        q = f"In which city is the company that {people[0]} works at based?"
        return q, cities[0], first, second, [[firms[0]], [firms[0], cities[0]]], ""
    cities = _names(rng, 3, 3)
    values = rng.sample(COLOURS if style == "flag" else FOODS, 3)
    first = [f"{p} lives in {c}." for p, c in zip(people, cities)]
    if style == "flag":
        second = [f"The flag of {c} is {v}." for c, v in zip(cities, values)]
        q = f"What colour is the flag of the city where {people[0]} lives?"
    else:
        second = [f"{c} is famous for its {v}." for c, v in zip(cities, values)]
        q = f"What is the city where {people[0]} lives famous for?"
    return q, values[0], first, second, [[cities[0]], [cities[0], values[0]]], ""


def _product(rng: random.Random):
    people, colours = _names(rng, 3, 2), rng.sample(COLOURS, 3)
    item, box = rng.choice(ITEMS), rng.choice(BOXES)
    counts, per = [rng.randint(2, 9) for _ in range(3)], [rng.randint(2, 9) for _ in range(3)]
    first = [f"{p} has {n} {c} {box}." for p, n, c in zip(people, counts, colours)]
    second = [f"One {c} {box[:-2] if box.endswith('xes') else box[:-1]} holds {k} {item}." for c, k in zip(colours, per)]
    q = f"How many {item} are in {people[0]}'s {box}?"
    return (q, str(counts[0] * per[0]), first, second, [[str(counts[0]), colours[0]], [colours[0], str(per[0])]],
            f"{counts[0]} * {per[0]} = {counts[0] * per[0]}")


def _sum(rng: random.Random):
    people, item = _names(rng, 6, 2), rng.choice(["coins", "stamps", "cards", "marbles"])
    n = [rng.randint(2, 30) for _ in range(6)]
    first = [f"{p} has {k} {item}." for p, k in zip(people[:3], n[:3])]
    second = [f"{p} has {k} {item}." for p, k in zip(people[3:], n[3:])]
    q = f"How many {item} do {people[0]} and {people[3]} have together?"
    return q, str(n[0] + n[3]), first, second, [[people[0], str(n[0])], [people[3], str(n[3])]], f"{n[0]} + {n[3]} = {n[0] + n[3]}"


MAKE = {"chain": _chain, "product": _product, "sum": _sum}


def make_task(kind: str, rng: random.Random) -> dict:
    """One task of `kind`: its two halves shuffled into one fact list, a coin deciding which agent holds which."""
    q, answer, first, second, keys, work = MAKE[kind](rng)
    facts = first + second
    order = list(range(len(facts)))
    rng.shuffle(order)
    at = {old: new for new, old in enumerate(order)}  # old index -> place in the shuffled list
    halves = [sorted(at[i] for i in range(len(first))), sorted(at[i] for i in range(len(first), len(facts)))]
    if rng.random() < 0.5:
        halves.reverse()
    return {"kind": kind, "question": q, "answer": answer, "facts": [facts[i] for i in order],
            "facts_a": halves[0], "facts_b": halves[1], "needed": [at[0], at[len(first)]], "keys": keys, "work": work}


def generate(seed: int = SEED, sizes: dict = SIZES) -> dict[str, list[dict]]:
    """{split: rows}: one seeded stream, kinds in turn, a repeated question skipped; splits in `sizes`' order."""
    rng, seen, out = random.Random(seed), set(), {}
    i = 0
    for split, n in sizes.items():
        rows = []
        while len(rows) < n:
            t = make_task(KINDS[i % len(KINDS)], rng)
            i += 1
            if t["question"] not in seen:
                seen.add(t["question"])
                rows.append({"id": f"{split}-{len(rows):04d}", **t})
        out[split] = rows
    return out


def write(seed: int = SEED, where: str = HERE) -> dict[str, int]:
    """Write split_info_{split}.jsonl under `where`; {split: rows written}."""
    out = generate(seed)
    for split, rows in out.items():
        write_jsonl(rows, os.path.join(where, f"split_info_{split}.jsonl"))
    return {s: len(r) for s, r in out.items()}


# --------------------------------------------------------------------------------------------
# the loader: every row checked, a bad one is a DataError naming file:line and the field

def _check(row, where: str) -> dict:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object (a split-information task), got {type(row).__name__}")
    for k, typ in (("question", str), ("answer", str), ("facts", list), ("facts_a", list), ("facts_b", list),
                   ("needed", list), ("keys", list)):
        if k not in row:
            raise DataError(f"{where}: missing field {k!r}; has {sorted(row)[:12]}")
        if not isinstance(row[k], typ):
            raise DataError(f"{where}: field {k!r} must be a {typ.__name__}, got {type(row[k]).__name__}")
    facts = row["facts"]
    if not row["question"].strip() or not row["answer"].strip() or len(row["answer"].split()) != 1:
        raise DataError(f"{where}: fields 'question' and 'answer' must be non-empty, the answer one word")
    if not facts or not all(isinstance(f, str) and f.strip() for f in facts):
        raise DataError(f"{where}: field 'facts' must be a non-empty list of non-empty strings")
    idx = lambda k: all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(facts) for i in row[k])  # noqa: E731
    for k in ("facts_a", "facts_b", "needed"):
        if not row[k] or not idx(k) or len(set(row[k])) != len(row[k]):
            raise DataError(f"{where}: field {k!r} must list distinct indices into 'facts' (0..{len(facts) - 1})")
    if sorted(row["facts_a"] + row["facts_b"]) != list(range(len(facts))):
        raise DataError(f"{where}: fields 'facts_a' and 'facts_b' must divide 'facts' between them (each fact once)")
    keys = row["keys"]
    if len(keys) != len(row["needed"]) or not all(isinstance(k, list) and k and all(isinstance(w, str) and w for w in k)
                                                   for k in keys):
        raise DataError(f"{where}: field 'keys' must hold a non-empty list of words for each needed fact")
    work = row.get("work", "")
    if not isinstance(work, str):
        raise DataError(f"{where}: field 'work' must be a string, got {type(work).__name__}")
    return {**row, "question": row["question"].strip(), "answer": row["answer"].strip(), "work": work}


def load_split_info(spec: str) -> list[dict]:
    """The tasks of a split_info_*.jsonl file (or any .jsonl/.json of such rows), each row checked."""
    return [_check(row, where) for where, row in read_rows(spec, "split-information data")]


if __name__ == "__main__":
    n = write()
    print(f"wrote data/split_info_{{train,val,test}}.jsonl: {n['train']} train, {n['val']} val, {n['test']} test tasks")
