"""The deep-research team (envs/research.py): scripted teams through every branch with rewards worked
out by hand, the parsers on edge cases and hostile text, the 3-/4-hop generator and the HotpotQA
loader, and two training steps on the tiny model."""
import dataclasses
import json
import os

import pytest

import learner
import train
import trajectories
from agents.research_team import clean_doc_id, parse_citations, parse_plan, parse_report
from config import AlgoConfig, Config, ConfigError, load_config_file
from data.math_data import DataError
from data.research_data import LARGER, generate, load_research
from data.search_data import generate as generate_world
from envs.research import ResearchEnv, aggregate
from helpers import play
from chat import chat_ids as _chat_ids
from rollout import Episode, Sample, merge_turns
from workflows import check_roles, load_data, workflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data")
CORPUS = {d["id"]: d for d in map(json.loads, open(os.path.join(DATA, "search_corpus.jsonl")))}
# product4 (Huljorfel, a loom) is made by company11 (Yrwes Foundry), headquartered in city8_2 (Rutem),
# a city of country8 (Ultemwes), whose capital is Felmi
T4 = {"question": "What is the capital of the country where the company that makes Huljorfel has its headquarters?",
      "answer": "Felmi", "support": ["product4", "company11", "city8_2", "country8"], "hops": 4}


def perfect(task, docs=CORPUS):
    """A scripted team that does everything right: one sub-question per supporting document, each noting the
    sentence that names the entity its hop leads to (the next document's title; the last: the answer)."""
    sup = task["support"]
    out = ["\n".join(f"{i + 1}. What does the document about {docs[d]['title']} say?" for i, d in enumerate(sup))]
    for i, d in enumerate(sup):
        fact = docs[sup[i + 1]]["title"] if i + 1 < len(sup) else task["answer"]
        sentence = next(x for x in docs[d]["text"].split(". ") if fact.lower() in x.lower())
        out += [f"Action: search[{docs[d]['title']}]", f"Action: read_doc[{d}]", f"Action: note[{sentence} [{d}]]"]
    return out + [f"Answer: {task['answer']}\nCitations: " + " ".join(f"[{d}]" for d in sup)]


def test_perfect_team_scores_one_on_every_generated_question():
    env = ResearchEnv()
    tasks = load_research(os.path.join(DATA, "research_train.jsonl")) + load_research(os.path.join(DATA, "research_val.jsonl"))
    assert len(tasks) == 80
    for task in tasks:
        roles, rew, m, _ = play(env, task, perfect(task))
        n = len(task["support"])
        assert roles == ["planner"] + ["researcher"] * 3 * n + ["writer"]
        assert rew == [1.0] * len(roles), (task, rew)
        for k in ("team_reward", "f1", "em", "cite_precision", "cite_recall", "support_retrieved", "support_read",
                  "planner_reward", "researcher_reward", "writer_reward", "facts_noted", "answer_noted"):
            assert m[k] == 1.0, (k, task)
        assert m["sub_questions"] == n and m["rounds"] == 3 * n and m["tool_errors"] == 0 and m["hops"] == n


def test_writer_rewards_by_hand():
    env = ResearchEnv()
    base = perfect(T4)[:-1]
    cites = "Citations: [product4] [company11] [city8_2] [country8]"
    # wrong answer, every citation right: EM 0 * (0.5 + 0.5 * citation F1 1) = 0 (citations earn nothing
    # beside a wrong answer: the additive mix paid 0.5 here, and RL collapsed the writer onto it)
    _, rew, m, _ = play(env, T4, base + ["Answer: Rutem\n" + cites])
    assert rew[-1] == 0.0 and m["team_reward"] == 0.0 and m["f1"] == 0.0 and m["cite_f1"] == 1.0
    _, rew, _, _ = play(env, T4, base + ["Answer: Felmi\n" + cites])
    assert rew[-1] == 1.0
    # a hedge (two names, one right) has F1 2/3 but no exact match: 0, below the committed right answer
    _, rew, m, _ = play(env, T4, base + ["Answer: Felmi Rutem\n" + cites])
    assert m["f1"] == pytest.approx(2 / 3) and m["em"] == 0.0 and rew[-1] == 0.0
    # right answer, no citations: 1 * (0.5 + 0.5 * 0); SQuAD normalisation (case, articles, punctuation)
    _, rew, m, _ = play(env, T4, base + ["Answer: the felmi."])
    assert rew[-1] == 0.5 and m["cite_precision"] == 0.0 and m["cite_recall"] == 0.0 and m["em"] == 1.0
    # a partial answer scores its F1 in the metrics and 0 in the reward
    _, rew, m, _ = play(env, T4, base + ["Answer: the Felmi republic [product4] [company11] [bogus7]"])
    assert m["f1"] == pytest.approx(2 / 3) and m["em"] == 0.0 and rew[-1] == 0.0
    # right answer, citations on the answer line: P = 2/3, R = 2/4, F1 = 4/7; writer = 1 * (0.5 + 0.5 * 4/7) = 11/14
    _, rew, m, _ = play(env, T4, base + ["Answer: Felmi [product4] [company11] [bogus7]"])
    assert (m["cite_precision"], m["cite_recall"], m["cite_f1"]) == pytest.approx((2 / 3, 1 / 2, 4 / 7))
    assert rew[-1] == pytest.approx(11 / 14) and m["team_reward"] == pytest.approx(11 / 14)
    # citation_weight moves the mix: 1 * (0.75 + 0.25 * 4/7) = 25/28
    _, rew, _, _ = play(ResearchEnv(citation_weight=0.25), T4, base + ["Answer: Felmi [product4] [company11] [bogus7]"])
    assert rew[-1] == pytest.approx(25 / 28)
    # no answer at all
    _, rew, m, _ = play(env, T4, base + [""])
    assert rew[-1] == 0.0 and m["no_answer"] == 1.0


