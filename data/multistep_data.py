"""Multi-step arithmetic word problems (the reasoner + coder team's tasks, envs/reason_code.py): a seeded
generator and its shipped splits.

Each problem must be read and set up in several steps before anything is computed: quantities that change
over several events, units to convert (hours and minutes, meters and centimeters, dollars and cents, kilograms
and grams), a rate times a duration minus something, a rest shared equally. One call of a calculator on the
numbers as written does not answer it; a program that follows the story does. Answers are whole numbers.

A row: {"question", "answer", "kind" (the template), "level" (its number of steps, 3 or 4), "steps"}. `steps`
is the worked solution, one `name = expression` a line over integers and earlier names (+, -, *, and // that
divides exactly); the answer is the last step's value (`run_steps`). The scripted teacher of
envs/reason_code.py writes its replies from them; no prompt shows them.

    python data/multistep_data.py    # regenerates data/multistep_{train,val,test}.jsonl byte for byte (seed 0)

The splits share no question: the seeded stream's distinct questions go to test first, then val, then train.
"""
from __future__ import annotations

import ast
import json
import math
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES = {"test": 200, "val": 200, "train": 1000}
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena"]
THINGS = ["notebooks", "pens", "sandwiches", "tickets", "mugs", "scarves"]


# --------------------------------------------------------------------------------------------
# the worked solution: `name = expression` lines, evaluated exactly

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def _value(node, env: dict) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left, env), _value(node.right, env))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
        a, b = _value(node.left, env), _value(node.right, env)
        if b == 0 or a % b:
            raise ValueError(f"{a} // {b} does not divide exactly")
        return a // b
    raise ValueError(f"not a step expression: {ast.unparse(node)}")


def run_steps(steps: list[str]) -> list[tuple[str, int]]:
    """[(name, value)] of each `name = expression` step, in order; ValueError for anything else (a name used
    before it is set, an operator other than + - * //, a // that leaves a remainder)."""
    env, out = {}, []
    for line in steps:
        name, _, expr = line.partition(" = ")
        if not name.isidentifier() or not expr:
            raise ValueError(f"not a step: {line!r}")
        env[name] = _value(ast.parse(expr, mode="eval").body, env)
        out.append((name, env[name]))
    return out



def steps_program(steps: list[str]) -> str | None:
    """The worked solution as a Python program that prints the answer (the steps, then print of the last name);
    None for steps run_steps cannot read."""
    try:
        run_steps(steps)
    except (ValueError, SyntaxError, RecursionError, TypeError, AttributeError):
        return None
    return "\n".join(steps) + f"\nprint({steps[-1].partition(' = ')[0]})"

# --------------------------------------------------------------------------------------------
# the templates: rng -> (question, steps); numbers drawn so that every value is a whole number >= 0


def change(rng):
    name, thing, n, d, c = rng.choice(NAMES), rng.choice(THINGS), rng.randint(2, 6), rng.randint(1, 9), 5 * rng.randint(1, 19)
    bill = next(b for b in (10, 20, 50, 100, 200) if b * 100 > n * (100 * d + c))
    return (f"{name} buys {n} {thing} that cost {d} dollars and {c} cents each, and pays with a {bill}-dollar bill. "
            f"How many cents of change does {name} get?",
            [f"price = {d} * 100 + {c}", f"cost = {n} * price", f"change = {bill} * 100 - cost"])


