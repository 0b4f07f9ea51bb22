"""The split-information design (docs/experiments.md): data/split_info_data.py's tasks, envs/split_info.py's team and its
one-agent baseline, their configs. The split is real (each agent's first prompt holds its own facts and none of
the other's), round 1 is handed out at once and round 2 continues each agent's own chat, the teacher scores the
maximum, rewards and metrics match numbers worked out by hand, and every option changes what it names."""
import dataclasses
import json
import types
from pathlib import Path

import pytest
from helpers import CountingEngine, bounded

import chat
from config import ConfigError, load_config_file
from data.math_data import DataError
from data.split_info_data import SIZES, generate, load_split_info, write
from envs import play_replies, prompts_of
from envs.split_info import (MAX_MESSAGE_CHARS, ROLES, SplitInfoEnv, SplitInfoSingleEnv, aggregate, carries,
                             load_tasks, parse_answer, scripted_replies, unneeded_marks)

ROOT = Path(__file__).resolve().parent.parent
FILES = {s: ROOT / "data" / f"split_info_{s}.jsonl" for s in ("train", "val", "test")}
TASK = {"question": "How many coins do Vela and Tomi have together?", "answer": "13", "work": "5 + 8 = 13",
        "facts": ["Rupo has 9 coins.", "Vela has 5 coins.", "Tomi has 8 coins.", "Kesa has 2 coins."],
        "facts_a": [0, 1], "facts_b": [2, 3], "needed": [1, 2], "keys": [["Vela", "5"], ["Tomi", "8"]]}


def _play(env, replies, task=TASK):
    played = play_replies(env, task, replies)
    return played, env.turn_rewards(), env.metrics()


# ---------------------------------------------------------------------------------- data


def test_the_splits_are_disjoint_reproducible_and_well_formed(tmp_path):
    """python data/split_info_data.py rewrites the shipped files byte for byte; no question is in two splits;
    every row loads, its halves partition the facts, one needed fact lies in each half, and each key word of a
    needed fact is a word of that fact."""
    assert write(where=str(tmp_path)) == SIZES
    for s, path in FILES.items():
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), s
    tasks = {s: load_tasks(str(p)) for s, p in FILES.items()}
    assert {s: len(t) for s, t in tasks.items()} == {"train": 600, "val": 200, "test": 200}
    qs = {s: {t["question"] for t in ts} for s, ts in tasks.items()}
    assert all(len(qs[s]) == len(tasks[s]) for s in qs)  # distinct within a split too
    assert not (qs["train"] & qs["val"]) and not (qs["train"] & qs["test"]) and not (qs["val"] & qs["test"])
    for t in [t for ts in tasks.values() for t in ts]:
        a, b, (n1, n2) = set(t["facts_a"]), set(t["facts_b"]), t["needed"]
        assert a.isdisjoint(b) and a | b == set(range(len(t["facts"])))
        assert (n1 in a) != (n2 in a)  # the answer needs both halves
        for i, keys in zip(t["needed"], t["keys"]):
            assert carries(t["facts"][i], keys), (t["facts"][i], keys)
        assert len(t["answer"].split()) == 1
    assert {t["kind"] for t in tasks["test"]} == {"chain", "product", "sum"}
    assert generate(seed=1)["test"][0] != generate()["test"][0]  # the seed matters


def test_the_loader_names_file_line_and_field(tmp_path):
    good = json.loads(FILES["val"].read_text().splitlines()[0])
    for change, field in [({"facts_b": []}, "facts_b"), ({"facts_a": [0, 0]}, "facts_a"), ({"needed": [99]}, "needed"),
                          ({"answer": "two words"}, "answer"), ({"keys": [["x"]]}, "keys"), ({"facts": "x"}, "facts"),
                          ({"work": 3}, "work"), ({"facts_a": good["facts_a"][:-1]}, "facts_a")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps(good) + "\n" + json.dumps({**good, **change}) + "\n")
        with pytest.raises(DataError, match=rf"bad.jsonl:2: .*'{field}'"):
            load_split_info(str(bad))


# ---------------------------------------------------------------------------------- the split