def test_planner_and_researcher_rewards_by_hand():
    env = ResearchEnv()
    replies = ["1. What is Huljorfel?\n2. Who made it?",
               "Action: search[Huljorfel]", "Action: read_doc[product4]", "Action: note[Huljorfel is made by Yrwes "
                                                                          "Foundry [product4]]",
               "Action: search[weather]", "Action: read_doc[product4]", "nothing new here",
               "Answer: Felmi\nCitations: [product4]"]
    roles, rew, m, seen = play(env, T4, replies)
    assert roles == ["planner"] + ["researcher"] * 6 + ["writer"]
    # sub-question 1 found a new supporting document (retrieved and read): 1; sub-question 2 found nothing
    # new (re-reading product4 does not count): 0. Planner: precision 1/2 useful sub-questions, recall 1/4
    # supporting documents read -> 2 * 1/2 * 1/4 / (3/4) = 1/3. Writer: F1 1, citations P 1 R 1/4 -> F1 2/5,
    # 0.5 + 0.5 * 2/5 = 0.7
    assert rew == pytest.approx([1 / 3, 1, 1, 1, 0, 0, 0, 0.7])
    assert m["support_read"] == 0.25 and m["support_retrieved"] == 0.25 and m["researcher_reward"] == 0.5
    # what the later roles saw: the second researcher gets the first one's note and ids; the writer, all
    assert "Huljorfel is made by Yrwes Foundry [product4]" in seen[4].messages[1]["content"]
    assert "Documents read: [product4]" in seen[4].messages[1]["content"]
    assert "Your sub-question (2 of 2): Who made it?" in seen[4].messages[1]["content"]
    writer = seen[-1].messages[1]["content"]
    assert "Note: nothing new here" in writer and "(no results)" not in writer
    assert "(no results)" in seen[5].messages[-1]["content"]  # the search for 'weather' found nothing
    # a researcher's rounds extend one conversation (what rollout.merge_turns needs)
    for a, b in ((seen[1], seen[2]), (seen[2], seen[3])):
        assert b.messages[:len(a.messages)] == a.messages and b.messages[len(a.messages)]["role"] == "assistant"
    # retrieved but the wrong document read, a note with no fact: 2/3 * 0.5 = 1/3; the planner's one
    # sub-question led to nothing read: 0
    _, rew, m, _ = play(env, T4, ["1. What is Huljorfel?", "Action: search[Huljorfel]", "Action: read_doc[city0_0]",
                                  "Action: note[no idea]", "Answer: x"])
    assert rew[:4] == pytest.approx([0.0, 1 / 3, 1 / 3, 1 / 3]) and m["support_retrieved"] == 0.25
    assert m["support_read"] == 0.0 and m["facts_noted"] == 0.0 and m["answer_noted"] == 0.0
    # the note is paid for naming where a newly read supporting document leads (product4 -> Yrwes Foundry):
    # the same note beside the wrong document read earns nothing for it (1/3), after reading product4 all (1)
    for doc, note, want in (("city0_0", "Yrwes Foundry makes it", 1 / 3), ("product4", "made by the YRWES foundry!", 1.0),
                            ("product4", "a loom", 2 / 3)):
        _, rew, m, _ = play(env, T4, ["1. What is Huljorfel?", "Action: search[Huljorfel]", f"Action: read_doc[{doc}]",
                                      f"Action: note[{note}]", "Answer: x"])
        assert rew[1] == pytest.approx(want), (doc, note)
    assert m["facts_noted"] == 0.0
    # names match as whole words: "Yrwes Foundrys" does not name Yrwes Foundry (2/3)
    _, rew, _, _ = play(env, T4, ["1. What is Huljorfel?", "Action: search[Huljorfel]", "Action: read_doc[product4]",
                                  "Action: note[Yrwes Foundrys]", "Answer: x"])
    assert rew[1] == pytest.approx(2 / 3)
    # only a NEWLY read document's lead pays: sub-question 2 re-reads product4 and notes its lead: 0
    _, rew, _, _ = play(env, T4, ["1. What is Huljorfel?\n2. Who makes it?", "Action: search[Huljorfel]",
                                  "Action: read_doc[product4]", "Action: note[no idea]", "Action: search[Huljorfel]",
                                  "Action: read_doc[product4]", "Action: note[Yrwes Foundry]", "Answer: x"])
    assert rew[1:7] == pytest.approx([2 / 3] * 3 + [0.0] * 3)
    # a note that lists names it never read earns nothing for the lead it holds: every country and capital of
    # the world (Felmi, Ultemwes and Yrwes Foundry among them) after reading product4: 2/3, and no fact noted
    world = sorted({d["title"] for d in CORPUS.values() if d["id"].startswith("country")}
                   | {d["title"] for d in CORPUS.values() if d["id"].endswith("_0")})
    dump = " ".join(world + ["Yrwes Foundry"])
    _, rew, m, _ = play(env, T4, ["1. What is Huljorfel?", "Action: search[Huljorfel]", "Action: read_doc[product4]",
                                  f"Action: note[{dump}]", "Answer: x"])
    assert "Felmi" in dump and rew[1] == pytest.approx(2 / 3) and m["answer_noted"] == m["facts_noted"] == 0.0
    # nor can a later note launder it: sub-question 1 dumps the list beside its lead, 3 and 4 copy it (2/3 each)
    countries = " ".join(sorted(d["title"] for d in CORPUS.values() if d["id"].startswith("country")))
    _, rew, m, _ = play(env, T4, ["1. Who makes it?\n2. Where is it?\n3. Which country?\n4. Its capital?", "Action: search[Huljorfel]", "Action: read_doc[product4]",
                                  f"Action: note[Yrwes Foundry {dump}]", "Action: search[Yrwes Foundry]",
                                  "Action: read_doc[company11]", "Action: note[Rutem]", "Action: search[Rutem]",
                                  "Action: read_doc[city8_2]", f"Action: note[{countries}]", "Action: search[Ultemwes]",
                                  "Action: read_doc[country8]", f"Action: note[{dump}]", "Answer: x"])
    assert rew[1:13] == pytest.approx([2 / 3] * 3 + [1.0] * 3 + [2 / 3] * 6) and m["answer_noted"] == 0.0
    # note_weight 0: the reward before notes were paid (0.5 retrieved + 0.5 read); 1: the note alone
    play_note = ["1. What is Huljorfel?", "Action: search[Huljorfel]", "Action: read_doc[product4]",
                 "Action: note[Huljorfel is made by Yrwes Foundry]", "Action: search[Felmi]", "Action: read_doc[country8]",
                 "Action: note[its capital is Felmi]", "Answer: Felmi"]
    _, rew, m, _ = play(ResearchEnv(note_weight=0.0), T4, ["1. What is Huljorfel?"] + play_note[1:3] + ["Action: note[a loom]",
                                                                                                       "Answer: x"])
    assert rew[1:4] == [1.0, 1.0, 1.0]
    _, rew, m, _ = play(ResearchEnv(note_weight=1.0), T4, ["1. What is Huljorfel?\n2. Capital?"] + play_note[1:])
    assert rew[1:7] == [1.0] * 6 and m["facts_noted"] == 0.5 and m["answer_noted"] == 1.0
    with pytest.raises(ConfigError, match="data.env_kwargs.note_weight"):
        ResearchEnv(note_weight=1.5)