def pump(rng):
    r, h, m = rng.randint(3, 25), rng.randint(1, 3), 5 * rng.randint(1, 11)
    leak = rng.randint(10, r * (60 * h + m) // 4)
    return (f"A pump moves {r} liters of water per minute. It runs for {h} hours and {m} minutes, and {leak} liters "
            "leak out of the hose. How many liters reach the tank?",
            [f"minutes = {h} * 60 + {m}", f"pumped = {r} * minutes", f"reached = pumped - {leak}"])


def rope(rng):
    name, m, cm, k = rng.choice(NAMES), rng.randint(2, 9), rng.randint(1, 99), rng.randint(2, 8)
    p = rng.randint(10, min(60, (100 * m + cm - 1) // k))
    return (f"A rope is {m} meters and {cm} centimeters long. {name} cuts off {k} pieces of {p} centimeters each. "
            "How many centimeters of rope are left?",
            [f"length = {m} * 100 + {cm}", f"cut = {k} * {p}", "left = length - cut"])


def library(rng):
    a = rng.randint(120, 600)
    b = rng.randint(20, a // 2)
    c, k, s = rng.randint(1, b), rng.randint(2, 6), rng.randint(5, 25)
    return (f"A library has {a} books. On Monday it lends out {b} books. On Tuesday {c} of the lent books come back. "
            f"On Wednesday it buys {k} boxes of {s} books each. How many books are in the library now?",
            [f"monday = {a} - {b}", f"tuesday = monday + {c}", f"bought = {k} * {s}", "now = tuesday + bought"])


def cookies(rng):
    while True:
        name, t, c, s = rng.choice(NAMES), rng.randint(2, 8), rng.randint(6, 24), rng.randint(4, 12)
        b = rng.randint(1, max(1, t * c // s - 1))
        rest = t * c - b * s
        shares = [f for f in range(2, 10) if rest > 0 and rest % f == 0]
        if shares:
            f = rng.choice(shares)
            return (f"{name} bakes {t} trays of {c} cookies each, sells {b} boxes of {s} cookies, and shares the "
                    f"rest equally among {f} friends. How many cookies does each friend get?",
                    [f"baked = {t} * {c}", f"sold = {b} * {s}", "rest = baked - sold", f"each = rest // {f}"])


def savings(rng):
    while True:
        name, d, w, k, p = rng.choice(NAMES), rng.randint(2, 15), rng.randint(2, 6), rng.randint(2, 5), rng.randint(3, 20)
        if d * 7 * w - k * p >= 10:
            break
    g = rng.randint(10, d * 7 * w - k * p)
    return (f"{name} saves {d} dollars every day for {w} weeks. Then {name} spends {g} dollars on a game and buys "
            f"{k} tickets at {p} dollars each. How many dollars does {name} have left?",
            [f"days = {w} * 7", f"saved = {d} * days", f"tickets = {k} * {p}", f"left = saved - {g} - tickets"])


def bus(rng):
    v, h, m = 5 * rng.randint(6, 18), rng.randint(1, 4), rng.choice((15, 20, 30, 40, 45))
    step = 60 // math.gcd(60, m)  # u * m divisible by 60
    u = step * rng.randint(max(1, 20 // step), 90 // step)
    return (f"A bus drives at {v} kilometers per hour for {h} hours, then at {u} kilometers per hour for {m} minutes. "
            "How many kilometers does it drive in all?",
            [f"first = {v} * {h}", f"second = {u} * {m} // 60", "total = first + second"])


def pages(rng):
    name, p, d, q, e = rng.choice(NAMES), rng.randint(5, 30), rng.randint(2, 7), rng.randint(5, 40), rng.randint(2, 7)
    n = p * d + q * e + rng.randint(10, 150)
    return (f"A book has {n} pages. {name} reads {p} pages a day for {d} days, then {q} pages a day for {e} more days. "
            "How many pages are still unread?",
            [f"first = {p} * {d}", f"second = {q} * {e}", "read = first + second", f"unread = {n} - read"])


def flour(rng):
    k, kg, g = rng.randint(2, 6), rng.randint(1, 5), 50 * rng.randint(1, 19)
    u = rng.randint(100, k * (1000 * kg + g) - 1)
    return (f"A shop has {k} bags of flour, each weighing {kg} kilograms and {g} grams. The baker uses {u} grams. "
            "How many grams of flour are left?",
            [f"bag = {kg} * 1000 + {g}", f"total = {k} * bag", f"left = total - {u}"])


def marbles(rng):
    name, other = rng.sample(NAMES, 2)
    a, b, c = rng.randint(10, 80), rng.randint(5, 40), rng.randint(1, 30)
    b += (a + b) % 2  # an even number to halve
    return (f"{name} has {a} marbles and wins {b} more. Then {name} gives half of the marbles to {other} and buys "
            f"{c} more. How many marbles does {name} have now?",
            [f"after_win = {a} + {b}", "kept = after_win // 2", f"now = kept + {c}"])


KINDS = {f.__name__: f for f in (change, pump, rope, library, cookies, savings, bus, pages, flour, marbles)}


def make_problem(kind: str, rng: random.Random) -> dict:
    """One problem of a template, its answer the last step's value (checked: every value a whole number >= 0)."""
    question, steps = KINDS[kind](rng)
    values = run_steps(steps)
    assert all(v >= 0 for _, v in values), (question, values)
    return {"question": question, "answer": str(values[-1][1]), "kind": kind, "level": len(steps), "steps": steps}


def generate(seed: int = 0, sizes: dict = SIZES) -> dict[str, list[dict]]:
    """{split: rows}: the seeded stream (the templates in turn) dealt to the splits in `sizes`' order, a
    question already dealt skipped, so no question is in two splits (nor twice in one)."""
    rng, kinds, seen, out = random.Random(seed), list(KINDS), set(), {}
    i = 0
    for split, n in sizes.items():
        rows = out[split] = []
        while len(rows) < n:
            row = make_problem(kinds[i % len(kinds)], rng)
            i += 1
            if row["question"] not in seen:
                seen.add(row["question"])
                rows.append(row)
    return out


def write_splits(out_dir=HERE, seed: int = 0) -> dict[str, Path]:
    """Writes multistep_<split>.jsonl under out_dir; {split: path}."""
    paths = {}
    for split, rows in generate(seed).items():
        paths[split] = Path(out_dir) / f"multistep_{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


if __name__ == "__main__":
    for split, path in write_splits().items():
        print(f"wrote {path.relative_to(HERE.parent)} ({SIZES[split]} problems)")
