"""Agents that act together, through the episode driver on the tiny model: independent turns handed out at once
share one engine call and give the same episodes as one by one; a turn that continues its conversation is
spliced onto the ids the engine sampled (never a re-encode), so it extends the earlier turn token for token and
the trainer scores exactly the sampled ids; the per-role layouts keep each role's turns in one conversation."""
import dataclasses
import json
from pathlib import Path

import pytest
from helpers import CountingEngine

import chat
import learner
import lora
from envs import Prompt
from rollout import RoleSpec, SamplingParams, TorchEngine, merge_turns, run_episodes

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def engine(tiny):
    m, tok = tiny
    lora.add_lora(m, ["solver", "judge", "captioner", "grapher", "organizer", "asker"], rank=4, alpha=8)
    return m, tok


def specs(roles, n=8, seed=0):
    return {r: RoleSpec(r, SamplingParams(max_new_tokens=n, temperature=1.0, seed=seed)) for r in roles}


def play(m, tok, make_env, tasks, roles, chains=2, **kw):
    eng = CountingEngine(TorchEngine(m, tok))
    samples, eps = run_episodes(eng, tok, make_env, tasks, roles, num_chains=chains, max_turns=8, **kw)
    return eng.calls, samples, eps


def test_a_debates_solvers_share_one_engine_call_and_give_the_same_episodes(engine):
    """Two solvers and a judge: 2 engine calls a batch handed out at once, 3 one by one; the same seeds give the
    same turns (ids, logprobs, rewards) in the same order: their order cannot matter."""
    from envs.debate import DebateEnv
    m, tok = engine
    tasks = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(2, 3), (10, 7)]]
    out = {}
    for parallel in (True, False):
        calls, samples, eps = play(m, tok, lambda: DebateEnv(candidates=2, parallel=parallel), tasks,
                                   specs(("solver", "judge")))
        out[parallel] = samples
        assert len(calls) == (2 if parallel else 3)
        assert calls[0] == ["solver"] * (8 if parallel else 4)  # 2 tasks x 2 chains x 2 solvers (or 1)
    a, b = out[True], out[False]
    assert [(s.episode_id, s.role, s.turn, s.prompt_ids, s.completion_ids, s.reward) for s in a] == \
        [(s.episode_id, s.role, s.turn, s.prompt_ids, s.completion_ids, s.reward) for s in b]
    assert all(x.logprobs == pytest.approx(y.logprobs, abs=1e-4) for x, y in zip(a, b))  # other batch, other floats
    calls, _, _ = play(m, tok, lambda: DebateEnv(candidates=3, rounds=2), tasks, specs(("solver", "judge")))
    assert len(calls) == 3  # round 1, round 2 (the revisions), the judge: not 3 + 3 + 1


def test_video_qas_captioner_and_grapher_share_one_engine_call(engine):
    """configs/tiny_video_qa.py's team: 2 engine calls a batch (captioner + grapher, then the organizer), 3 one by
    one; the same turns and rewards either way, and the same trajectory records."""
    import trajectories
    from envs.video_qa import VideoQAEnv, load_tasks
    m, tok = engine
    tasks = load_tasks(str(ROOT / "data" / "video_val.jsonl"))[:2]
    got = {}
    for parallel in (True, False):
        calls, samples, eps = play(m, tok, lambda: VideoQAEnv(max_caption_chars=300, parallel=parallel), tasks,
                                   specs(("captioner", "grapher", "organizer"), n=6))
        assert len(calls) == (2 if parallel else 3) and (calls[0] == ["captioner", "grapher"] * 4) == parallel
        recs = [trajectories.episode_record(e, tok, "train", 0) for e in eps]
        got[parallel] = ([(s.role, s.prompt_ids, s.completion_ids, s.reward) for s in samples],
                         [[{k: v for k, v in t.items() if k != "logprobs"} for t in r["turns"]] for r in recs],
                         [r["metrics"] for r in recs])
    assert got[True] == got[False]


def test_remax_twins_replay_a_set_of_turns_handed_out_at_once(engine):
    """ReMax's greedy twin is forked at every sampled turn or set: each turn of a set gets its baseline."""
    from envs.debate import DebateEnv
    m, tok = engine
    roles = specs(("solver", "judge"))
    greedy = {r: RoleSpec(r, SamplingParams(max_new_tokens=8, greedy=True)) for r in roles}
    samples, _ = run_episodes(TorchEngine(m, tok), tok, lambda: DebateEnv(candidates=3), [
        {"question": "What is 1 + 1?", "answer": "2"}], roles, num_chains=2, baseline_roles=greedy)
    assert len(samples) == 8 and all(s.baseline is not None for s in samples)