def test_planner_gate():
    """The planner's F1 is paid only where the team reached the answer: ungated, a four-hop chain planned as 3
    sub-questions (all read, 3 of 4 supporting documents) earns 6/7, above 4 sub-questions whose last was missed
    (3/4); gated both earn 0 and the plan that reaches the answer earns 1. A right answer the notes do not name
    (a yes/no question's) opens the gate too."""
    hops = [("Huljorfel", "product4", "Yrwes Foundry"), ("Yrwes Foundry", "company11", "Rutem"),
            ("Rutem", "city8_2", "Ultemwes"), ("Ultemwes", "country8", "Felmi")]

    def chain(n_planned, n_done, answer):
        plan = "\n".join(f"{i + 1}. What does {q} lead to?" for i, (q, _, _) in enumerate(hops[:n_planned]))
        acts = []
        for i, (q, doc, lead) in enumerate(hops[:n_planned]):
            done = i < n_done
            acts += [f"Action: search[{q}]", f"Action: read_doc[{doc if done else 'city0_0'}]",
                     f"Action: note[{lead if done else 'no idea'}]"]
        return [plan] + acts + [f"Answer: {answer}"]

    for gate, cases in ((True, [((4, 4, "Felmi"), 1.0), ((3, 3, "Ultemwes"), 0.0), ((4, 3, "Ultemwes"), 0.0),
                                ((3, 3, "Felmi"), 6 / 7)]),
                        (False, [((4, 4, "Felmi"), 1.0), ((3, 3, "Ultemwes"), 6 / 7), ((4, 3, "Ultemwes"), 3 / 4),
                                 ((3, 3, "Felmi"), 6 / 7)])):
        for (planned, done, answer), want in cases:
            _, rew, m, _ = play(ResearchEnv(planner_gate=gate), T4, chain(planned, done, answer))
            assert rew[0] == pytest.approx(want) and m["planner_reward"] == pytest.approx(want), (gate, planned, done)
            assert m["answer_noted"] == float(done == 4)
    with pytest.raises(ConfigError, match="data.env_kwargs.planner_gate"):
        ResearchEnv(planner_gate="yes")