def test_each_agent_sees_exactly_its_own_facts_and_the_single_agent_all():
    """In every task of every split: agent_a's first prompt holds each of its facts and none of agent_b's (and the
    other way round), both hold the question; the one agent's prompt holds every fact."""
    for path in FILES.values():
        for t in load_tasks(str(path)):
            handed = SplitInfoEnv().reset(t)
            assert [p.role for p in handed] == list(ROLES)
            for p, mine, theirs in zip(handed, (t["facts_a"], t["facts_b"]), (t["facts_b"], t["facts_a"])):
                seen = "\n".join(m["content"] for m in p.messages)
                assert t["question"] in seen
                assert all(t["facts"][i] in seen for i in mine)
                assert not any(t["facts"][i] in seen for i in theirs), (p.role, t["id"])
            seen = "\n".join(m["content"] for m in SplitInfoSingleEnv().reset(t).messages)
            assert all(f in seen for f in t["facts"])


def test_round_one_is_a_set_of_two_and_round_two_continues_each_agents_own_chat():
    env = SplitInfoEnv()
    first = env.reset(TASK)
    assert isinstance(first, list) and [p.role for p in first] == ["agent_a", "agent_b"]
    said = ["Vela has 5 coins.", "Tomi has 8 coins."]
    second = env.step(said)
    assert isinstance(second, list) and [p.role for p in second] == ["agent_a", "agent_b"]
    for p0, reply, p1, heard in zip(first, said, second, reversed(said)):
        assert chat.continues(p0.messages, reply, p1.messages)  # its own reply verbatim, then one new message
        assert len(p1.messages) == len(p0.messages) + 2 and heard in p1.messages[-1]["content"]
    assert env.step(["x\nAnswer: 13", "Answer: 13"]) is None
    long = "y" * (10 * MAX_MESSAGE_CHARS)  # a runaway message reaches the other only in part
    env.reset(TASK)
    assert env.step([long, "hi"])[1].messages[-1]["content"].count("y") == MAX_MESSAGE_CHARS


def test_round_one_shares_one_engine_call_through_the_driver(tiny):
    """On the tiny model: 2 engine calls for a batch (both agents of every episode at once, then both again)."""
    import lora
    from rollout import RoleSpec, SamplingParams, TorchEngine, run_episodes
    m, tok = tiny
    lora.add_lora(m, list(ROLES), rank=4, alpha=8)
    eng = CountingEngine(TorchEngine(m, tok))
    roles = {r: RoleSpec(r, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0)) for r in ROLES}
    samples, eps = run_episodes(eng, tok, SplitInfoEnv, [TASK, TASK], roles, num_chains=2, max_turns=4)
    assert eng.calls == [["agent_a", "agent_b"] * 4] * 2
    assert all(len(e.samples) == 4 and not e.truncated for e in eps)
    for e in eps:  # each agent's second prompt extends its first turn token for token
        for r in ROLES:
            s1, s2 = [s for s in e.samples if s.role == r]
            assert s2.prompt_ids[:len(s1.prompt_ids) + len(s1.completion_ids)] == s1.prompt_ids + s1.completion_ids


# ---------------------------------------------------------------------------------- rewards


def test_the_teacher_scores_the_maximum_on_every_train_task():
    """The scripted team (each option's), and the one agent (one and two turns): every turn paid 1, the team right,
    every message carrying its fact, both agents agreeing, on all 600 train tasks."""
    tasks = load_tasks(str(FILES["train"]))
    envs = [SplitInfoEnv, lambda: SplitInfoEnv(max_rounds=3, message_reward="fact", final_reward="own"),
            lambda: SplitInfoEnv(message_reward="fact_only"), SplitInfoSingleEnv, lambda: SplitInfoSingleEnv(turns=2)]
    for make in envs:
        for t in tasks:
            env = make()
            played, rewards, m = _play(env, env.scripted_replies(t), t)
            assert rewards == [1.0] * len(played) and len(played) in (1, 2, 4)
            assert m["team_reward"] == m["message_has_needed_fact"] == 1.0 and m["no_answer"] == 0.0
            assert m.get("agents_agree", 1.0) == 1.0 and m.get("message_has_unneeded_fact", 0.0) == 0.0
    assert scripted_replies(tasks[0]) == SplitInfoEnv().scripted_replies(tasks[0])


