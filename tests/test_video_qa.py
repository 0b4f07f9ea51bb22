"""The video-QA team (envs/video_qa.py): rewards worked out by hand on a hand-written video, the
agreement skip, the parsers on edge cases and 1 MB hostile text, the seeded generator and its
shipped files, the real-caption loader (NExT-QA / EgoSchema), the calculator's video domain, the
scripted teacher of sft.py, compare.py and eval.py on a run, and two training steps on the tiny model."""
import copy
import csv
import dataclasses
import json
import math
import os
import re
import time
import types

import pytest

from agents.video_team import (answer_format, has_reason, parse_choice, parse_clip_ids, parse_triples, report_lines,
                               temporal_reference)
from config import ConfigError, load_config_file
from data.math_data import DataError
from data.video_data import (ACTIONS, CAUSAL, GENERIC, N_TRAIN, N_VAL, PEOPLE, PLACES, aliases_of, because, generate,
                             load_video, phrase, subgraph)
from envs import play_replies
from envs.video_qa import ROLES, VideoQAEnv, aggregate, scripted_replies
from helpers import bounded, play
from rewards.calculator import RewardCalculator, detect_workflow, video_components
from rewards.video import citation_scores, clip_id, graph_scores, normalise_name
from rollout import Episode, Sample

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data")

# a hand-written video: Ben knocks the vase over (c2), so Anna repairs it (c3)
VIDEO = {
    "video": "hand1",
    "clips": [{"id": "c1", "start": 0, "end": 4, "caption": "Anna grabs the red cup in the kitchen."},
              {"id": "c2", "start": 4, "end": 8, "caption": "Ben topples the vase."},
              {"id": "c3", "start": 8, "end": 12, "caption": "Anna repairs the vase."},
              {"id": "c4", "start": 12, "end": 16, "caption": "Anna puts down the cup."},
              {"id": "c5", "start": 16, "end": 20, "caption": "Ben takes something."},
              {"id": "c6", "start": 20, "end": 24, "caption": "Anna picks up the cup."}],
    "graph": [["Anna", "pick up", "cup", "c1"], ["Ben", "knock over", "vase", "c2"], ["Anna", "glue", "vase", "c3"],
              ["Anna", "put down", "cup", "c4"], ["Ben", "pick up", "plate", "c5"], ["Anna", "pick up", "cup", "c6"],
              ["c1", "before", "c3"], ["c3", "before", "c4"], ["c4", "before", "c6"], ["c2", "before", "c5"],
              ["c2", "causes", "c3"]],
    "aliases": {"grabs": "pick up", "takes": "pick up", "topples": "knock over", "toppled": "knock over",
                "repairs": "glue"},
    "questions": [
        {"id": "hand1_q1", "type": "causal", "question": "Why did Anna glue the vase?",
         "choices": ["Because Anna picked up the cup.", "Because Ben picked up the plate.",
                     "Because Ben knocked over the vase.", "Because Anna put down the cup.", "Because Ben glued it."],
         "answer": 2, "support": ["c2", "c3"]},
        {"id": "hand1_q2", "type": "temporal", "question": "What did Anna do after she glued the vase?",
         "choices": ["pick up the cup", "put down the cup", "knock over the vase", "glue the vase", "pick up the plate"],
         "answer": 1, "support": ["c3", "c4"]},
        {"id": "hand1_q3", "type": "descriptive", "question": "How many times did Anna pick up the cup?",
         "choices": ["0", "1", "2", "3", "4"], "answer": 2, "support": ["c1", "c6"]}]}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    p = tmp_path_factory.mktemp("video") / "hand.jsonl"
    p.write_text(json.dumps(VIDEO) + "\n")
    return load_video(str(p))


CAP = "[c2] Ben knocks over the vase.\n[c3] Then Anna repairs it.\nChoice: C"
GRAPH = "(Ben, knock over, vase) [c2]\n(Anna, glue, vase) [c3]\n(c2, causes, c3)\nChoice: C"


# ---------------------------------------------------------------------------------- rewards by hand


def test_the_loader_builds_each_questions_scene_graph(tasks):
    causal, temporal, count = tasks
    assert causal["graph"] == [["Ben", "knock over", "vase", "c2"], ["Anna", "glue", "vase", "c3"], ["c2", "causes", "c3"]]
    assert temporal["graph"] == [["Anna", "glue", "vase", "c3"], ["Anna", "put down", "cup", "c4"], ["c3", "before", "c4"]]
    assert count["graph"] == [["Anna", "pick up", "cup", "c1"], ["Anna", "pick up", "cup", "c6"]]  # c1, c6: no direct link
    assert [t["type"] for t in tasks] == ["causal", "temporal", "descriptive"] and causal["clips"] == VIDEO["clips"]


def test_captioner_citation_f1_by_hand(tasks):
    env, task = VideoQAEnv(parallel=False), tasks[0]  # S = {c2, c3}
    cases = [(CAP, 1.0),
             ("[c3] Anna repairs the vase.\n[c4] She puts down the cup.\nChoice: C", 0.5),  # P 1/2, R 1/2
             ("Anna fixes the vase.\nChoice: C", 0.0),  # cites nothing
             ("[c2] [c2] c2, clip 2, C02 and [c3]. Choice: C", 1.0),  # duplicates count once
             ("[c2] [c3] [c99]\nChoice: C", 0.8),  # an unknown clip is a wrong citation: P 2/3, R 1
             ("[c2]\nChoice: C", 2 / 3)]  # P 1, R 1/2
    for reply, want in cases:
        _, rew, m, _ = play(env, task, [reply, GRAPH, "Answer: C"])
        assert rew[0] == pytest.approx(want), reply
        assert m["cite_f1"] == pytest.approx(want) and rew[1:] == [1.0, 1.0]
    _, _, m, _ = play(env, task, ["[c2] [c3] [c99]\nChoice: C", GRAPH, "Answer: C"])
    assert (m["cite_precision"], m["cite_recall"], m["n_cited"], m["n_cited_support"]) == pytest.approx((2 / 3, 1, 3, 2))


