"""The scripted perfect teachers of the search and research workflows (envs/search_team.py and
envs/research.py `scripted_replies`): on every train task of configs/search.py and configs/research.py
they score each turn's maximum through the env's own rewards, every reply uses only what its role
saw, a wrong final answer in the same format scores less, the replies fit the configs' max_tokens,
and sft.py's scripted teacher turns them into examples for every role.

The search team under max_refinement_iterations=2 (SearchTeamEnv counts cycles: two query/answer
cycles) cannot answer a 2-hop question whose chain needs three searches (person -> city -> country);
that is 45 of the 78 train tasks, checked exactly below; with three cycles (configs/search.py) every
train task scores the maximum."""
import dataclasses
import os
import re
from collections import Counter

import pytest

from agents.research_team import parse_citations, parse_report
from agents.search_team import parse_answer, parse_query
from config import load_config_file
from envs.research import ResearchEnv
from envs.search_team import SearchTeamEnv
from helpers import play
from workflows import load_data, workflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(name, **data):
    cfg = load_config_file(os.path.join(ROOT, "configs", f"{name}.py")).validate()
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **data)) if data else cfg


def _workflow(cfg):
    """(make_env, env module, train tasks), as train.py gets them."""
    make_env, module, _ = workflow(cfg)
    return make_env, module, load_data(cfg)[0]


def _drive(env, task, replies):
    """What sft.scripted_teacher does: step the replies until the env ends. (turns seen, rewards, metrics)."""
    turn, seen = env.reset(task), []
    for r in replies:
        if turn is None:
            break
        seen.append(turn)
        turn = env.step(r)
    assert turn is None, "the replies ran out before the episode ended"
    return seen, env.turn_rewards(), env.metrics()


def _text(turn) -> str:
    return "\n".join(m["content"] for m in turn.messages).lower()


# ---------------------------------------------------------------------------------- search