def test_group_by_turn_compares_sub_questions_across_chains(tiny):
    """algo.group_by_turn centres a turn among the other chains' turns at the same place. Two chains of T4 whose
    first sub-question took 2 rounds in one and 3 in the other: their second sub-questions start at turns 3 and 4
    and their writers at 6 and 7, yet the env keys them alike (Prompt.key), merged rounds keep the first round's
    key, and GRPO centres the second sub-questions against each other (the one that read the right document
    above, the other below). Keyed by the turn's index instead, each was a group of one, whose advantage is its
    raw reward (verl's), so both were pushed up."""
    _, tok = tiny
    plan = "1. Who makes Huljorfel?\n2. Where is that company?"
    sub2 = lambda doc: ["Action: search[Yrwes Foundry]", f"Action: read_doc[{doc}]", "Action: note[Rutem [company11]]"]
    chains = [[plan, "Action: search[Huljorfel]", "Action: note[Yrwes Foundry makes it [product4]]"] + sub2("company11"),
              [plan, "Action: search[Huljorfel]", "Action: read_doc[product4]", "Action: note[Yrwes Foundry [product4]]"]
              + sub2("city0_0")]
    samples = []
    for e, replies in enumerate(chains):
        replies = replies + ["Answer: Rutem [product4] [company11]"]
        _, rew, _, seen = play(ResearchEnv(), T4, replies)
        for t, (p, reply, r) in enumerate(zip(seen, replies, rew)):
            ids = tok.encode(reply)
            samples.append(Sample(e, 0, p.role, t, _chat_ids(tok, p.messages), ids, [-1.0] * len(ids), reward=r, key=p.key))
    merged = merge_turns(samples)
    res = [s for s in merged if s.role == "researcher"]
    assert [(s.episode_id, s.turn, s.key, s.merged_turns) for s in res] == [
        (0, 1, ("sub", 0, 0), 2), (0, 3, ("sub", 1, 0), 3), (1, 1, ("sub", 0, 0), 3), (1, 4, ("sub", 1, 0), 3)]
    writers = [s for s in merged if s.role == "writer"]
    assert [s.turn for s in writers] == [6, 7] and writers[0].key == writers[1].key == ("write",)
    cfg = Config(algo=AlgoConfig(adv_estimator="grpo", group_by_turn=True))
    assert len({learner.group_key(cfg, s) for s in merged}) == 4  # planner, sub-question 1, sub-question 2, writer
    rb = learner.AdapterBatch(res, [s.reward for s in res], tok.pad_token_id, 1536)
    adv, _ = learner.advantages(cfg, rb, None, None, 0.0)
    a = ((adv * rb.mask).sum(1) / rb.mask.sum(1)).tolist()
    assert res[1].reward > res[3].reward and a[1] > 0 > a[3]  # sub-question 2: the right read above the wrong one
    unkeyed = [dataclasses.replace(s, key=None) for s in res]  # what the turn's index did: groups of one
    adv0, _ = learner.advantages(cfg, learner.AdapterBatch(unkeyed, [s.reward for s in res], tok.pad_token_id, 1536),
                                 None, None, 0.0)
    assert res[3].reward > 0 and ((adv0 * rb.mask).sum(1) / rb.mask.sum(1))[3] > 0  # pushed up, though it read the wrong document