def test_grapher_triple_f1_by_hand(tasks):
    env, task = VideoQAEnv(parallel=False), tasks[0]  # G = {(ben, knock over, vase, c2), (anna, glue, vase, c3), (c2 causes c3)}
    # names normalised (case, articles, verb forms), the caption's verb mapped by the aliases, a link reversed
    same = "(Ben, Knocked Over, the Vase) [C2]\n(anna, repairs, vase, c3)\n(c3, caused by, c2)\nChoice: C"
    _, rew, m, _ = play(env, task, [CAP, same, "Answer: C"])
    assert rew[1] == 1.0 and m["triple_f1"] == 1.0
    piped = "Ben | topples | vase | c2\nAnna | glued | vase | c3\n(c2, leads to, c3)"
    assert play(env, task, [CAP, piped, "Answer: C"])[1][1] == 1.0
    # one right (toppled = knock over), a wrong clip, a wrong relation, an extra: P 1/4, R 1/3 -> F1 2/7
    part = "(Ben, toppled, vase) [c2]\n(Anna, glue, vase) [c4]\n(c2, before, c3)\n(Anna, pick up, cup) [c1]"
    _, rew, m, _ = play(env, task, [CAP, part, "Answer: C"])
    assert rew[1] == pytest.approx(2 / 7) and (m["triple_precision"], m["triple_recall"]) == pytest.approx((1 / 4, 1 / 3))
    assert m["n_triples"] == 4 and m["n_triples_right"] == 1 and m["n_gold_triples"] == 3
    # the same triple written twice counts once; a triple without its clip is not the clip's triple
    _, rew, m, _ = play(env, task, [CAP, "(Ben, knock over, vase) [c2]\n(Ben, knocks over, a vase, c2)\n"
                                         "(Anna, glue, vase)", "Answer: C"])
    assert m["n_triples"] == 2 and rew[1] == pytest.approx(2 * 0.5 * (1 / 3) / (0.5 + 1 / 3))
    assert play(env, task, [CAP, "The vase broke. Choice: C", "Answer: C"])[1][1] == 0.0
    # without the aliases, 'repairs' is not 'glue'
    assert graph_scores([("Anna", "repairs", "vase", "c3")], [["Anna", "glue", "vase", "c3"]]) == (0, 0, 0)
    assert graph_scores([("Anna", "repairs", "vase", "c3")], [["Anna", "glue", "vase", "c3"]],
                        {"repairs": "glue"}) == (1, 1, 1)


def test_organizer_right_wrong_unparsable(tasks):
    env, task = VideoQAEnv(parallel=False), tasks[0]
    for reply, want, no_answer in [("Answer: C\nReason: Ben toppled the vase first [c2].", 1.0, 0.0),
                                   ("Answer: A", 0.0, 0.0), ("I am not sure what happened.", 0.0, 1.0),
                                   ("Answer: because Ben knocked over the vase", 1.0, 0.0), ("", 0.0, 1.0)]:
        roles, rew, m, seen = play(env, task, [CAP, GRAPH, reply])
        assert roles == list(ROLES) and rew[2] == want and m["team_reward"] == want and m["no_answer"] == no_answer
    # the organizer sees both reports (the shared history), never the captions
    org = seen[2].messages[1]["content"]
    assert CAP in org and GRAPH in org and "Anna grabs the red cup" not in org
    assert "Anna grabs the red cup" in seen[0].messages[1]["content"] and "[c1 0:00-0:04]" in seen[0].messages[1]["content"]
    assert CAP not in seen[1].messages[1]["content"]  # the grapher works independently of the captioner


def test_no_prompt_shows_a_letter_to_copy(tasks):
    """Every role's prompt shows its format with `<letter>` where the choice goes, never a letter: with
    `Choice: B` in the examples, the SFT'd SmolLM2 stated B on 87 to 101 of 102 val questions in every role (and D
    on 26 of 30 with a D there). Read by the env's own parser: no choice in any system prompt; a letter put back is
    one. (The user message lists the choices, A. to E., in the same order for every role.)"""
    env, task = VideoQAEnv(parallel=False), tasks[0]
    roles, _, _, seen = play(env, task, [CAP, GRAPH, "Answer: C"])
    for role, obs in zip(roles, seen):
        system, user = (m["content"] for m in obs.messages)
        assert "<letter>" in system and "<letter>" in user, role  # the example and the task's last line
        assert parse_choice(system, task["choices"]) is None, (role, system)
        assert parse_choice(system.replace("<letter>", "B"), task["choices"]) == 1, role  # a letter would be read


def test_agreement_skip(tasks):
    task = tasks[0]
    on = VideoQAEnv(skip_on_agreement=True, parallel=False)
    # both name C: the episode ends after the grapher with C, no organizer turn
    roles, rew, m, _ = play(on, task, [CAP, GRAPH])
    assert roles == ["captioner", "grapher"] and rew == [1.0, 1.0]
    assert (m["team_reward"], m["agree"], m["skipped"]) == (1.0, 1.0, 1.0)
    # both name A (wrong): skipped, the team is wrong; the agents keep their own rewards
    roles, rew, m, _ = play(on, task, [CAP.replace("Choice: C", "Choice: A"), GRAPH.replace("Choice: C", "Choice: A")])
    assert roles == ["captioner", "grapher"] and rew == [1.0, 1.0] and m["team_reward"] == 0.0 and m["skipped"] == 1.0
    # they disagree, or one names nothing: the organizer speaks, and is paid (trained)
    for cap in (CAP.replace("Choice: C", "Choice: B"), CAP.replace("Choice: C", "")):
        roles, rew, m, _ = play(on, task, [cap, GRAPH, "Answer: C"])
        assert roles == list(ROLES) and rew[2] == 1.0 and m["skipped"] == 0.0 and m["agree"] == 0.0
    # off (the default): the organizer always speaks; agreement is still logged
    roles, rew, m, _ = play(VideoQAEnv(), task, [CAP, GRAPH, "Answer: B"])
    assert roles == list(ROLES) and rew[2] == 0.0 and m["team_reward"] == 0.0
    assert (m["agree"], m["skipped"]) == (1.0, 0.0)
    with pytest.raises(ConfigError, match=r"data\.env_kwargs\.skip_on_agreement: must be true or false"):
        VideoQAEnv(skip_on_agreement="yes")
    with pytest.raises(ConfigError, match=r"data\.env_kwargs\.max_report_chars: must be an integer >= 50"):
        VideoQAEnv(max_report_chars=10)


def test_aggregate_by_type_agreement_skip_and_tokens(tasks):
    on, eps = VideoQAEnv(skip_on_agreement=True, parallel=False), []
    for task, replies in [(tasks[0], [CAP, GRAPH]),  # agree on C: skipped, right
                          (tasks[1], ["[c3] [c4]\nChoice: B", "Choice: A", "Answer: B"]),  # disagree; right
                          (tasks[2], ["[c1]\nChoice: A", "Choice: B", "Answer: D"])]:  # disagree; wrong
        play(on, task, replies)
        steps = [Sample(0, 0, r, i, [], [0] * (5 + i), []) for i, r in enumerate(ROLES[:len(replies)])]
        eps.append(Episode(0, 0, None, steps, on.metrics()))
    out = aggregate(eps)
    assert (out["acc_causal"], out["acc_temporal"], out["acc_descriptive"]) == (1.0, 1.0, 0.0)
    assert out["agreement_rate"] == pytest.approx(1 / 3) and out["skip_rate"] == pytest.approx(1 / 3)
    assert out["tokens/captioner"] == 5 and out["tokens/grapher"] == 6 and out["tokens/organizer"] == 7
    assert out["tokens/episode"] == pytest.approx((11 + 18 + 18) / 3)
    # citations: 2/2, 2/2, 1/2 -> micro precision 5/5, recall 5/6
    assert out["cite_precision_micro"] == 1.0 and out["cite_recall_micro"] == pytest.approx(5 / 6)
    assert "tokens/captioner" not in aggregate([Episode(0, 0, None, [], e.metrics) for e in eps])


