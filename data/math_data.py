"""Math tasks: loaders for the common formats and a seeded generator of school math.

Every loader returns a list of {"question": str, "answer": str, ...} (other scalar fields, e.g.
"level", are kept as metadata). Accepted row formats:
    {"question", "answer"}                the common format
    {"question", "answer": "... #### 42"} GSM8K (the number after ####)
    {"problem", "solution"}               MATH (the last \\boxed{} of the solution)
    {"problem", "answer"}                 MATH-500
    {"question", "final_answer"}          DeepMath-103K
Local .jsonl / .json (a list) files always work; any other name is tried as a Hugging Face
dataset (`datasets` + network). A bad row stops with an error naming the file and line.

    python data/math_data.py    # regenerates data/arith_{train,val}.jsonl (seeded, shipped)
"""
from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


class DataError(ValueError):
    pass


def _row_to_task(row, where: str) -> dict:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    q = row.get("question", row.get("problem"))
    if "final_answer" in row:
        a = row["final_answer"]
    elif "answer" in row:
        a = row["answer"]
        if isinstance(a, str) and "####" in a:
            a = a.rsplit("####", 1)[1].strip().replace(",", "")
    elif "solution" in row:
        sys.path.insert(0, str(HERE.parent)) if str(HERE.parent) not in sys.path else None
        from rewards.math import extract_answer
        a = extract_answer(row["solution"]) if isinstance(row["solution"], str) else None
        if a is None:
            raise DataError(f"{where}: field 'solution' has no \\boxed{{}} answer")
    else:
        raise DataError(f"{where}: missing field 'answer' (or 'final_answer' / 'solution'); has {sorted(row)}")
    if q is None:
        raise DataError(f"{where}: missing field 'question' (or 'problem'); has {sorted(row)}")
    if not isinstance(q, str):
        raise DataError(f"{where}: field 'question' must be a string, got {type(q).__name__}")
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        a = str(a)
    if not isinstance(a, str):
        raise DataError(f"{where}: field 'answer' must be a string or number, got {type(a).__name__}")
    if not q.strip() or not a.strip():
        raise DataError(f"{where}: empty {'question' if not q.strip() else 'answer'}")
    extra = {k: v for k, v in row.items()
             if k not in ("question", "problem", "answer", "final_answer", "solution")
             and (isinstance(v, (int, float, str)) or isinstance(v, list) and all(isinstance(x, (int, float, str)) for x in v))}
    return {**extra, "question": q.strip(), "answer": a.strip()}  # extra fields (e.g. level) kept as metadata


def load_math(spec: str, split: str = "train", limit: int | None = None) -> list[dict]:
    """Tasks from a local .jsonl/.json file, or a Hugging Face dataset name (needs network)."""
    p = Path(spec)
    if p.suffix in (".jsonl", ".json"):
        if not p.is_file():
            raise FileNotFoundError(f"math data file {spec} does not exist")
        tasks = []
        if p.suffix == ".jsonl":
            with open(p) as f:
                for i, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DataError(f"{p}:{i}: not valid JSON ({e.msg})") from None
                    tasks.append(_row_to_task(row, f"{p}:{i}"))
        else:
            try:
                rows = json.loads(p.read_text())
            except json.JSONDecodeError as e:
                raise DataError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(rows, list):
                raise DataError(f"{p}: expected a JSON list of rows")
            tasks = [_row_to_task(r, f"{p}: row {i}") for i, r in enumerate(rows)]
        if not tasks:
            raise DataError(f"{p}: no rows")
        return tasks[:limit]
    try:
        import datasets
    except ImportError as e:
        raise DataError(f"{spec!r} is not a local .jsonl/.json file; loading it from the hub needs "
                        "`pip install datasets` and network (or run data/prepare_hf.py where you have it)") from e
    ds = datasets.load_dataset(spec, split=split)
    return [_row_to_task(r, f"{spec}[{split}] row {i}") for i, r in enumerate(ds.select(range(min(len(ds), limit or len(ds)))))]


# --------------------------------------------------------------------------------------------
# a seeded generator of school math with exact answers, at graded difficulty

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo"]
ITEMS = ["apples", "books", "coins", "marbles", "pencils", "stickers", "cards", "shells"]


def make_problem(level: int, rng: random.Random) -> dict:
    """level 1: one-digit +; 2: two-digit +/-, one-digit *; 3: a + b * c; 4: one-step word
    problem; 5: two-step word problem. Answers are exact integers."""
    if level == 1:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return {"question": f"What is {a} + {b}?", "answer": str(a + b)}
    if level == 2:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        op = rng.choice(["+", "-", "*"])
        if op == "*":
            a, b = rng.randint(2, 9), rng.randint(2, 9)
        return {"question": f"What is {a} {op} {b}?", "answer": str(eval(f"{a}{op}{b}"))}  # noqa: S307 (our ints)
    if level == 3:
        a, b, c = rng.randint(1, 30), rng.randint(2, 9), rng.randint(2, 9)
        return {"question": f"What is {a} + {b} * {c}?", "answer": str(a + b * c)}
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(5, 40), rng.randint(1, 20)
    if level == 4:
        return {"question": f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
                "answer": str(a + b)}
    c = rng.randint(1, min(a + b, 15))
    return {"question": f"{name} has {a} {item}, buys {b} more, then gives {c} away. "
                        f"How many {item} does {name} have left?", "answer": str(a + b - c)}


def generate(n: int, seed: int, levels=(1, 2, 3, 4, 5)) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        lv = levels[i % len(levels)]
        out.append({**make_problem(lv, rng), "level": lv})
    return out


def write_jsonl(rows, path):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    os.chdir(HERE)
    val = generate(200, seed=2)
    seen = {r["question"] for r in val}
    train = [r for r in generate(3000, seed=1) if r["question"] not in seen][:2000]  # disjoint from val
    write_jsonl(train, "arith_train.jsonl")
    write_jsonl(val, "arith_val.jsonl")
    print("wrote data/arith_train.jsonl (2000) and data/arith_val.jsonl (200)")