def test_round_credit_pays_each_round_for_what_it_did():
    """round_credit: a search that lists a supporting document new to the sub-question, which it then reads, earns
    1 (the same search again: 0; a find never read: 0, so searching alone cannot farm it), a read of a new one 1
    (a re-read, or a document read by an earlier sub-question: 0), the note what the note component pays, an
    error 0. Off, every round of a sub-question earns the sub-question's one
    reward. It needs unmerged rounds grouped round for round: check_config says so in one line each."""
    replies = ["1. Who makes Huljorfel?\n2. Where is that company?",
               "Action: search[Huljorfel]", "Action: search[Huljorfel]", "Action: read_doc[product4]",
               "Action: note[Huljorfel is made by Yrwes Foundry [product4]]",
               "Action: read_doc[product4]", "Action: read_doc[nosuchdoc]", "Action: search[Yrwes Foundry]",
               "Action: note[no idea]", "Answer: Rutem [product4]"]
    _, on, m_on, _ = play(ResearchEnv(round_credit=True, max_rounds=4), T4, replies)
    _, off, m_off, _ = play(ResearchEnv(max_rounds=4), T4, replies)
    assert on[1:9] == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # sub-question 2 listed company11, never read it
    _, found, _, _ = play(ResearchEnv(round_credit=True, max_rounds=4), T4, replies[:7] + [
        "Action: search[Yrwes Foundry]", "Action: read_doc[company11]", "Answer: Rutem"])
    assert found[5:9] == [0.0, 0.0, 1.0, 1.0]  # the same search, its find read: both paid
    _, perfect_on, _, _ = play(ResearchEnv(round_credit=True), T4, perfect(T4))
    assert perfect_on == [1.0] * len(perfect_on)  # the perfect team is paid in full either way
    # off: sub-question 1 found, read and noted (1); sub-question 2 only found company11 (2/3 * 0.5)
    assert off[1:9] == pytest.approx([1.0] * 4 + [1 / 3] * 4)
    assert on[0] == off[0] and on[-1] == off[-1] and m_on == m_off  # the planner, the writer and the metrics alike
    with pytest.raises(ConfigError, match="data.env_kwargs.round_credit"):
        ResearchEnv(round_credit=1)
    cfg = load_config_file(os.path.join(ROOT, "configs", "research.py"))
    on_kw = dataclasses.replace(cfg.data, env_kwargs={**cfg.data.env_kwargs, "round_credit": True})
    check_roles(cfg)  # off: nothing to say
    with pytest.raises(ConfigError, match="config field rollout.merge_turns: round_credit"):
        check_roles(dataclasses.replace(cfg, data=on_kw))
    unmerged = dataclasses.replace(cfg, data=on_kw, rollout=dataclasses.replace(cfg.rollout, merge_turns=False))
    with pytest.raises(ConfigError, match="config field algo.group_by_turn: round_credit"):
        check_roles(unmerged)
    check_roles(dataclasses.replace(unmerged, algo=dataclasses.replace(cfg.algo, group_by_turn=True)))


def test_branches_plan_fallback_budget_errors_truncation():
    env = ResearchEnv(max_rounds=2, max_sub_questions=2)
    # no plan: the question itself is researched; the planner earns 0
    roles, rew, m, seen = play(env, T4, ["I will not plan", "Action: search[Huljorfel]", "Action: read_doc[product4]",
                                         "Answer: Felmi [product4]"])
    assert roles == ["planner", "researcher", "researcher", "writer"] and m["no_plan"] == 1.0 and rew[0] == 0.0
    assert f"Your sub-question (1 of 1): {T4['question']}" in seen[1].messages[1]["content"]
    assert rew[1:3] == pytest.approx([2 / 3, 2 / 3])  # found and read, but no note: the budget of 2 rounds spent
    assert "Note: (none)" in seen[3].messages[1]["content"]
    # the plan is capped at max_sub_questions; errors cost a round and are counted
    roles, rew, m, seen = play(ResearchEnv(max_rounds=3, max_sub_questions=2, planner_gate=False), T4, [
        "1. a b c?\n2. d e f?\n3. g h i?", "Action: read_doc[nosuchdoc]", "Action: fly[away]",
        "Action: read_doc[[Product4]]",
        '<tool_call>{"name": "read_doc", "arguments": {"id": "id: company11"}}</tool_call>', "Action: note[done]",
        "Answer: x"])
    assert roles == ["planner"] + ["researcher"] * 5 + ["writer"]
    assert m["sub_questions"] == 2 and m["tool_errors"] == 2
    assert "no document with id 'nosuchdoc'" in seen[2].messages[-1]["content"]
    assert "unknown tool 'fly'; available: search, read_doc, note" in seen[3].messages[-1]["content"]
    assert seen[5].messages[-1]["content"].startswith("Observation:\n[company11] Yrwes Foundry: Yrwes Foundry is a")
    assert "Your sub-question (2 of 2): d e f?" in seen[4].messages[1]["content"]
    # ids written loosely were read (not retrieved, and no note names where they lead: 2/3 * 0.5 each);
    # planner P 2/2, R 2/4 -> 2/3 (ungated: the answer was not reached; test_planner_gate)
    assert rew == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 0.0]) and m["support_read"] == 0.5
    # cut short by rollout.max_turns: scored on the turns taken
    env.reset(T4)
    env.step("1. What is Huljorfel?")
    env.step("Action: search[Huljorfel]")
    assert env.turn_rewards() == pytest.approx([0.0, 1 / 3]) and env.metrics()["no_answer"] == 1.0
    # a fork (ReMax's greedy twin) shares the index, copies the state
    twin = env.fork()
    assert twin.tool is env.tool and twin.subs == env.subs and twin.subs is not env.subs
    twin.step("Action: read_doc[product4]")
    assert env.subs[0]["read"] == [] and twin.subs[0]["read"] == ["product4"]