def test_questions_without_grounding_pay_the_team_reward(tasks):
    task = dict(tasks[0], support=[], graph=None)  # what a real file without grounding gives
    _, rew, m, _ = play(VideoQAEnv(), task, ["[c2]\nChoice: C", "(Ben, topples, vase) [c2]", "Answer: C"])
    assert rew == [1.0, 1.0, 1.0] and m["cite_f1"] == 0.0 and m["triple_f1"] == 0.0
    _, rew, _, _ = play(VideoQAEnv(), task, ["[c2]\nChoice: C", "(Ben, topples, vase) [c2]", "Answer: D"])
    assert rew == [0.0, 0.0, 0.0]


def test_cut_short_episode_and_step_after_end(tasks):
    env = VideoQAEnv(parallel=False)
    env.reset(tasks[0])
    env.step(CAP)
    assert env.turn_rewards() == [1.0] and env.metrics()["no_answer"] == 1.0  # scored on what it did
    env.step(GRAPH)
    env.step("Answer: C")
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("again")


# ---------------------------------------------------------------------------------- parsers

CHOICES = ["pick up the cup", "put down the cup", "knock over the vase", "glue the vase", "3"]


def test_parse_choice():
    for text, want in [("Answer: B", 1), ("Choice: (C)", 2), ("The answer is **D**.", 3), ("final answer = E", 4),
                       ("Answer: A\nno wait. Answer: B", 1), ("Choice: F", None), ("Answer: Anna did it", None),
                       ("Answer: put down the cup.", 1), ("answer: 3", 4), ("B", 1), ("(C)", 2),
                       ("I think so.\nD. glue the vase", 3), ("She will glue the vase", 3), ("", None),
                       ("the cup", None), ("Option: A", 0), ("answer: b", None)]:
        assert parse_choice(text, CHOICES) == want, text
    assert parse_choice("Answer: E", CHOICES[:3]) is None and parse_choice(None, CHOICES) is None
    assert parse_choice("Answer: A", []) is None


def test_parse_clip_ids_and_triples():
    assert parse_clip_ids("[c3] then C04, clip 7, Clip #8, [c3] abc5 c5x c12") == ["c3", "c4", "c7", "c8", "c12"]
    assert parse_clip_ids(" ".join(f"c{i}" for i in range(200))) == [f"c{i}" for i in range(64)]
    assert parse_triples("(Anna, picks up, cup) [c3]\n(Anna, puts down, cup, c4)\nBen | drops | glass | c5\n"
                         "(c3, before, c4)\n(bad)\n(a, b)\n(Ben, drops, glass) at clip 9") == [
        ("Anna", "picks up", "cup", "c3"), ("Anna", "puts down", "cup", "c4"), ("Ben", "drops", "glass", "c5"),
        ("c3", "before", "c4", ""), ("Ben", "drops", "glass", "clip 9")]
    assert parse_triples("(a, b, c)" * 300)[:1] == [("a", "b", "c", "")] and len(parse_triples("(a, b, c)\n" * 300)) == 100
    assert normalise_name("The Red-Cup's") == "red cup" and normalise_name("Picked UP") == normalise_name("picks up")
    assert clip_id("[C03]") == "c3" and clip_id("clip 3") == "c3" and clip_id("c3x") is None and clip_id(3) is None
    assert citation_scores(["c2", "[c2]", "clip 2"], ["c2", "c3"]) == (1.0, 0.5, pytest.approx(2 / 3))
    assert has_reason("Answer: B\nReason: x") and not has_reason("Answer: B") and has_reason("B because x")
    assert temporal_reference("at 0:12 she") and temporal_reference("then she") and not temporal_reference("she did")
    assert report_lines("[c1] a\n[c2] b\nChoice: A\n\n") == 2
    assert answer_format("Answer: B", CHOICES) == 1.0 and answer_format("B", CHOICES) == 0.5
    assert answer_format("no idea", CHOICES) == 0.0


MB = 1 << 20