def test_rewards_and_metrics_worked_out_by_hand():
    """agent_a passes on its fact, agent_b does not; agent_a answers 13 (right), agent_b 12."""
    msgs, finals = ["Vela has 5 coins.", "Hello A."], ["5 + 8 = 13\n**Answer:** 13.", "Answer: 12"]
    played, rewards, m = _play(SplitInfoEnv(), msgs + finals)
    assert len(played) == 4 and rewards == [1.0, 1.0, 1.0, 1.0]
    assert m == {"team_reward": 1.0, "agents_agree": 0.0, "message_has_needed_fact": 0.5,
                 "message_has_unneeded_fact": 0.0, "no_answer": 0.0}
    assert _play(SplitInfoEnv(message_reward="fact"), msgs + finals)[1] == [1.0, 0.0, 1.0, 1.0]
    assert _play(SplitInfoEnv(message_reward="fact_only"), msgs + finals)[1] == [1.0, 0.0, 1.0, 1.0]
    # agent_a dumps both its facts, agent_b names its distractor's number only: "fact" pays agent_a's dump,
    # "fact_only" pays neither (agent_b does not carry its needed fact either way)
    dump = ["Rupo has 9 coins. Vela has 5 coins.", "Kesa has 2."]
    _, rewards, m = _play(SplitInfoEnv(message_reward="fact"), dump + finals)
    assert rewards == [1.0, 0.0, 1.0, 1.0] and m["message_has_unneeded_fact"] == 1.0
    assert _play(SplitInfoEnv(message_reward="fact_only"), dump + finals)[1] == [0.0, 0.0, 1.0, 1.0]
    # agent_b passes on its fact and a word of its distractor ("2"): named, so unpaid under fact_only
    both = ["Vela has 5 coins.", "Tomi has 8 coins, not 2."]
    _, rewards, m = _play(SplitInfoEnv(message_reward="fact_only"), both + finals)
    assert rewards == [1.0, 0.0, 1.0, 1.0] and m["message_has_unneeded_fact"] == 0.5
    assert _play(SplitInfoEnv(message_reward="fact_only"), ["Vela has 5 coins.", "Tomi has 8 coins."] + finals)[1] == \
        [1.0, 1.0, 1.0, 1.0]
    assert _play(SplitInfoEnv(final_reward="own"), msgs + finals)[1] == [1.0, 1.0, 1.0, 0.0]
    swapped = msgs + finals[::-1]  # agent_a wrong: the team is wrong, though agent_b is right
    assert _play(SplitInfoEnv(), swapped)[1] == [0.0] * 4
    assert _play(SplitInfoEnv(final_reward="own"), swapped)[1] == [0.0, 0.0, 0.0, 1.0]
    _, rewards, m = _play(SplitInfoEnv(), msgs + ["I do not know.", "Answer: 13"])
    assert rewards == [0.0] * 4 and m["no_answer"] == 1.0 and m["agents_agree"] == 0.0
    # the one agent: every turn paid the final answer's correctness
    assert _play(SplitInfoSingleEnv(), ["Answer: 13"])[1:] == ([1.0], {"team_reward": 1.0, "no_answer": 0.0,
                                                                      "message_has_needed_fact": 0.0})
    played, rewards, m = _play(SplitInfoSingleEnv(turns=2), ["Vela has 5 coins. Tomi has 8 coins.", "Answer: 13"])
    assert len(played) == 2 and rewards == [1.0, 1.0] and m["message_has_needed_fact"] == 1.0
    assert chat.continues(played[0][0].messages, played[0][1], played[1][0].messages)


def test_max_rounds_caps_the_rounds_and_a_later_round_ends_on_agreement():
    msgs = ["Vela has 5 coins.", "Tomi has 8 coins."]
    assert len(_play(SplitInfoEnv(max_rounds=3), msgs + ["Answer: 13", "Answer: 13", "x", "y"])[0]) == 4
    played, rewards, m = _play(SplitInfoEnv(max_rounds=3), msgs + ["Answer: 13", "Answer: 12", "Answer: 12", "Answer: 12"])
    assert len(played) == 6 and rewards == [0.0] * 6 and m["agents_agree"] == 1.0
    assert "Tell agent B" in played[2][0].messages[-1]["content"]  # round 2 of 3 is not the last
    assert "Now answer" in played[4][0].messages[-1]["content"]
    assert chat.continues(played[2][0].messages, played[2][1], played[4][0].messages)
    assert len(_play(SplitInfoEnv(max_rounds=2), msgs + ["Answer: 13", "Answer: 12", "x", "y"])[0]) == 4
    assert len(_play(SplitInfoEnv(max_rounds=4), msgs + ["Answer: 1", "Answer: 2"] * 3)[0]) == 8