def test_env_kwargs_are_checked():
    with pytest.raises(ConfigError, match=r"data\.env_kwargs\.max_rounds: must be an integer >= 1, got 0"):
        ResearchEnv(max_rounds=0)
    with pytest.raises(ConfigError, match=r"data\.env_kwargs\.citation_weight: must be in \[0, 1\], got 2"):
        ResearchEnv(citation_weight=2)


# ---------------------------------------------------------------------------------- parsers

HOSTILE = ["1. " + " " * 32_000, "Answer:" + " " * 32_000 + "x", "[" * 50_000, "[a]" * 20_000, "\x00" * 5_000,
           "1" * 5_000, "Sub-question" + " " * 30_000 + "1", "\ud800 lone surrogate", "Citations:" + " ," * 20_000,
           "Action: read_doc[" + "[" * 30_000, "- " * 20_000 + "?"]


def test_parse_plan():
    assert parse_plan("1. Who founded X?\n2) Where was that person born?\n- In which country is that city?\n"
                      "* What is its capital?\n5. One too many?") == [
        "Who founded X?", "Where was that person born?", "In which country is that city?", "What is its capital?"]
    assert parse_plan("Sub-questions:\nSub-question 1: Who made Huljorfel?\nQ2: Where is it made?\n"
                      "2. **Who made Huljorfel?**") == ["Who made Huljorfel?", "Where is it made?"]
    assert parse_plan("Who made X?\nWhere is it?\nThanks.") == ["Who made X?", "Where is it?"]  # no list: the '?' lines
    # SmolLM2 writes its list on one line; a number inside an item does not split it
    assert parse_plan("1. Who founded Yrgar Foundry? 2. Where was that person born? 3) Is 3.5 km far? "
                      "(4) Which year, 2. or 3.?") == ["Who founded Yrgar Foundry?", "Where was that person born?",
                                                       "Is 3.5 km far?", "Which year, 2. or 3.?"]
    assert parse_plan("1. a\n2.\n3. ok ok ok", max_items=2) == ["ok ok ok"]  # too short / empty items dropped
    assert parse_plan("1. x y z?\n2. u v w?", max_items=1) == ["x y z?"]
    assert parse_plan("") == [] and parse_plan(None) == [] and parse_plan("Just answer it.") == []
    assert len(parse_plan("1. " + "a" * 100_000)[0]) == 200
    for h in HOSTILE:
        assert isinstance(parse_plan(h), list)


def test_parse_report_and_ids():
    assert parse_report("Answer: Felmi\nCitations: [product4] [company11]") == ("Felmi", ["product4", "company11"])
    assert parse_report("Answer: Felmi [product4][country8].") == ("Felmi", ["product4", "country8"])
    assert parse_report("Answer: Felmi Citations: [p1], p2") == ("Felmi", ["p1", "p2"])
    assert parse_report("The answer is \\boxed{Felmi}. Sources: product4, city8_2") == ("Felmi", ["product4", "city8_2"])
    assert parse_report("Felmi\n") == ("Felmi", []) and parse_report("Citations: [a1]") == (None, ["a1"])
    assert parse_report("Answer: [Felmi]") == ("Felmi", ["Felmi"])  # a bracketed answer: kept, and a (wrong) citation
    assert parse_report("Answer: x\nCitations: none") == ("x", [])
    assert parse_report("Answer: x [a, b; c] [a]") == ("x", ["a", "b", "c"])
    assert parse_report("") == (None, []) and parse_report(None) == (None, []) and parse_report("Answer: ") == (None, [])
    assert len(parse_citations("[a]" * 20_000 + " " + " ".join(f"[d{i}]" for i in range(30)))) == 20
    for s in ("[city0_0]", '"city0_0"', "id: city0_0", "Document ID = city0_0.", " `city0_0` "):
        assert clean_doc_id(s) == "city0_0", s
    assert clean_doc_id(None) == ""
    for h in HOSTILE:
        a, c = parse_report(h)
        assert (a is None or isinstance(a, str)) and isinstance(c, list) and len(c) <= 20
        assert isinstance(clean_doc_id(h), str)