def _rep(unit, n=MB):
    return (unit * (n // len(unit) + 1))[:n]


HOSTILE = {  # >= 1 MB each: the shapes that break regexes (long runs, a keyword then spaces, nesting, NUL, surrogates)
    "spaces": lambda: " " * MB, "newlines": lambda: "\n" * MB, "answer + spaces": lambda: "Answer:" + " " * MB + "B",
    "answer repeated": lambda: _rep("Answer: "), "answer text repeated": lambda: _rep("Answer: put down the cup x\n"),
    "choice ( repeated": lambda: _rep("Choice: ("), "open parens": lambda: "(" * MB, "close parens": lambda: ")" * MB,
    "unclosed triple": lambda: _rep("(a, b, c"), "triples": lambda: _rep("(Anna, picks up, cup) [c3]\n"),
    "long triple line": lambda: _rep("(Anna, picks up, cup) [c3] "), "pipes": lambda: "|" * MB,
    "pipe lines": lambda: _rep("a | b | c | c1\n"), "clip ids": lambda: _rep("c1 "), "clip words": lambda: _rep("clip "),
    "brackets": lambda: "[" * MB, "bare letters": lambda: _rep("B.\n"), "letter lines": lambda: _rep("B. " + "x" * 300 + "\n"),
    "digits": lambda: "9" * MB, "timestamps": lambda: _rep("0:00 "), "NUL": lambda: "\x00" * MB,
    "surrogates": lambda: _rep("\ud800 Answer: \udc00 (c1, \ud83d"), "commas in parens": lambda: "(" + "," * MB + ")",
    "random": lambda: "".join(chr(32 + (i * 7919) % 95) for i in range(MB)),
}


PARSERS = {
    "parse_choice": lambda s: parse_choice(s, CHOICES), "parse_clip_ids": parse_clip_ids, "parse_triples": parse_triples,
    "has_reason": has_reason, "answer_format": lambda s: answer_format(s, CHOICES),
    "temporal_reference": temporal_reference, "report_lines": report_lines, "normalise_name": normalise_name,
    "clip_id": clip_id, "graph_scores": lambda s: graph_scores(parse_triples(s), VIDEO["graph"], VIDEO["aliases"]),
    "video_components": lambda s: [video_components(r, s, {"choices": CHOICES, "clips": VIDEO["clips"]}, 2)
                                   for r in ROLES],
}


@pytest.fixture(scope="module")
def hostile():
    texts = {k: g() for k, g in HOSTILE.items()}
    assert all(len(t) >= MB for t in texts.values())
    return texts


COMPOSITE = ("graph_scores", "video_components")  # parsers chained: on the shapes that cost the most
WORST = ("surrogates", "answer repeated", "clip ids", "bare letters", "triples", "random")


def test_parsers_survive_1mb_hostile_text(hostile):
    """Linear time: each parser on each 1 MB reply within a deadline (a few to ~100 ms when measured)."""
    for name, fn in PARSERS.items():
        for label, text in hostile.items():
            if name in COMPOSITE and label not in WORST:
                continue
            with bounded(1.0, f"{name} on {label!r}"):
                fn(text)


def test_env_steps_on_1mb_hostile_replies_are_fast_and_never_raise(tasks, hostile):
    worst = 0.0
    for skip in (False, True):
        env = VideoQAEnv(skip_on_agreement=skip, parallel=False)
        for label, text in list(hostile.items()) + [("None", None), ("int", 12)]:
            for at in range(3):  # the hostile reply at every position of the episode
                turn, n = env.reset(tasks[0]), 0
                while turn is not None:
                    if turn.role == "organizer" and at < 2:  # a hostile report reaches the organizer cut short
                        assert len(turn.messages[1]["content"]) < 4000
                    t = time.process_time()  # CPU time: a loaded machine does not fail it
                    with bounded(2.0, f"step {n} on {label!r}"):
                        turn = env.step(text if n == at else [CAP, "Choice: B", "Answer: C"][n])
                    worst, n = max(worst, time.process_time() - t), n + 1
                rew = env.turn_rewards()
                assert len(rew) == n and all(0.0 <= r <= 1.0 for r in rew)
                assert all(isinstance(v, float) and math.isfinite(v) for v in env.metrics().values())
    assert worst < 1.0, f"slowest step {worst:.3f} CPU s"


def test_env_kwargs_cut_captions_and_reports(tasks):
    full = VideoQAEnv(parallel=False).reset(tasks[0]).messages[1]["content"]
    cut = VideoQAEnv(max_caption_chars=200, parallel=False).reset(tasks[0]).messages[1]["content"]
    assert "[c6 0:20-0:24] Anna picks up the cup." in full and "more clips not shown" not in full
    assert "[c1 0:00-0:04]" in cut and "[c6" not in cut and "(... 2 more clips not shown)" in cut
    env = VideoQAEnv(max_report_chars=100, parallel=False)
    env.reset(tasks[0])
    env.step("[c2] " + "Ben knocks over the vase. " * 20)
    org = env.step(GRAPH).messages[1]["content"]
    assert "Ben knocks over the vase. " * 3 + "Ben knocks over t ...\n" in org and "vase. " * 4 not in org
    assert GRAPH in org  # the short report whole
    with pytest.raises(ConfigError, match=r"data\.env_kwargs\.max_caption_chars: must be an integer >= 200"):
        VideoQAEnv(max_caption_chars=True)
    # checked where train.py checks them, before any model loads: the env's constructor, through check_roles
    from workflows import check_roles
    cfg = load_config_file(os.path.join(ROOT, "configs", "tiny_video_qa.py"))
    for kw, msg in [({"max_caption_chars": "6000"}, r"max_caption_chars: must be an integer >= 200, got '6000'"),
                    ({"max_captions": 10}, r"refused \{'max_captions': 10\}: .*unexpected keyword argument")]:
        with pytest.raises(ConfigError, match=rf"^config field data\.env_kwargs.*{msg}"):
            check_roles(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env_kwargs=kw)))


# ---------------------------------------------------------------------------------- data


def _rows(name):
    return [json.loads(ln) for ln in open(os.path.join(DATA, name))]


@pytest.fixture(scope="module")
def generated():
    return generate(0)


def test_generator_is_seeded_and_shipped(generated):
    assert generate(0, 3, 2) == generate(0, 3, 2) and generate(1, 3, 2) != generate(0, 3, 2)
    train, val = generated
    assert (train, val) == (_rows("video_train.jsonl"), _rows("video_val.jsonl"))  # the files = generate(0)
    assert (len(train), len(val)) == (N_TRAIN, N_VAL)
    assert len(load_video(os.path.join(DATA, "video_train.jsonl"))) == 3 * N_TRAIN


def test_train_and_val_share_no_video(generated):
    train, val = generated
    assert not {v["video"] for v in train} & {v["video"] for v in val}
    assert not {json.dumps(v["clips"]) for v in train} & {json.dumps(v["clips"]) for v in val}
    assert len({v["video"] for v in train + val}) == N_TRAIN + N_VAL


def _event_text(q, e):
    return phrase(e[1], e[2]) if q["type"] == "temporal" else because(*e[:3])


def test_questions_are_grounded_answerable_and_their_distractors_plausible(generated):
    omitted = wrong = n_clips = 0
    for v in generated[0] + generated[1]:
        clips = {c["id"]: c for c in v["clips"]}
        assert 8 <= len(clips) <= 20 and list(clips) == [f"c{i + 1}" for i in range(len(clips))]
        assert len({c["end"] - c["start"] for c in v["clips"]}) == 1 and 2 <= v["clips"][0]["end"] <= 5
        assert 1 <= sum(t[1] == "causes" for t in v["graph"]) <= 2
        n_clips += len(clips)
        events = {t[3]: t for t in v["graph"] if len(t) == 4}
        cast = {e[0] for e in events.values()}
        assert set(events) == set(clips) and 2 <= len(cast) <= 3  # one event per clip
        assert {q["type"] for q in v["questions"]} == {"temporal", "causal", "descriptive"}
        noisy = set(v["noise"]["omitted"]) | set(v["noise"]["wrong"])
        omitted, wrong = omitted + len(v["noise"]["omitted"]), wrong + len(v["noise"]["wrong"])
        for c in v["noise"]["omitted"]:
            assert events[c][2] not in clips[c]["caption"]
        for q in v["questions"]:
            ch, sup = q["choices"], q["support"]
            assert len(ch) == 5 == len(set(ch)) and 0 <= q["answer"] < 5 and sup and set(sup) <= set(clips)
            assert not noisy & set(sup)  # noise never touches a supporting clip ...
            for c in sup:  # ... so each names its person and object
                assert events[c][0] in clips[c]["caption"] and events[c][2] in clips[c]["caption"]
            g = subgraph(v["graph"], sup)
            assert g and all(t in v["graph"] for t in g)
            gold = ch[q["answer"]]
            if q["type"] == "descriptive":
                x, a, o = re.fullmatch(r"How many times did (\w+) (.+) the (.+)\?", q["question"]).groups()
                hits = [c for c, e in events.items() if e[:3] == [x, a, o]]
                assert gold == str(len(hits)) and 1 <= len(hits) <= 4 and sorted(hits, key=lambda c: int(c[1:])) == sup
                assert sorted(int(c) for c in ch) == list(range(min(map(int, ch)), min(map(int, ch)) + 5))
                continue
            texts = {_event_text(q, e): c for c, e in events.items()}
            if q["type"] == "causal":  # one distractor: the true cause, done by another person of the video
                x, ca, co = events[sup[0]][:3]
                others = [c for c in ch if c not in texts]
                assert len(others) == 1 and others[0] in {because(p, ca, co) for p in cast} - {because(x, ca, co)}
            else:
                assert all(c in texts for c in ch)  # every choice is an event of this very video
            if q["type"] == "temporal":
                p = q["question"].split()[2]
                mine = [c for c, e in events.items() if e[0] == p]
                a, b = sup
                assert mine.index(b) == mine.index(a) + 1  # consecutive events of the same person
                assert gold == phrase(*events[b if " after " in q["question"] else a][1:3])
            else:
                assert [sup[0], "causes", sup[1]] in v["graph"] and gold == because(*events[sup[0]][:3])
                assert any(((ca, co), (ea, eo)) in CAUSAL for (ca, co), (ea, eo) in
                           [((events[sup[0]][1], events[sup[0]][2]), (events[sup[1]][1], events[sup[1]][2]))])
    assert 0.10 < omitted / n_clips < 0.14 and wrong == 89  # the noise is there (README: 12% of clips, 89 videos)