class Chat:
    """One role in one growing conversation: each turn its earlier messages + its reply verbatim + a new user
    message (the per-role layout's shape); reward = the reply's length."""
    roles = ("asker",)

    def reset(self, task):
        self.msgs, self.replies, self.n = [{"role": "user", "content": f"Count to {task}."}], [], task
        return Prompt("asker", list(self.msgs))

    def step(self, reply):
        self.replies.append(reply)
        if len(self.replies) == self.n:
            return None
        self.msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Go on."}]
        return Prompt("asker", list(self.msgs))

    def turn_rewards(self):
        return [float(len(r)) for r in self.replies]

    def metrics(self):
        return {}


def test_every_continued_turn_extends_the_sampled_turn_token_for_token(engine):
    """16 sampled second turns: each prompt is the first turn's prompt + the ids the engine sampled + the new
    message, where re-encoding the reply's text (as before) did not extend on some of them; merge_turns then
    joins every episode's turns into one row whose loss covers exactly the sampled ids."""
    m, tok = engine
    _, samples, eps = play(m, tok, Chat, [2] * 8, specs(("asker",), n=10, seed=3))
    assert len(eps) == 16 and all(len(e.samples) == 2 for e in eps)
    re_encoded = 0
    for e in eps:
        first, second = e.samples
        assert second.prompt_ids[:len(first.prompt_ids) + len(first.completion_ids)] == \
            first.prompt_ids + first.completion_ids
        whole = chat.chat_ids(tok, e.env.msgs)  # the old way: the reply's text encoded again
        re_encoded += whole[:len(first.prompt_ids) + len(first.completion_ids)] == first.prompt_ids + first.completion_ids
    assert re_encoded < 16  # random replies do not all re-encode to themselves (the bug the splice removes)
    merged = merge_turns(samples)
    assert len(merged) == 16 and all(s.merged_turns == 2 for s in merged)
    for s in merged:
        first, second = s.parts
        gap = len(second.prompt_ids) - len(first.prompt_ids) - len(first.completion_ids)
        assert s.completion_ids == first.completion_ids + second.prompt_ids[-gap:] + second.completion_ids
        assert s.loss_mask == [1] * len(first.completion_ids) + [0] * gap + [1] * len(second.completion_ids)


def test_merge_turns_follows_conversations_that_interleave():
    """Researchers working side by side: a role's turns from two conversations alternate; each joins its own."""
    from rollout import Sample
    a1 = Sample(0, 0, "r", 0, [1, 2], [3], [0.0])
    b1 = Sample(0, 0, "r", 1, [1, 9], [8], [0.0])
    a2 = Sample(0, 0, "r", 2, [1, 2, 3, 4], [5], [0.0])
    b2 = Sample(0, 0, "r", 3, [1, 9, 8, 7], [6], [0.0])
    out = merge_turns([a1, b1, a2, b2])
    assert [s.completion_ids for s in out] == [[3, 4, 5], [8, 7, 6]] and [s.merged_turns for s in out] == [2, 2]


def _steps(tok, make_env, tasks, replies_of):
    """Scripted episodes through the driver's prompt building (rollout.prompt_ids): (role, prompt, completion)."""
    from envs import play_replies
    from rollout import Sample, prompt_ids
    out = []
    for ep, task in enumerate(tasks):
        env, said = make_env(), []
        for turn, r in play_replies(env, task, replies_of(env, task)):
            p, c = prompt_ids(tok, turn.messages, said)[0], tok.encode(r, add_special_tokens=False) + [tok.eos_token_id]
            said.append((turn.messages, p, c, r))
            out.append(Sample(ep, ep, turn.role, len(out), p, c, [-1.0] * len(c)))
    return out


def _rows(tok, steps, adapter_of=lambda role: role):
    by = {}
    for s in steps:
        by.setdefault(adapter_of(s.role), []).append(s)
    return sum(len(learner.Packed(learner.AdapterBatch(ss, [0.7] * len(ss), tok.pad_token_id, 64)).batch.samples)
               for ss in by.values())


@pytest.mark.parametrize("layout,rows", [("per_role", 4), ("message", 7)])
def test_the_math_teams_per_role_layout_keeps_each_roles_turns_in_one_conversation(tiny, layout, rows):
    """An episode of generator, judge, refiner, judge, refiner, judge (and one of a generator alone): per role, the
    judge's three verdicts extend one another and so do the refiner's two fixes: 3 packed rows for the 6 turns,
    4 for the 7; the one-message layout packs nothing (7)."""
    from envs.math_3agent import MathTeamEnv
    _, tok = tiny
    tasks = [{"question": "What is 2 + 3?", "answer": "5"}, {"question": "What is 4 + 4?", "answer": "8"}]
    long = ["\\boxed{4}", "Verdict: Incorrect", "\\boxed{6}", "Verdict: Incorrect", "\\boxed{5}", "Verdict: Correct"]
    steps = _steps(tok, lambda: MathTeamEnv(2, layout=layout), tasks,
                   lambda env, t: long if t["answer"] == "5" else ["\\boxed{8}"])
    assert len(steps) == 7 and _rows(tok, steps) == rows


