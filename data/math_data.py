"""Math tasks: loaders for the common formats and a seeded generator of school math.

Every loader returns a list of {"question": str, "answer": str, ...} (other scalar fields, e.g.
"level", are kept as metadata). Accepted row formats:
    {"question", "answer"}                the common format
    {"question", "answer": "... #### 42"} GSM8K (the number after ####)
    {"problem", "solution"}               MATH (the last \\boxed{} of the solution)
    {"problem", "answer"}                 MATH-500
    {"question", "final_answer"}          DeepMath-103K
Local .jsonl / .json (a list) files always work; any other name is tried as a Hugging Face
dataset (`datasets` + network; one that cannot be read is a DataError naming it). A bad file or row stops with a DataError naming `file:line` and
the field: non-UTF-8 bytes, invalid JSON, an empty file, a .json that is not a list, a directory,
a missing field, a field of the wrong type (an answer that is a dict or a list), a NaN answer.

    python data/math_data.py    # regenerates data/arith_{train,val}.jsonl (seeded, shipped)
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


class DataError(ValueError):
    """A data file or row that cannot be used; the message names `file:line` and the field."""


# --------------------------------------------------------------------------------------------
# reading rows from a local file: every failure is a DataError naming file:line (and the field)


def _parse_int(digits: str):
    # Python refuses int("...") past 4300 digits (ValueError, not a JSON error); such a number is
    # kept as its exact digits, which is what an answer field wants anyway.
    return int(digits) if len(digits.lstrip("-")) <= 4000 else digits


def _loads(text: str):
    return json.loads(text, parse_int=_parse_int)


def read_rows(path, what: str = "data") -> list[tuple[str, object]]:
    """[(where, row)] from a local .jsonl (one JSON value a line; blank lines skipped) or .json (a
    list) file, `where` being "file:line". Raises DataError, naming the file and line, for a
    missing path, a directory, non-UTF-8 bytes, invalid JSON, a .json that is not a list, or a file
    with no rows; FileNotFoundError (also naming the file) when it does not exist."""
    p = Path(path)
    if p.is_dir():
        raise DataError(f"{what} file {p} is a directory, not a .jsonl/.json file")
    if not p.exists():
        raise FileNotFoundError(f"{what} file {p} does not exist")
    if p.suffix not in (".jsonl", ".json"):
        raise DataError(f"{what} file {p}: unsupported format {p.suffix or '(no suffix)'!r}; use .jsonl or .json")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise DataError(f"{what} file {p}: cannot read it ({e.strerror or e})") from None
    if raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark, as some editors write
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"{p}:{line}: not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start}); "
                        f"re-save the file as UTF-8") from None
    rows = []
    if p.suffix == ".jsonl":
        for i, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                rows.append((f"{p}:{i}", _loads(line)))
            except (json.JSONDecodeError, ValueError, RecursionError) as e:
                msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e) or type(e).__name__
                raise DataError(f"{p}:{i}: not valid JSON ({msg})") from None
    else:
        try:
            data = _loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
        except (ValueError, RecursionError) as e:
            raise DataError(f"{p}:1: not valid JSON ({str(e) or type(e).__name__})") from None
        if not isinstance(data, list):
            raise DataError(f"{p}:1: expected a JSON list of rows, got {type(data).__name__}")
        # the line each element starts on: walk the (valid) list once with raw_decode
        dec, pos, line, last = json.JSONDecoder(parse_int=_parse_int), text.index("[") + 1, 1, 0
        for row in data:
            while text[pos] in " \t\r\n,":
                pos += 1
            line += text.count("\n", last, pos)
            last = pos
            rows.append((f"{p}:{line}", row))
            pos = dec.raw_decode(text, pos)[1]
    if not rows:
        raise DataError(f"{p}:1: the file has no rows (it is empty{' or only blank lines' if text else ''})")
    return rows


# --------------------------------------------------------------------------------------------
# one row -> one task


def _row_to_task(row, where: str) -> dict:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object (a row with 'question' and 'answer'), "
                        f"got {type(row).__name__}")
    qkey = "question" if "question" in row else "problem"
    q = row.get(qkey)
    if "final_answer" in row:
        akey, a = "final_answer", row["final_answer"]
    elif "answer" in row:
        akey, a = "answer", row["answer"]
        if isinstance(a, str) and "####" in a:
            a = a.rsplit("####", 1)[1].strip().replace(",", "")
    elif "solution" in row:
        akey, a = "solution", row["solution"]
        if not isinstance(a, str):
            raise DataError(f"{where}: field 'solution' must be a string, got {type(a).__name__}")
        sys.path.insert(0, str(HERE.parent)) if str(HERE.parent) not in sys.path else None
        from rewards.math import extract_answer
        a = extract_answer(a)
        if a is None:
            raise DataError(f"{where}: field 'solution' has no \\boxed{{}} answer")
    else:
        raise DataError(f"{where}: missing field 'answer' (or 'final_answer' / 'solution'); has {sorted(row)}")
    if q is None:
        raise DataError(f"{where}: missing field 'question' (or 'problem'); has {sorted(row)}")
    if not isinstance(q, str):
        raise DataError(f"{where}: field {qkey!r} must be a string, got {type(q).__name__}")
    if isinstance(a, float) and not math.isfinite(a):
        raise DataError(f"{where}: field {akey!r} is {a} (not a finite number)")
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        a = str(a)
    if not isinstance(a, str):
        raise DataError(f"{where}: field {akey!r} must be a string or number, got {type(a).__name__}")
    if not q.strip():
        raise DataError(f"{where}: field {qkey!r} is empty (empty question)")
    if not a.strip():
        raise DataError(f"{where}: field {akey!r} is empty (empty answer)")
    sup = row.get("support")
    if sup is not None and not (isinstance(sup, list) and all(isinstance(x, str) for x in sup)):
        raise DataError(f"{where}: field 'support' (the search workflow's supporting document ids) must be "
                        f"a list of strings, got {type(sup).__name__}")
    extra = {k: v for k, v in row.items()
             if k not in ("question", "problem", "answer", "final_answer", "solution")
             and (isinstance(v, (int, float, str)) or isinstance(v, list) and all(isinstance(x, (int, float, str)) for x in v))}
    return {**extra, "question": q.strip(), "answer": a.strip()}  # extra fields (e.g. level) kept as metadata


def load_math(spec: str, split: str = "train", limit: int | None = None) -> list[dict]:
    """Tasks from a local .jsonl/.json/.parquet file, or through `datasets` (optional dependency):

        hf:openai/gsm8k:main:test        hub dataset NAME[:CONFIG[:SPLIT]] (needs network once)
        hf:path/to/saved_dir::test       a dataset saved with save_to_disk, and its split

    A bad file or row raises DataError naming `file:line` (or the dataset row) and the field,
    before any training work; so does a dataset that cannot be read at all (no network for a hub
    name, a file that is not parquet, an empty or broken save_to_disk directory), naming the spec."""
    p = Path(spec)
    if not spec.startswith("hf:") and p.suffix != ".parquet" and (p.suffix in (".jsonl", ".json") or p.exists()):
        return [_row_to_task(row, where) for where, row in read_rows(p, "math data")][:limit]
    try:
        import datasets
    except ImportError as e:
        raise DataError(f"{spec!r} is not a local .jsonl/.json file; reading it needs `pip install datasets` "
                        "(and network for a hub dataset; or run data/prepare_hf.py where you have it)") from e
    quiet = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own log lines would come before ours
    try:
        ds, where = _hf_dataset(datasets, spec, p, split)
        n = min(len(ds), limit or len(ds))
        rows = list(ds.select(range(n)))
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 — no network, not parquet, a broken save_to_disk dir, ...: one line
        why = " ".join(str(e).split())[:300] or type(e).__name__
        hint = ("; a hub dataset needs network once: run data/prepare_hf.py where you have it, or save_to_disk "
                "and pass hf:DIR::SPLIT" if isinstance(e, ConnectionError) else "")
        raise DataError(f"{spec}: cannot be read as a dataset ({type(e).__name__}: {why}){hint}") from None
    finally:
        datasets.logging.set_verbosity(quiet)
    return [_row_to_task(r, f"{where} row {i}") for i, r in enumerate(rows)]


def _hf_dataset(datasets, spec: str, p: Path, split: str):
    """(dataset, name for messages) of a .parquet file, a save_to_disk directory or a hub name."""
    if p.suffix == ".parquet":
        if not p.is_file():
            raise DataError(f"{spec}: no such file")
        return datasets.load_dataset("parquet", data_files=str(p), split="train"), spec
    name, config, split = (spec[3:].split(":") + [None, None])[:3] if spec.startswith("hf:") else (spec, None, split)
    split = split or "train"
    if Path(name).is_dir():  # save_to_disk output: a Dataset, or a DatasetDict of splits
        ds = datasets.load_from_disk(name)
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"{name}: no split {split!r}; it has {sorted(ds)}")
            ds = ds[split]
    else:
        ds = datasets.load_dataset(name, config or None, split=split)
    return ds, f"{name}[{split}]"


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


def split_levels_12(seed: int = 3, n_train: int = 2000, n_val: int = 500) -> tuple[list[dict], list[dict]]:
    """Levels 1-2 with train and val sharing no question: every distinct question of the seeded
    stream goes to one side only (level 1 has 100 questions and level 2's products 64, so each is
    split between the sides; val takes its distinct problems first, train draws from the rest and,
    like arith_train, may repeat one)."""
    rng = random.Random(seed)
    pool = generate(40000, seed=seed, levels=(1, 2))
    distinct = list({r["question"]: r for r in pool}.values())
    rng.shuffle(distinct)
    small = [r for r in distinct if r["level"] == 1 or "*" in r["question"]]  # the finite families
    val_q = {r["question"] for r in small[: len(small) // 2]}
    val = [r for r in distinct if r["question"] in val_q]
    val += [r for r in distinct if r["question"] not in val_q and r not in small][: n_val - len(val)]
    val_q = {r["question"] for r in val}
    train = [r for r in pool if r["question"] not in val_q][:n_train]
    return train, sorted(val, key=lambda r: distinct.index(r))


def held_out_12(train: list[dict], val: list[dict], seed: int = 4, n: int = 500) -> list[dict]:
    """A held-out test set for the levels 1-2 experiment, written after the arms had read val many times:
    n distinct two-digit sums and differences (val's main family, 418 of its 500) that are in neither
    train nor val. Level 1 and the one-digit products have too few questions (100 and 64) for a third
    side, so the test set has none of them."""
    seen = {r["question"] for r in train + val}
    rng, out = random.Random(seed), {}
    while len(out) < n:
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice(["+", "-"])
        q = f"What is {a} {op} {b}?"
        if q not in seen and q not in out:
            out[q] = {"question": q, "answer": str(a + b if op == "+" else a - b), "level": 2}
    return list(out.values())


if __name__ == "__main__":
    os.chdir(HERE)
    val = generate(200, seed=2)
    seen = {r["question"] for r in val}
    train = [r for r in generate(3000, seed=1) if r["question"] not in seen][:2000]  # disjoint from val
    write_jsonl(train, "arith_train.jsonl")
    write_jsonl(val, "arith_val.jsonl")
    train12, val12 = split_levels_12()
    write_jsonl(train12, "arith12_train.jsonl")
    write_jsonl(val12, "arith12_val.jsonl")
    write_jsonl(held_out_12(train12, val12), "arith12_test.jsonl")
    print("wrote data/arith_train.jsonl (2000), data/arith_val.jsonl (200), data/arith12_train.jsonl "
          f"({len(train12)}), data/arith12_val.jsonl ({len(val12)}: levels 1-2, no question shared with train) and "
          "data/arith12_test.jsonl (500 two-digit +/-, in neither)")