def test_aliases_map_caption_verbs_without_collisions():
    every = aliases_of(ACTIONS)
    canon = {normalise_name(a): a for a in ACTIONS}
    assert len(canon) == len(ACTIONS)
    seen = {}
    for form, a in every.items():
        k = normalise_name(form)
        assert seen.setdefault(k, a) == a, form  # one normalised form, one action
        assert canon.get(k, a) == a, form  # never another action's own name
    assert set(GENERIC) <= set(ACTIONS) and (len(PEOPLE), len(PLACES), len(ACTIONS)) == (12, 5, 20)


def test_perfect_team_scores_one_on_every_generated_question():
    tasks = load_video(os.path.join(DATA, "video_train.jsonl")) + load_video(os.path.join(DATA, "video_val.jsonl"))
    assert len(tasks) == 3 * (N_TRAIN + N_VAL)
    for skip in (False, True):
        env = VideoQAEnv(skip_on_agreement=skip, parallel=False)
        for task in tasks:
            replies = scripted_replies(task)
            roles, rew, m, _ = play(env, task, replies[:2] if skip else replies)
            assert roles == list(ROLES[:2] if skip else ROLES) and rew == [1.0] * len(roles), task["id"]
            assert (m["team_reward"], m["cite_f1"], m["triple_f1"], m["agree"], m["skipped"]) == (1, 1, 1, 1, skip)


# ---------------------------------------------------------------------------------- real caption files

CAPTIONS = {"1001": ["a man opens the door", "a dog runs in", "the man pets the dog"],
            "1002": [{"start": 0, "end": 2, "caption": "a girl kicks a ball"},
                     {"start": 2, "end": 4, "text": "the ball hits a vase"}]}
NEXT = [{"video": "1001", "frame_count": 90, "width": 640, "height": 480, "question": "why did the man open the door",
         "answer": 1, "qid": 3, "type": "CW", "a0": "to leave", "a1": "the dog came", "a2": "it rained", "a3": "to eat",
         "a4": "to sleep"},
        {"video": "1002", "frame_count": 60, "width": 640, "height": 480, "question": "what did the ball hit",
         "answer": 4, "qid": 7, "type": "DO", "a0": "a cup", "a1": "a door", "a2": "a dog", "a3": "a man", "a4": "a vase"}]


def _write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    return str(path)


def test_real_caption_loader_nextqa_and_egoschema(tmp_path):
    caps = tmp_path / "captions.json"
    caps.write_text(json.dumps(CAPTIONS, indent=1))
    q = _write_csv(tmp_path / "val.csv", NEXT)
    a, b = load_video(f"{q}@{caps}")
    assert (a["id"], a["type"], a["answer"], a["choices"][1], a["support"], a["graph"]) == (
        "1001_3", "causal", 1, "the dog came", [], None)
    assert a["clips"][2] == {"id": "c3", "start": None, "end": None, "caption": "the man pets the dog"}
    assert b["type"] == "descriptive" and b["clips"][1] == {"id": "c2", "start": 0 + 2, "end": 4,
                                                            "caption": "the ball hits a vase"}
    jl = tmp_path / "val.jsonl"  # the same rows as JSONL, with a grounded question
    jl.write_text("".join(json.dumps(dict(r, support=["c2"] if i else None)) + "\n" for i, r in enumerate(NEXT)))
    assert [t["support"] for t in load_video(f"{jl}@{caps}")] == [[], ["c2"]]
    # EgoSchema: q_uid is the caption key; answers in the row or in the answers file
    ego = [{"q_uid": "1001", "google_drive_id": "x", "question": "What does c do?",
            **{f"option {i}": f"thing {i}" for i in range(5)}}]
    (tmp_path / "ego.json").write_text(json.dumps(ego))
    (tmp_path / "answers.json").write_text(json.dumps({"1001": 3}))
    (t,) = load_video(f"{tmp_path / 'ego.json'}@{caps}@{tmp_path / 'answers.json'}")
    assert (t["id"], t["answer"], t["type"], len(t["clips"])) == ("1001", 3, "other", 3)
    # a real question through the env: no grounding, so the agents earn the team reward
    _, rew, m, seen = play(VideoQAEnv(), a, ["[c1] he opens it\nChoice: B", "Choice: B", "Answer: B"])
    assert rew == [1.0, 1.0, 1.0] and m["q_causal"] == 1.0 and "[c2] a dog runs in" in seen[0].messages[1]["content"]
    _, rew, _, _ = play(VideoQAEnv(), b, ["Choice: E", "Choice: E", "Answer: E"])
    assert rew == [1.0, 1.0, 1.0]