@pytest.mark.parametrize("name", ["math_tool", "search"])
def test_math_tool_and_search_per_role_layouts_pack_each_roles_cycles(tiny, name):
    """Multi-cycle episodes: per role its cycles are one row (per-role adapters); the one-message layout packs
    nothing."""
    _, tok = tiny
    if name == "math_tool":
        from envs.math_tool import MathToolEnv, scripted_replies
        tasks = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(3, 4), (12, 30)]]
        rejected = ["1. Guess.", "print(0)", "The output is wrong. Verdict: Incorrect"]
        make = lambda layout: lambda: MathToolEnv(layout=layout)  # noqa: E731
        replies = lambda env, t: rejected + scripted_replies(t)  # noqa: E731
    else:
        from envs.search_team import SearchTeamEnv
        corpus = str(ROOT / "data" / "search_corpus.jsonl")
        tasks = [json.loads(x) for x in (ROOT / "data" / "search_train.jsonl").read_text().splitlines() if x.strip()]
        probe = SearchTeamEnv(corpus=corpus, max_refinement_iterations=3)
        tasks = [t for t in tasks if t["hops"] == 2 and len(probe.scripted_replies(t)) >= 4][:2]
        make = lambda layout: lambda: SearchTeamEnv(corpus=corpus, max_refinement_iterations=3, layout=layout)  # noqa
        replies = lambda env, t: env.scripted_replies(t)  # noqa: E731
    per_role, message = _steps(tok, make("per_role"), tasks, replies), _steps(tok, make("message"), tasks, replies)
    roles = {s.role for s in per_role}
    assert _rows(tok, per_role) == len(roles) * len(tasks) < len(per_role)
    assert _rows(tok, message) == len(message)


def test_researchs_per_role_layout_keeps_one_researcher_conversation(tiny):
    """research with layout='per_role': the researcher's turns over all sub-questions extend one another (one
    packed row an episode); per sub-question (the default) one row a sub-question; merge_turns is refused."""
    from config import load_config_file
    from envs.research import ResearchEnv, check_config, load_tasks
    _, tok = tiny
    tasks = [t for t in load_tasks(str(ROOT / "data" / "research_train.jsonl"))[:6] if ResearchEnv().scripted_replies(t)][:2]
    subs = sum(len(t["support"]) for t in tasks)  # the scripted plan: a sub-question per hop
    for layout, rows in (("per_role", len(tasks)), ("per_sub", subs)):
        steps = _steps(tok, lambda: ResearchEnv(layout=layout), tasks, lambda env, t: env.scripted_replies(t))
        research = [s for s in steps if s.role == "researcher"]
        assert len(research) == 3 * subs and _rows(tok, research) == rows, layout
    cfg = load_config_file(str(ROOT / "configs" / "tiny_research.py"))
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env_kwargs={**cfg.data.env_kwargs,
                                                                                  "layout": "per_role"}))
    merged = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, merge_turns=True))
    assert check_config(merged, ("grpo",))[0] == "rollout.merge_turns"


def test_parallel_researchers_are_handed_out_together(engine):
    """research with parallel=True: after the plan, every sub-question's researcher in one engine call a round."""
    from envs.research import ResearchEnv, load_tasks
    m, tok = engine
    task = load_tasks(str(ROOT / "data" / "research_train.jsonl"))[0]

    class Planned(ResearchEnv):  # a plan of 3 sub-questions whatever the random model writes
        def step(self, reply):
            return super().step("1. Who is a?\n2. Where is b?\n3. What is c?" if self.role == "planner" else reply)
    calls, samples, eps = play(m, tok, lambda: Planned(parallel=True, max_rounds=2), [task],
                               {r: RoleSpec("solver", SamplingParams(max_new_tokens=6, seed=0))
                                for r in ("planner", "researcher", "writer")}, chains=1)
    assert [len(c) for c in calls][:2] == [1, 3]  # the plan, then 3 researchers together
    assert {s.key[1] for s in samples if s.role == "researcher"} == {0, 1, 2}