def test_env_never_raises_on_hostile_replies():
    env = ResearchEnv(max_rounds=2, max_sub_questions=2)
    for h in HOSTILE + [None, 12]:
        for at in range(6):  # the hostile reply at every position of the episode
            turn, n = env.reset(T4), 0
            while turn is not None and n < 20:
                turn, n = env.step(h if n == at else "Action: search[Huljorfel]"), n + 1
            assert turn is None and len(env.turn_rewards()) == n
            assert all(0.0 <= r <= 1.0 for r in env.turn_rewards())


# ---------------------------------------------------------------------------------- data


def _rows(name):
    return [json.loads(ln) for ln in open(os.path.join(DATA, name))]


@pytest.mark.parametrize("prefix, corpus, kw, sizes", [
    ("research", "search_corpus", {}, (160, 60, 20)),
    ("research_world", "research_world_corpus", LARGER, (450, 140, 100))])
def test_generator_is_seeded_disjoint_and_shipped(prefix, corpus, kw, sizes):
    a, b = generate(1, **kw), generate(1, **kw)
    assert a == b and generate(2, **kw) != a
    docs, tr, va = a
    assert (tr, va) == (_rows(f"{prefix}_train.jsonl"), _rows(f"{prefix}_val.jsonl"))  # the files = generate(1)
    # the corpus: search_data's world's documents unchanged and first, then ours
    assert _rows(f"{corpus}.jsonl") == generate_world(**kw.get("world", {}))[0] + docs
    CORPUS = {d["id"]: d for d in _rows(f"{corpus}.jsonl")}
    assert (len(CORPUS), len(tr), len(va)) == sizes and len({d["title"] for d in CORPUS.values()}) == sizes[0]
    if kw:  # company names are two syllables: more companies than free names is refused, not an endless loop
        with pytest.raises(ValueError, match="97 companies, but the world leaves 96 two-syllable names free"):
            generate(1, **{**kw, "n_companies": 97})
    assert not {q["question"] for q in tr} & {q["question"] for q in va}
    assert not {q["support"][0] for q in tr} & {q["support"][0] for q in va}  # no company / product in both
    for split in (tr, va):
        assert {q["hops"] for q in split} == {3, 4}
        for q in split:
            s = q["support"]
            assert len(s) == q["hops"] and all(i in CORPUS for i in s)
            assert CORPUS[s[0]]["title"] in q["question"]
            for x, y in zip(s, s[1:]):  # a chain: each document names the next one
                assert CORPUS[y]["title"] in CORPUS[x]["text"], (x, y)
            assert q["answer"] in CORPUS[s[-1]]["text"]


HOTPOT = {"_id": "h1", "question": "In which country was the author of Book A born?", "answer": "Freedonia",
          "type": "bridge", "level": "hard",
          "supporting_facts": [["Book A", 1], ["Jane Roe", 1]],
          "context": [["Book A", ["Book A is a novel.", " It was written by Jane Roe."]],
                      ["Jane Roe", ["Jane Roe is a writer.", " She was born in Freedonia."]],
                      ["Ships", ["Ships sail on water."]]]}