def test_real_caption_loader_bad_rows_name_file_and_line(tmp_path):
    caps = tmp_path / "captions.json"
    caps.write_text(json.dumps(CAPTIONS, indent=1))
    for i, (row, msg) in enumerate([(dict(NEXT[1], answer=7), "field 'answer' must be a choice index from 0 to 4"),
                                    (dict(NEXT[1], video="999"), "field video: no captions for video '999'"),
                                    (dict(NEXT[1], a3=""), "field 'a3' must be a non-empty string"),
                                    (dict(NEXT[1], support="c9"), "field 'support' names clip 'c9'")]):
        q = _write_csv(tmp_path / f"bad{i}.csv", [NEXT[0], row])
        with pytest.raises(DataError, match=f"bad{i}.csv:3: {re.escape(msg)}"):
            load_video(f"{q}@{caps}")
    good = _write_csv(tmp_path / "good.csv", NEXT)
    bad = dict(CAPTIONS, **{"1003": [{"start": 1}]})
    caps.write_text(json.dumps(bad, indent=1))
    line = json.dumps(bad, indent=1).splitlines().index(' "1003": [') + 1
    with pytest.raises(DataError, match=f"captions.json:{line}: field \"captions of '1003'\"\\[0\\] has no caption text"):
        load_video(f"{good}@{caps}")
    caps.write_text("[1, 2]")
    with pytest.raises(DataError, match="captions.json:1: expected a JSON object"):
        load_video(f"{good}@{caps}")
    (tmp_path / "ego.json").write_text(json.dumps([{"q_uid": "1001", "question": "q?",
                                                    **{f"option {i}": f"t{i}" for i in range(5)}}]))
    caps.write_text(json.dumps(CAPTIONS))
    with pytest.raises(DataError, match="ego.json:1: field 'answer' is missing"):
        load_video(f"{tmp_path / 'ego.json'}@{caps}")
    # our own rows
    ours = tmp_path / "ours.jsonl"
    for k, (mutate, msg) in enumerate([
            (lambda v: v["questions"][1].update(support=["c9"]), "field 'support' names clip 'c9'"),
            (lambda v: v["questions"][0].update(answer=5), r"field 'questions\[0\]\.answer' must be a choice index"),
            (lambda v: v["questions"][2].update(choices=["1", "1", "2"]), "repeats a choice"),
            (lambda v: v["graph"].append(["Anna", "drop", "cup", "c7"]), "names a clip the video does not have"),
            (lambda v: v.pop("clips"), "missing field 'clips'")]):
        v = copy.deepcopy(VIDEO)
        mutate(v)
        ours.write_text(json.dumps(VIDEO) + "\n" + json.dumps(v) + "\n")
        with pytest.raises(DataError, match=f"ours.jsonl:2: .*{msg}"):
            load_video(str(ours))
    with pytest.raises(DataError, match="expected QUESTIONS@CAPTIONS"):
        load_video("a@b@c@d")


# ---------------------------------------------------------------------------------- calculator, SFT


def test_calculator_video_domain_by_hand(tasks):
    task = tasks[0]
    rec = {"task": task, "metrics": {}, "turns": [
        {"role": "captioner", "reply": CAP, "reply_tokens": 16, "finish_reason": "stop", "reward": 1.0},
        {"role": "grapher", "reply": "(Ben, knocks over, vase) [c2]\n(Anna, repairs, vase)\nChoice: C",
         "reply_tokens": 32, "finish_reason": "stop", "reward": 0.4},
        {"role": "organizer", "reply": "B", "reply_tokens": 2, "finish_reason": "stop", "reward": 0.0}]}
    env = VideoQAEnv(parallel=False)  # the recorded rewards are the env's
    assert play(env, task, [t["reply"] for t in rec["turns"]])[1] == [1.0, pytest.approx(0.4), 0.0]
    assert detect_workflow(rec) == "video"
    calc = RewardCalculator(budgets={"captioner": 64, "grapher": 64, "organizer": 32})
    cap, gra, org = calc.score_episode(rec)
    # captioner: cites c2 (a clip of the video), 'Then' is a temporal reference, names C; two report lines
    assert cap.components == {"completion": 1.0, "efficiency": 0.75, "quality": 1.0, "reasoning": 1.0}
    assert cap.weighted == pytest.approx(0.4 + 0.2 * 0.75 + 0.3 + 0.1)
    # grapher: 1 of 2 triples carries a clip, no link, names C
    assert gra.components == pytest.approx({"completion": 0.4, "efficiency": 0.5, "quality": 0.5, "reasoning": 1.0})
    # organizer: a bare letter (format 0.5), no evidence; no reasoning component
    assert org.components == pytest.approx({"completion": 0.0, "efficiency": 1 - 2 / 32, "quality": 0.25})
    assert org.weighted == pytest.approx((0.2 * (1 - 2 / 32) + 0.3 * 0.25) / 0.9)
    # the organizer citing a clip with 'Answer: C' is better formed
    rec["turns"][2]["reply"] = "Answer: C\nReason: Ben toppled it first [c2]."
    assert calc.score_episode(rec)[2].components["quality"] == 1.0
    cfg = load_config_file(os.path.join(ROOT, "configs", "tiny_video_qa.py"))
    c2 = RewardCalculator.from_config(cfg)
    assert c2.workflow == "video" and c2.budgets == {"captioner": 12, "grapher": 12, "organizer": 8}
    builtin = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env="video_qa", env_kwargs={}))
    assert RewardCalculator.from_config(builtin).workflow == "video"


def test_scripted_teacher_gives_every_roles_turns(tiny, tmp_path, tasks):
    import sft
    from workflows import workflow
    _, tok = tiny
    cfg = load_config_file(os.path.join(ROOT, "configs", "tiny_video_qa.py"))
    summary = sft.run_sft(sft.SFTConfig(teacher="scripted", teacher_tasks=1, epochs=1, val_frac=0.0, progress=False,
                                        lr=1e-3, out=str(tmp_path / "sft")), train_cfg=cfg, model=tiny[0], tok=tok)
    assert summary["teacher"] == {f"teacher:scripted/{r}": 1 for r in ROLES}
    assert set(summary["adapters"]) == set(ROLES)
    train_tasks = load_video(cfg.data.train_files)[:1]
    env = VideoQAEnv(**cfg.data.env_kwargs)
    for k, role in enumerate(ROLES):
        rows = [json.loads(ln) for ln in open(tmp_path / "sft" / "examples" / f"{role}.jsonl")]
        got = sorted((r["prompt"], r["reply"]) for r in rows)
        want = []
        for task in train_tasks:  # captioner and grapher handed out at once (the config's parallel default)
            want += [(tok.apply_chat_template(t.messages, add_generation_prompt=True, tokenize=False), r)
                     for t, r in play_replies(env, task, scripted_replies(task)) if t.role == role]
        assert got == sorted(want) and all(r["reward"] == 1.0 for r in rows)
    # with the agreement skip on, a perfect team's organizer never speaks: no organizer example
    on = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env_kwargs={"skip_on_agreement": True}))
    make_env, module, _ = workflow(on)
    ex, counts = sft.scripted_teacher(make_env, module, train_tasks, tok, {r: r for r in ROLES}, set(ROLES), 0, 0.7)
    assert counts == {"teacher:scripted/captioner": 1, "teacher:scripted/grapher": 1} and len(ex) == 2
    # a turn the env pays below min_reward is left out (a team whose organizer answers wrong)
    wrong = types.SimpleNamespace(__name__="wrong", scripted_replies=lambda t: scripted_replies(t)[:2] + [
        "Answer: " + "ABCDE"[(t["answer"] + 1) % 5]])
    ex, counts = sft.scripted_teacher(VideoQAEnv, wrong, train_tasks, tok, {r: r for r in ROLES}, set(ROLES), 0, 0.7)
    assert counts == {"teacher:scripted/captioner": 1, "teacher:scripted/grapher": 1,
                      "teacher:below_min_reward/organizer": 1} and [e.role for e in ex] == ["captioner", "grapher"]
    with pytest.raises(ValueError, match="defines no scripted_replies"):
        sft.scripted_teacher(VideoQAEnv, types.SimpleNamespace(__name__="none"), train_tasks, tok, {}, set(ROLES), 0, 0)
    with pytest.raises(ValueError, match="teacher=scripted plays the train config's workflow"):
        sft.run_sft(sft.SFTConfig(teacher="scripted", out=str(tmp_path / "x")))