def test_search_teacher_scores_the_maximum_on_every_train_task():
    make_env, module, tasks = _workflow(_config("search", max_refinement_iterations=3))
    assert len(tasks) == 78 and isinstance(make_env(), SearchTeamEnv)
    cycles = Counter()
    for task in tasks:
        replies = module.scripted_replies(task)
        assert replies == module.scripted_replies(task, "data/search_corpus.jsonl", 3)  # the env's defaults
        assert replies == make_env().scripted_replies(task)  # an env's own corpus and search_k
        roles, rew, m, seen = play(make_env(), task, replies)
        assert roles == ["query_writer", "answerer"] * (len(replies) // 2), task
        assert rew == [1.0] * len(roles), (task, rew)
        assert (m["team_reward"], m["f1"], m["em"], m["retrieval_hit"], m["no_answer"]) == (1, 1, 1, 1, 0), task
        cycles[(task["hops"], m["cycles"])] += 1
        for turn, reply in zip(seen, replies):  # only what the role saw: the query's entity, the answer's text
            if turn.role == "query_writer":
                assert parse_query(reply).lower() in _text(turn), (task, reply)
            elif parse_answer(reply) is not None:
                assert parse_answer(reply).lower() in _text(turn).replace(task["question"].lower(), "")  # not the question
    # 1-hop: one cycle; 2-hop: three (person, city, country) unless the city's search brings up its
    # country too (Driyr Lopa, born in the capital Nezan)
    assert cycles == {(1, 1): 32, (2, 2): 1, (2, 3): 45}


def test_search_teacher_under_two_cycles():
    """max_refinement_iterations=2 (SearchTeamEnv counts cycles, not refinements; configs/search.py has 3),
    so a 2-hop chain of three searches ends at the second 'Search again' with no answer: the query
    writer's turns still earn 1, the answerer's (= the team's F1) 0. Exactly the 1-hop tasks and
    Driyr Lopa's (the country came up with the city) reach the maximum."""
    assert _config("search").data.max_refinement_iterations == 3
    cfg = _config("search", max_refinement_iterations=2)
    make_env, module, tasks = _workflow(cfg)
    best, short = [], []
    for task in tasks:
        seen, rew, m = _drive(make_env(), task, module.scripted_replies(task))
        if rew == [1.0] * len(rew) and m["team_reward"] == 1:
            best.append(task)
        else:
            assert task["hops"] == 2 and m["cycles"] == 2 and m["no_answer"] == 1 and m["team_reward"] == 0
            assert rew == [1.0, 0.0, 1.0, 0.0] and [t.role for t in seen] == ["query_writer", "answerer"] * 2
            short.append(task)
    assert (len(best), len(short)) == (33, 45) and sum(t["hops"] == 1 for t in best) == 32
    assert [t["question"] for t in best if t["hops"] == 2] == [
        "What is the capital of the country where Driyr Lopa was born?"]


def test_search_wrong_answer_scores_less():
    make_env, module, tasks = _workflow(_config("search", max_refinement_iterations=3))
    answers = sorted({t["answer"] for t in tasks})
    for task in tasks[:20]:
        replies = module.scripted_replies(task)
        wrong = next(a for a in answers if a != task["answer"])
        roles, rew, m, _ = play(make_env(), task, replies[:-1] + [f"Answer: {wrong}"])
        assert m["team_reward"] == 0 and m["em"] == 0 and m["retrieval_hit"] == 1
        assert rew == [1.0 if r == "query_writer" else 0.0 for r in roles]


# ---------------------------------------------------------------------------------- research


@pytest.mark.parametrize("name, corpus, n_train, n_val", [("research", "search_corpus.jsonl", 60, 20),
                                                          ("cpu/research", "research_world_corpus.jsonl", 140, 100)])
def test_research_teacher_scores_the_maximum_on_every_train_and_val_task(name, corpus, n_train, n_val):
    """configs/research.py's small world and the recipe's larger one (configs/cpu/research.py: 450 documents, 100
    val questions): on every task the scripted team scores the maximum through the config's own env."""
    cfg = _config(name)
    make_env, module, _ = workflow(cfg)
    train_tasks, val_tasks = load_data(cfg)
    assert (len(train_tasks), len(val_tasks)) == (n_train, n_val) and cfg.data.val_size == n_val
    assert cfg.data.env_kwargs["corpus"] == f"data/{corpus}" and isinstance(make_env(), ResearchEnv)
    tasks = train_tasks + val_tasks
    kw = {k: cfg.data.env_kwargs[k] for k in ("corpus", "search_k", "max_sub_questions", "max_rounds")}
    hops = Counter()
    for task in tasks:
        replies = module.scripted_replies(task, **kw)
        assert replies and replies == make_env().scripted_replies(task)  # the config's
        assert name != "research" or replies == module.scripted_replies(task)  # and the module's defaults
        n = len(task["support"])
        roles, rew, m, seen = play(make_env(), task, replies)
        assert roles == ["planner"] + ["researcher"] * 3 * n + ["writer"]
        assert rew == [1.0] * len(roles), (task, rew)
        for k in ("team_reward", "f1", "em", "cite_precision", "cite_recall", "support_retrieved", "support_read",
                  "planner_reward", "researcher_reward", "writer_reward"):
            assert m[k] == 1.0, (k, task)
        assert m["sub_questions"] == n and m["tool_errors"] == 0 and m["no_plan"] == 0
        hops[n] += 1
        # only what each role saw: the planner names the question's entity; a search names an entity of
        # the question or of an earlier note; a read takes an id from the search just listed; the writer
        # answers from the notes and cites the documents they were read from
        assert task["question"].lower() in _text(seen[0])
        for turn, reply in zip(seen[1:-1], replies[1:-1]):
            arg = re.fullmatch(r"Action: (\w+)\[(.*)\]", reply, re.DOTALL)
            assert arg, reply
            if arg.group(1) == "search":
                assert arg.group(2).lower() in turn.messages[1]["content"].lower()
            elif arg.group(1) == "read_doc":
                assert f"[{arg.group(2)}]" in turn.messages[-1]["content"]
        answer, cites = parse_report(replies[-1])
        notes = _text(seen[-1])
        assert answer.lower() in notes and all(f"[{c}]" in notes for c in cites) and cites == task["support"]
    assert hops == {3: (n_train + n_val) // 2, 4: (n_train + n_val) // 2}


def test_research_wrong_answer_scores_less_and_no_play_outside_its_budgets():
    make_env, module, tasks = _workflow(_config("research"))
    answers = sorted({t["answer"] for t in tasks})
    for task in tasks[:20]:
        replies = module.scripted_replies(task)
        wrong = next(a for a in answers if a != task["answer"])
        _, rew, m, _ = play(make_env(), task, replies[:-1] + [replies[-1].replace(task["answer"], wrong, 1)])
        assert parse_citations(replies[-1]) == task["support"]
        assert m["f1"] == 0 and m["cite_f1"] == 1 and m["team_reward"] == rew[-1] == 0.0 and rew[:-1] == [1.0] * (
            len(rew) - 1)
    task = tasks[0]
    # configs/tiny_research.py's budgets (2 sub-questions, 2 actions) leave no perfect play; nor does a
    # question of another form (a HotpotQA one)
    assert module.scripted_replies(task, max_sub_questions=2, max_rounds=2) == []
    assert _workflow(_config("tiny_research"))[0]().scripted_replies(task) == []
    assert module.scripted_replies(task, max_rounds=2) == []
    assert module.scripted_replies(dict(task, question="Who wrote it?")) == []


# ---------------------------------------------------------------------------------- token budgets, sft


def test_replies_fit_the_configs_max_tokens():
    """With SmolLM2's own tokenizer (the configs' model), each reply and its end-of-turn token fit its
    role's max_tokens: the model can say it whole at RL time."""
    import model
    path = model.cache_dir() / "smollm2-135m-instruct"
    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        pytest.skip(f"no SmolLM2 tokenizer in {path}")
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    for name, kw in (("search", {"max_refinement_iterations": 3}), ("research", {}), ("cpu/search", {}),
                     ("cpu/research", {})):  # the recipes' larger worlds: longer names, other ids
        cfg = _config(name, **kw)
        make_env, module, tasks = _workflow(cfg)
        budget, longest = {r.name: r.max_tokens for r in cfg.roles}, Counter()
        for task in tasks:
            replies = make_env().scripted_replies(task)
            seen, _, _ = _drive(make_env(), task, replies)
            for turn, reply in zip(seen, replies):
                longest[turn.role] = max(longest[turn.role], len(tok(reply)["input_ids"]) + 1)
        assert set(longest) == set(budget) and all(longest[r] <= budget[r] for r in budget), (name, longest, budget)


def test_sft_scripted_teacher_gives_every_roles_examples(tiny):
    import sft
    _, tok = tiny
    # turns: search 32 1-hop tasks x 1 cycle + 1 x 2 + 45 x 3 (x 2 roles); under two cycles the 45 stop
    # after 2 and their answerer turns (team F1 0) fall below min_reward; research 30 x 3 + 30 x 4 hops
    for name, kw, want in (("search", {"max_refinement_iterations": 3}, {"scripted/query_writer": 169,
                                                                          "scripted/answerer": 169}),
                           ("search", {"max_refinement_iterations": 2}, {"scripted/query_writer": 124, "scripted/answerer": 34,
                                           "below_min_reward/answerer": 90}),
                           ("research", {}, {"scripted/planner": 60, "scripted/researcher": 3 * 210,
                                             "scripted/writer": 60}),
                           ("cpu/research", {}, {"scripted/planner": 140, "scripted/researcher": 3 * 490,
                                                 "scripted/writer": 140})):  # 70 x 3 + 70 x 4 hops
        cfg = _config(name, **kw)
        make_env, module, tasks = _workflow(cfg)
        roles = [r.name for r in cfg.roles]
        ex, counts = sft.scripted_teacher(make_env, module, tasks, tok, {r: r for r in roles}, set(roles), 0, 0.7)
        assert counts == {f"teacher:{k}": v for k, v in want.items()}, (name, kw, counts)
        assert {e.role for e in ex} == set(roles) and all(e.reward == 1.0 for e in ex)
        assert all(e.prompt.startswith("<|im_start|>system\n") and e.prompt.endswith("<|im_start|>assistant\n")
                   for e in ex)


def test_the_data_builders_write_every_shipped_world_file_byte_for_byte(tmp_path):
    """python data/search_data.py (write) into a fresh directory: both worlds and research's files, equal byte for byte
    to the shipped ones, search_corpus.jsonl with research's 40 documents after the small world's 120 (rewriting
    the small world alone used to drop them)."""
    from data.search_data import write
    write(str(tmp_path))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([f"{w}_{n}.jsonl" for w in ("search", "search_world", "research_world")
                            for n in ("corpus", "train", "val")] + ["research_train.jsonl", "research_val.jsonl"])
    for n in names:
        assert (tmp_path / n).read_bytes() == open(os.path.join(ROOT, "data", n), "rb").read(), n
    assert sum(1 for _ in open(tmp_path / "search_corpus.jsonl")) == 160


def test_the_larger_search_world_is_what_the_recipe_reads_and_the_teacher_solves_every_task():
    """configs/cpu/search.py's world (data/search_world_*.jsonl): 100 train and 200 val questions, and on every one
    the scripted team scores the maximum through the recipe's own env (its corpus, 3 cycles). Train and val are new
    questions, not new facts: 31 of the 80 val one-hop cities lie on a train two-hop chain (12 of 16 in the small
    world); the val answer still needs its searches (the facts are in no prompt)."""
    cfg = load_config_file(os.path.join(ROOT, "configs", "cpu", "search.py")).validate()
    assert cfg.data.val_size == 200 and cfg.data.env_kwargs["corpus"].endswith("search_world_corpus.jsonl")
    make_env, module, _ = workflow(cfg)
    train, val = load_data(cfg)
    assert len(train) == 100 and len(val) == 200 and sum(t["hops"] == 1 for t in val) == 80
    for task in train + val:
        env = make_env()
        replies = env.scripted_replies(task)
        roles, rew, m, _ = play(env, task, replies)
        assert rew == [1.0] * len(roles) and m["team_reward"] == 1 and m["em"] == 1, task