def test_hotpotqa_loader_and_episode(tmp_path):
    p = tmp_path / "hotpot.json"  # the official release: one JSON list
    p.write_text(json.dumps([HOTPOT]))
    (t,) = load_research(str(p))
    assert t["support"] == ["p0", "p1"] and t["hops"] == 2 and t["id"] == "h1"
    assert t["docs"][1] == {"id": "p1", "title": "Jane Roe", "text": "Jane Roe is a writer. She was born in Freedonia."}
    hf = dict(HOTPOT, context={"title": [c[0] for c in HOTPOT["context"]], "sentences": [c[1] for c in HOTPOT["context"]]},
              supporting_facts={"title": ["Book A", "Jane Roe"], "sent_id": [1, 1]})
    q = tmp_path / "hotpot.jsonl"  # the Hugging Face export, as JSONL
    q.write_text(json.dumps(hf) + "\n")
    assert load_research(str(q)) == [t]
    docs = {d["id"]: d for d in t["docs"]}
    _, rew, m, seen = play(ResearchEnv(), t, perfect(t, docs))
    assert rew == [1.0] * 8 and m["team_reward"] == 1.0 and "[p0] Book A" in seen[2].messages[-1]["content"]
    assert m["answer_noted"] == 1.0 and m["facts_noted"] == 1.0
    # where a document leads does not hang on the order of the supporting facts: reversed, the same play pays 1
    rev = dict(t, support=t["support"][::-1])
    replies = perfect(t, docs)
    _, rew, m, _ = play(ResearchEnv(), rev, replies[:1] + replies[1:7] + ["Answer: Freedonia [p0] [p1]"])
    assert rew[1:7] == [1.0] * 6 and m["facts_noted"] == 1.0
    # a comparison question whose documents lead nowhere (the answer 'yes' is in neither): reading pays the note's share
    cmp_ = dict(t, question="Are Book A and Jane Roe both on Earth?", answer="yes")
    _, rew, m, _ = play(ResearchEnv(), cmp_, ["1. Book A?\n2. Jane Roe?", "Action: search[Book A]", "Action: read_doc[p0]",
                                              "Action: note[yes]", "Action: search[Jane Roe]", "Action: read_doc[p1]",
                                              "Action: note[yes]", "Answer: yes [p0] [p1]"])
    assert rew == [1.0] * 8 and m["facts_noted"] == 1.0  # no document leads anywhere: nothing was left to note
    for row, line, msg in [(dict(HOTPOT, supporting_facts=[["Nope", 0]]), 1, "'supporting_facts' names 'Nope'"),
                           (dict(HOTPOT, context="text"), 1, "field 'context' must be a list of"),
                           ({k: v for k, v in HOTPOT.items() if k != "context"}, 1, "needs field 'context'"),
                           (dict(HOTPOT, answer={"a": 1}), 1, "field 'answer' must be a non-empty string")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps(HOTPOT) + "\n" + json.dumps(row) + "\n")
        with pytest.raises(DataError, match=f"bad.jsonl:{line + 1}: .*{msg}"):
            load_research(str(bad))
    ours = tmp_path / "ours.jsonl"
    ours.write_text(json.dumps(T4) + "\n" + json.dumps(dict(T4, support="city0_0")) + "\n")
    with pytest.raises(DataError, match=r"ours.jsonl:2: field 'support' must be a non-empty list of document ids"):
        load_research(str(ours))
    ours.write_text(json.dumps({"question": "q?", "support": ["a"]}) + "\n")
    with pytest.raises(DataError, match=r"ours.jsonl:1: missing field 'answer'"):
        load_research(str(ours))


# ---------------------------------------------------------------------------------- config and training


def test_aggregate_micro_and_per_hop():
    env, eps = ResearchEnv(), []
    for reply in ("Answer: Felmi [product4] [bogus]", "Answer: Rutem"):
        play(env, T4, perfect(T4)[:-1] + [reply])
        eps.append(Episode(0, 0, None, [], env.metrics()))
    out = aggregate(eps)
    assert out["cite_precision_micro"] == 0.5 and out["cite_recall_micro"] == 1 / 8 and out["f1_4hop"] == 0.5


def test_configs_route_and_tiny_training(tmp_path):
    for name in ("research", "tiny_research"):
        cfg = load_config_file(os.path.join(ROOT, "configs", f"{name}.py")).validate()
        check_roles(cfg)
        tr, va = load_data(cfg)
        assert len(tr) == 60 and all(len(t["support"]) == t["hops"] for t in tr + va)
        assert isinstance(workflow(cfg)[0](), ResearchEnv)
    # the built-in name (config.py's list of built-ins does not take it yet; workflows.py does)
    builtin = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env="research", env_kwargs={}))
    assert isinstance(workflow(builtin)[0](), ResearchEnv) and workflow(builtin)[2] is workflow(cfg)[2]
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=str(tmp_path / "run")))
    metrics = train.main(cfg)
    for role in ("planner", "researcher", "writer"):
        assert f"train/reward/{role}" in metrics and f"val/reward/{role}" in metrics, role
    rows = [json.loads(ln) for ln in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 2]  # two train steps and the final eval
    assert {"train/cite_precision_micro", "train/support_read", "val/planner_reward"} <= set(rows[0]) | set(rows[2])
    # the rounds train merged (rollout.merge_turns), and each turn's record still shows the advantage it trained on
    recs = trajectories.read(tmp_path / "run" / "trajectories" / "train_step_000001.jsonl")
    turns = [t for r in recs for t in r["turns"]]
    assert turns and all(t["advantage"] is not None for t in turns), [t["role"] for t in turns if t["advantage"] is None]