# ---------------------------------------------------------------------------------- config, training, eval, compare


def test_configs_route_train_eval_and_compare(tmp_path):
    import compare
    import eval as eval_py
    import train
    import trajectories
    from workflows import check_roles, load_data, workflow
    for name in ("video_qa", "tiny_video_qa"):
        cfg = load_config_file(os.path.join(ROOT, "configs", f"{name}.py")).validate()
        check_roles(cfg)
        tr, va = load_data(cfg)
        assert len(tr) == 3 * N_TRAIN and len(va) == cfg.data.val_size and isinstance(workflow(cfg)[0](), VideoQAEnv)
    builtin = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env="video_qa", env_kwargs={})).validate()
    assert isinstance(workflow(builtin)[0](), VideoQAEnv) and workflow(builtin)[2] is workflow(cfg)[2]
    run = tmp_path / "run"
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=str(run)))
    metrics = train.main(cfg)
    for role in ROLES:
        assert f"train/reward/{role}" in metrics and f"val/reward/{role}" in metrics, role
        assert 0 < metrics[f"train/tokens/{role}"] <= next(r.max_tokens for r in cfg.roles if r.name == role)
    rows = [json.loads(ln) for ln in open(run / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 2]  # two train steps and the final eval
    assert {"train/agreement_rate", "train/skip_rate", "train/cite_f1", "train/triple_f1", "val/tokens/episode"} <= \
        set(rows[0]) | set(rows[2])
    assert any(k.startswith("val/acc_") for k in rows[2]) and all(math.isfinite(r["train/pg_loss/captioner"])
                                                                   for r in rows[:2])
    # eval.py on the final checkpoint: greedy = the in-loop eval
    ckpt = run / "checkpoints" / "step_000002"
    res = eval_py.main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "ev")])
    assert res["greedy/team_reward"] == rows[2]["val/team_reward"]
    assert res["greedy/agreement_rate"] == rows[2]["val/agreement_rate"]
    # compare.py replays the run's val episodes through the env
    (row,) = compare.main([str(run)])
    assert row["team"] == rows[2]["val/team_reward"] and row["n"] == 2 and "agreement_rate" in row["aggregate"]
    # ... and on recorded scripted episodes: hand-countable numbers, no math-team columns
    val = load_video(cfg.data.val_files)[:4]
    recs = []
    for i, task in enumerate(val):
        replies = scripted_replies(task)
        if i == 3:
            replies[2] = "Answer: " + "ABCDE"[(task["answer"] + 1) % 5]  # one wrong answer
        env = VideoQAEnv(**cfg.data.env_kwargs)
        play_replies(env, task, replies)
        recs.append({"split": "val", "step": 2, "task_id": i, "episode_id": i, "task": task, "metrics": env.metrics(),
                     "turns": [{"turn": k, "role": ro, "prompt": "", "reply": r, "reward": w}
                               for k, (ro, r, w) in enumerate(zip(ROLES, replies, env.turn_rewards()))]})
    trajectories.write(run / "trajectories" / "val_step_000002.jsonl", recs)
    (row,) = compare.main([str(run)])
    types = [t["type"] for t in val]
    assert row["team"] == 0.75 and row["aggregate"]["agreement_rate"] == 1.0
    assert row["aggregate"][f"acc_{types[3]}"] == pytest.approx(1 - 1 / types.count(types[3]))
    assert row["counts"] == {} and "| — |" in compare.table([row])


# ---------------------------------------------------------------------------------- hostile data files


def _video(**change):
    """A copy of VIDEO, each function of `change` applied to it."""
    v = copy.deepcopy(VIDEO)
    for f in change.values():
        f(v)
    return v


def _refused(spec, files, match):
    """load_video(spec) raises one short DataError line matching `match`, and leaves every file as it was."""
    before = {f: f.read_bytes() for f in files}
    with pytest.raises(DataError, match=match) as e:
        load_video(spec)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400, str(e.value)[:500]
    assert {f: f.read_bytes() for f in files} == before


def test_hostile_video_rows_are_refused_with_one_line(tmp_path):
    """Each of these used to load and then break an episode (reset: OverflowError), raise a bare
    ValueError at load ('²', 5000 digits), or silently keep one of two videos of the same id."""
    digits = "1" * 5000
    cases = [
        (json.dumps(_video(f=lambda v: v["clips"][0].update(start=float("inf")))),  # writes "start": Infinity
         r"ours\.jsonl:1: field 'clips'\[0\]\.start must be a finite number of seconds >= 0, got inf"),
        (json.dumps(_video(f=lambda v: v["clips"][1].update(start=9))), r"field 'clips'\[1\] ends \(8\) before it starts"),
        (json.dumps(_video(f=lambda v: v["questions"][0].update(answer="²"))),
         r"ours\.jsonl:1: field 'questions\[0\]\.answer' must be a choice index from 0 to 4, got '²'"),
        (json.dumps(_video(f=lambda v: v["questions"][0].update(answer=digits))), r"questions\[0\]\.answer' must be"),
        (json.dumps(_video()).replace('"answer": 2', f'"answer": {digits}', 1), r"questions\[0\]\.answer' must be"),
        (json.dumps(_video(f=lambda v: v["questions"][1].update(question="Why? " * 40_000))),
         r"field 'questions\[1\]\.question' is 200000 characters long, more than 4000"),
        (json.dumps(_video(f=lambda v: v["questions"][2].update(id="q" * 10 ** 6))),
         r"field 'questions\[2\]\.id' is 1000000 characters long, more than 200"),
        (json.dumps(VIDEO) + "\n" + json.dumps(_video(f=lambda v: v["clips"][0].update(caption="x."))),  # one id, two videos
         r"ours\.jsonl:2: field 'video': video 'hand1' appears again \(first at .*ours\.jsonl:1\)"),
        (json.dumps(VIDEO) + "\n" + json.dumps(_video(f=lambda v: v.update(video="hand2"))),  # the same question ids
         r"ours\.jsonl:2: question id 'hand1_q1' appears again")]
    f = tmp_path / "ours.jsonl"
    for text, match in cases:
        f.write_text(text + "\n")
        _refused(str(f), [f], match)
    f.write_text(json.dumps(VIDEO) + "\n" + json.dumps(_video(f=lambda v: v.update(video="hand2", questions=[
        dict(q, id=q["id"].replace("hand1", "hand2")) for q in v["questions"]]))) + "\n")
    assert len(load_video(str(f))) == 6  # two videos, distinct ids: both kept