def test_answers_are_one_word_after_the_last_answer_line():
    assert parse_answer("Answer: 12\nsome more. answer: The Vofutu.") == "vofutu"
    assert parse_answer("**Answer:** 28 pears") == "28" and parse_answer("ANSWER : green, or red") == "green"
    for none in ("no answer here", "Answer:\n28", "Answer: ...", "", None, 42):
        assert parse_answer(none) is None, none
    assert carries("vela has 5 coins", ["Vela", "5"]) and not carries("Vela has 15 coins", ["Vela", "5"])


def test_unneeded_marks_are_the_words_only_that_distractor_holds():
    """A distractor's marks: its own words, not another fact's of the half and not the question's; the needed fact
    has none listed; on every shipped task each of a half's distractors has a mark and none is a needed key."""
    assert unneeded_marks(TASK, TASK["facts_a"]) == [{"rupo", "9"}] and unneeded_marks(TASK, [1]) == []
    chain = {"question": "What colour is the flag of the city where Zobe lives?", "needed": [0, 3],
             "facts": ["Zobe lives in Kadoru.", "Mira lives in Besami.", "Tuli lives in Kadoru.", "x"]}
    assert unneeded_marks(chain, [0, 1, 2]) == [{"mira", "besami"}, {"tuli"}]  # Kadoru is Zobe's too: not a mark
    for t in load_tasks(str(FILES["val"])):
        for side in (t["facts_a"], t["facts_b"]):
            marks = unneeded_marks(t, side)
            keys = {k.lower() for i, ks in zip(t["needed"], t["keys"]) if i in side for k in ks}
            assert len(marks) == len(side) - 1 and not any(m & keys for m in marks), t


def test_aggregate_gives_rates_and_generated_tokens():
    sample = lambda role, n: types.SimpleNamespace(role=role, completion_ids=[0] * n)  # noqa: E731
    eps = [types.SimpleNamespace(metrics={"team_reward": 1.0, "no_answer": 0.0, "agents_agree": 1.0,
                                          "message_has_needed_fact": 0.5, "message_has_unneeded_fact": 1.0},
                                 samples=[sample("agent_a", 10), sample("agent_b", 20), sample("agent_a", 30)]),
           types.SimpleNamespace(metrics={"team_reward": 0.0, "no_answer": 1.0, "agents_agree": 0.0,
                                          "message_has_needed_fact": 1.0}, samples=[sample("agent_b", 4)]),
           types.SimpleNamespace(metrics={}, samples=[])]  # an env error's episode
    assert aggregate(eps[:2]) == {"team_reward": 0.5, "no_answer": 0.5, "agents_agree": 0.5,
                                  "message_has_needed_fact": 0.75, "message_has_unneeded_fact": 0.5,
                                  "tokens/agent_a": 20.0, "tokens/agent_b": 12.0,
                                  "tokens_per_episode": 32.0}
    assert aggregate([types.SimpleNamespace(metrics=e.metrics) for e in eps])["team_reward"] == 0.5  # compare.py's


# ---------------------------------------------------------------------------------- hostile text, config