def test_swes_per_role_layout_continues_the_writers_and_validators_chats():
    """SWE with layout='per_role': after a rejected attempt, the writer's fix continues its first chat (its edits
    verbatim, then the feedback and the files) and the validator's second review its first; 'rounds' (the
    default) starts each attempt afresh."""
    from envs import play_replies
    from envs.swe import SWETeamEnv, load_tasks
    task = load_tasks(str(ROOT / "data" / "swe_train.jsonl"))[0]
    for layout in ("per_role", "rounds"):
        env = SWETeamEnv(layout=layout, max_analyzer_calls=1, max_validator_calls=1)
        rep = env.scripted_replies(task)
        played = play_replies(env, task, rep[:2] + ["no edits here", "Verdict: REJECT it changes nothing"] + rep[2:])
        m = env.metrics()  # the validator rejected the empty attempt and accepted the fix: TN and TP
        assert m["team_reward"] == 1.0 and (m["validator_tn"], m["validator_tp"], m["validator_fp"]) == (1.0, 1.0, 0.0)
        turns = {}
        for p, reply in played:
            turns.setdefault(p.role, []).append((p.messages, reply))
        for role in ("writer", "validator"):
            (first, said), (second, _) = turns[role][0], turns[role][1]
            assert chat.continues(first, said, second) == (layout == "per_role"), (layout, role)


def test_layouts_whose_turns_are_paid_apart_refuse_merge_turns():
    """A merged conversation trains on its last turn's reward: the math team's and SWE's per-role chats (a judge's
    verdicts paid +1 / -1) and a debate's rounds refuse rollout.merge_turns, before any model loads; their default
    layouts do not."""
    from config import ConfigError, load_config_file
    from workflows import check_roles
    for config, kw in (("tiny_math_3agent.py", {"layout": "per_role"}), ("tiny_swe.py", {"layout": "per_role"}),
                       ("tiny_debate.py", {"rounds": 2})):
        cfg = load_config_file(str(ROOT / "configs" / config))
        cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, merge_turns=True))
        with pytest.raises(ConfigError, match=r"config field rollout.merge_turns: .*paid"):
            check_roles(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env_kwargs={**cfg.data.env_kwargs, **kw})))
        if config != "tiny_debate.py":
            check_roles(cfg)  # the default layout merges as before


def test_a_remax_baseline_is_the_twins_reward_for_the_same_turn(engine):
    """Each sampled turn of a set gets the greedy twin's reward for that very turn (a reward that varies: the
    reply's length): the baselines equal a greedy rollout's rewards turn for turn."""
    m, tok = engine

    class Long(Chat):  # two solvers at once, then one more turn; paid by length
        roles = ("asker",)

        def reset(self, task):
            self.replies, self.n = [], 3
            return [Prompt("asker", [{"role": "user", "content": f"Count to {task}."}]),
                    Prompt("asker", [{"role": "user", "content": f"Count down from {task}."}])]

        def step(self, reply):
            self.replies += reply if isinstance(reply, list) else [reply]
            return Prompt("asker", [{"role": "user", "content": "Once more."}]) if len(self.replies) < 3 else None

    roles = specs(("asker",), n=9, seed=5)
    greedy = {"asker": RoleSpec("asker", SamplingParams(max_new_tokens=9, greedy=True))}
    samples, _ = run_episodes(TorchEngine(m, tok), tok, Long, [4, 7], roles, num_chains=2, baseline_roles=greedy)
    plain, _ = run_episodes(TorchEngine(m, tok), tok, Long, [4, 7], greedy, num_chains=2)
    first_two = [s for s in samples if s.turn < 2]
    assert [s.baseline for s in first_two] == [p.reward for p in plain if p.turn < 2]  # the set's twin: all greedy
    assert len({s.baseline for s in first_two}) > 1 and all(s.baseline is not None for s in samples)


def test_a_set_that_would_pass_max_turns_truncates_the_episode(engine):
    """A set is handed out whole or not at all: 3 solvers at once with max_turns 2 end the episode truncated."""
    from envs.debate import DebateEnv
    m, tok = engine
    _, eps = run_episodes(TorchEngine(m, tok), tok, lambda: DebateEnv(candidates=3), [
        {"question": "What is 1 + 1?", "answer": "2"}], specs(("solver", "judge")), max_turns=2)
    assert eps[0].truncated and eps[0].samples == []


def test_the_tiny_debate_config_trains(tmp_path):
    """configs/tiny_debate.py (two solvers at once, a debate round, a judge) trains and evaluates end to end."""
    import train
    from config import load_config_file
    cfg = load_config_file(str(ROOT / "configs" / "tiny_debate.py"))
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, total_steps=1, test_freq=1,
                                                               output_dir=str(tmp_path / "run")))
    m = train.main(cfg)
    assert "val/pick_correct" in m and "train/reward/judge" in m and "train/reward/solver" in m