def test_hostile_real_files_are_refused_with_one_line(tmp_path):
    caps = tmp_path / "captions.json"
    caps.write_text(json.dumps(CAPTIONS, indent=1))
    q = tmp_path / "q.csv"
    # a 200 kB cell: csv's own limit (131072) raised _csv.Error; now the row's line, as for any bad row
    _write_csv(q, [NEXT[0], dict(NEXT[1], question="x" * 200_000), NEXT[1]])
    _refused(f"{q}@{caps}", [q, caps], r"q\.csv:3: not a readable CSV row \(field larger than field limit")
    q.write_text("video,question,answer,a0,a1\n1001,why,1,x,y\n1001,why,1,x,y,z\n")
    _refused(f"{q}@{caps}", [q, caps], r"q\.csv:3: 6 cells, but the header names 5 columns")
    _write_csv(q, [NEXT[0], dict(NEXT[1], qid="7" * 5000)])  # every task carries its id: bounded
    _refused(f"{q}@{caps}", [q, caps], r"q\.csv:3: field 'qid' is 5000 characters long, more than 200")
    _write_csv(q, [NEXT[0], NEXT[1], NEXT[0]])  # the same NExT-QA question twice
    _refused(f"{q}@{caps}", [q, caps], r"q\.csv:4: question '1001_3' appears again \(first at .*q\.csv:2\)")
    # the same video id twice in the caption file: json.loads keeps one; we used to keep the other, silently
    _write_csv(q, NEXT)
    caps.write_text('{\n "1001": ["a man opens the door"],\n "1002": ["a ball"],\n "1001": ["a dog runs in"]\n}')
    _refused(f"{q}@{caps}", [q, caps], r"captions\.json:4: video id '1001' appears again \(first on line 2\)")
    caps.write_text(json.dumps({"1001": [{"caption": "a", "start": float("inf")}], "1002": ["b"]}))
    _refused(f"{q}@{caps}", [q, caps], r"captions\.json:1: field \"captions of '1001'\"\[0\]\.start must be a finite")
    # the calculator's agent side never crashes on such a time either
    from agents.video_team import clip_lines
    assert clip_lines([{"id": "c1", "start": float("inf"), "end": 1e300, "caption": "x"}]) == "[c1] x"


def _shot(v, name=lambda i: f"shot{i}"):
    """VIDEO with its clips renamed c<i> -> name(i) (support and graph too)."""
    new = {f"c{i}": name(i) for i in range(1, 7)}
    for c in v["clips"]:
        c["id"] = new[c["id"]]
    v["graph"] = [[new.get(x, x) for x in t] for t in v["graph"]]
    for q in v["questions"]:
        q["support"] = [new[c] for c in q["support"]]


def test_clip_ids_other_than_c_n_are_renumbered_so_the_perfect_team_scores_one(tmp_path):
    """The agents cite c<N> and the rewards read only that: 'shot1' used to give the perfect captioner
    0.0 (and the grapher's links nothing). Such a video's clips are renumbered c1.. in order."""
    f = tmp_path / "shots.jsonl"
    f.write_text(json.dumps(_video(f=_shot)) + "\n")
    shots = load_video(str(f))
    assert [c["id"] for c in shots[0]["clips"]] == [f"c{i}" for i in range(1, 7)]
    assert shots[0]["support"] == ["c2", "c3"] and shots[0]["graph"][-1] == ["c2", "causes", "c3"]
    for task in shots:
        _, rew, m, _ = play(VideoQAEnv(), task, scripted_replies(task))
        assert rew == [1.0, 1.0, 1.0] and (m["cite_f1"], m["triple_f1"]) == (1.0, 1.0), task["id"]
    # 'c01' next to 'c1': two clips the rewards would read as one (c1); renumbered too
    f.write_text(json.dumps(_video(f=lambda v: _shot(v, lambda i: "c01" if i == 2 else f"c{i}"))) + "\n")
    causal = load_video(str(f))[0]
    assert causal["support"] == ["c2", "c3"] and [c["id"] for c in causal["clips"]][:2] == ["c1", "c2"]
    assert play(VideoQAEnv(), causal, scripted_replies(causal))[1] == [1.0, 1.0, 1.0]
    # a real caption file with its own ids: the question's support names them
    caps = tmp_path / "captions.json"
    caps.write_text(json.dumps({"1001": [{"id": f"shot{i}", "caption": c} for i, c in enumerate(CAPTIONS["1001"], 1)],
                                "1002": CAPTIONS["1002"]}))
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps(dict(NEXT[0], support=["shot2"])) + "\n")
    (t,) = load_video(f"{q}@{caps}")
    assert t["support"] == ["c2"] and t["clips"][1] == {"id": "c2", "start": None, "end": None, "caption": "a dog runs in"}
    assert play(VideoQAEnv(), t, scripted_replies(t))[1] == [1.0, 1.0, 1.0]


def test_one_huge_caption_is_cut_to_max_caption_chars(tmp_path):
    """A first caption of 207 kB used to go whole into the prompt (the cap only dropped later clips)."""
    f = tmp_path / "long.jsonl"
    f.write_text(json.dumps(_video(f=lambda v: v["clips"][0].update(caption="Anna waits. " * 17_250))) + "\n")
    count = load_video(str(f))[2]  # support c1, c6
    for cap in (6000, 200):
        user = VideoQAEnv(max_caption_chars=cap, parallel=False).reset(count).messages[1]["content"]
        shown = user.split("Clip captions:\n")[1].split("\n\n")[0]
        assert len(shown) <= cap + 40 and shown.endswith("(... 5 more clips not shown)"), len(shown)
        assert shown.startswith("[c1 0:00-0:04] Anna waits.") and " ...\n(... 5" in shown
    assert len(scripted_replies(count)[0]) < 500  # the scripted captioner reports the clip, not a copy of it


def test_the_readme_questions_at_captions_spec_passes_the_config_and_loads(tmp_path, monkeypatch):
    """`--data.train-files questions.csv@captions.json` (README) was refused by the config check as a
    file that does not exist: the spec ends in .json."""
    from workflows import check_roles, load_data
    monkeypatch.chdir(tmp_path)
    _write_csv(tmp_path / "questions.csv", NEXT)
    (tmp_path / "captions.json").write_text(json.dumps(CAPTIONS))
    cfg = load_config_file(os.path.join(ROOT, "configs", "tiny_video_qa.py"))
    data = dataclasses.replace(cfg.data, train_files="questions.csv@captions.json",
                               val_files="./questions.csv@captions.json")
    cfg = dataclasses.replace(cfg, data=data).validate()
    check_roles(cfg)
    tr, va = load_data(cfg)
    assert [t["id"] for t in tr] == ["1001_3", "1002_7"] and len(va) == 2
    bad = dataclasses.replace(cfg, data=dataclasses.replace(data, val_files="./missing.csv@captions.json"))
    with pytest.raises(ConfigError, match=r"data\.val_files: \./missing\.csv does not exist"):
        bad.validate()