def test_1mb_hostile_replies_finish_within_a_cpu_budget():
    mb = 2 ** 20
    shapes = ["Answer:" + " " * mb + "x", ("answer: " * (mb // 8)), "Answer:" + "\t" * mb, "9" * mb, "\ud800" * mb,
              ("Answer: a" + " " * 5000 + "b\n") * (mb // 5000), "\x00" * mb, "answer" + " " * mb + ":"]
    for text in shapes:
        with bounded(5.0, f"{text[:12]!r}"):
            for env in (SplitInfoEnv(max_rounds=3), SplitInfoSingleEnv(turns=2)):
                handed, n = env.reset(TASK), 0
                while prompts_of(handed):
                    handed = env.step([text] * 2 if isinstance(handed, list) else text)
                    n += 1
                rewards, m = env.turn_rewards(), env.metrics()
                assert all(r in (0.0, 1.0) for r in rewards) and m["team_reward"] == 0.0 and n <= 3


def _cfg(name="tiny_split_info.py", **kw):
    cfg = load_config_file(str(ROOT / "configs" / name))
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env_kwargs=kw))


def test_bad_kwargs_merge_turns_and_too_few_turns_are_one_config_error_line():
    from workflows import check_roles
    single = _cfg()
    single = dataclasses.replace(single, roles=(dataclasses.replace(single.roles[0], name="solver"),),
                                 data=dataclasses.replace(single.data, env="split_info_single"))
    bad = [(_cfg(max_rounds=1), "max_rounds"), (_cfg(max_rounds=5), "max_rounds"), (_cfg(max_rounds=True), "max_rounds"),
           (_cfg(max_rounds="2"), "max_rounds"), (_cfg(message_reward="own"), "message_reward"),
           (_cfg(final_reward=1), "final_reward"), (_cfg(rounds=2), "rounds"),
           (dataclasses.replace(single, data=dataclasses.replace(single.data, env_kwargs={"turns": 3})), "turns")]
    for cfg, field in bad:
        with pytest.raises(ConfigError) as e:
            check_roles(cfg)
        assert field in str(e.value) and "\n" not in str(e.value), str(e.value)
    merged = lambda c: dataclasses.replace(c, rollout=dataclasses.replace(c.rollout, merge_turns=True))  # noqa: E731
    with pytest.raises(ConfigError, match=r"^config field rollout.merge_turns: .*paid apart"):
        check_roles(merged(_cfg()))
    check_roles(merged(single))  # the one agent's turns share one reward: they may merge
    short = lambda c, n: dataclasses.replace(c, rollout=dataclasses.replace(c.rollout, max_turns=n))  # noqa: E731
    for cfg in (short(_cfg(), 3), short(_cfg(max_rounds=3), 5),
                short(dataclasses.replace(single, data=dataclasses.replace(single.data, env_kwargs={"turns": 2})), 1)):
        with pytest.raises(ConfigError, match=r"^config field rollout.max_turns: .*truncated"):
            check_roles(cfg)
    check_roles(short(_cfg(max_rounds=3), 6))
    check_roles(short(single, 1))
    check_roles(short(_cfg(max_rounds=3, message_reward="fact", final_reward="own"), 6))


def test_the_recipes_share_data_teacher_budget_and_token_cap():
    """configs/cpu/split_info_single.py is the team's recipe with one agent: the same data, val set, SFT options, RL
    steps and chains, and a cap on generated tokens per task equal to the team's four turns."""
    import recipes
    from workflows import check_roles
    _, team, team_sft = recipes.load_recipe("split_info")
    _, one, one_sft = recipes.load_recipe("split_info_single")
    for cfg in (team, one):
        check_roles(cfg)
    assert team.algo.group_by_turn and one_sft == team_sft and recipes.base_tasks("split_info_single") == 40
    assert (one.data.train_files, one.data.val_files, one.data.val_size) == (team.data.train_files, team.data.val_files, 200)
    assert (one.trainer.total_steps, one.data.batch_size, one.rollout.num_chains) == \
        (team.trainer.total_steps, team.data.batch_size, team.rollout.num_chains)
    assert one.roles[0].max_tokens == 2 * sum(r.max_tokens for r in team.roles)  # 2 rounds x 2 agents


def test_the_tiny_config_trains_one_step(tmp_path):
    import train
    cfg = load_config_file(str(ROOT / "configs" / "tiny_split_info.py"))
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, total_steps=1, test_freq=1,
                                                               output_dir=str(tmp_path / "run")))
    m = train.main(cfg)
    assert "train/reward/agent_a" in m and "train/reward/agent_b" in m
    assert {"val/team_reward", "val/agents_agree", "val/message_has_needed_fact", "val/tokens_per_episode"} <= set(m)
