import dataclasses
import json
import random
import re
import types
from pathlib import Path

import pytest

import learner
from agents.math_team import build_messages, parse_verdict
from config import ConfigError
from data.math_data import DataError, generate, load_math
from envs.math_3agent import ROLES, MathTeamEnv, aggregate
from envs.math_single import MathSingleEnv
from rewards.math import extract_answer, math_reward
from helpers import play as tplay
from rollout import Episode, RoleSpec, Sample, SamplingParams, TorchEngine, run_episodes

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------- rewards

EQUIV = [
    ("so \\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{\\dfrac{1}{2}}", "1/2"), ("\\boxed{50\\%}", "50"),
    ("\\boxed{1,000}", "1000"), ("\\boxed{\\$12}", "12"), ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("\\boxed{(1, 2)}", "(1,2)"), ("Thus the answer is 42.", "42"), ("blah\n#### 72", "72"),
    ("\\boxed{\\text{Monday}}", "monday"), ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt 3}{2}"), ("first \\boxed{1} then \\boxed{2}", "2"),
    ("\\boxed{-3}", "-3.0"), ("\\boxed{ 7 }.", "7"), ("$\\boxed{\\left( 3, 4 \\right)}$", "(3,4)"),
]
NOT_EQUIV = [
    ("\\boxed{3}", "4"), ("\\boxed{\\frac{1}{3}}", "0.33"), ("no answer here", "5"), ("\\boxed{2\\sqrt{3}}", "\\sqrt{8}"),
    ("\\boxed{(2, 1)}", "(1,2)"), ("\\boxed{1} and finally \\boxed{3}", "1"), ("\\boxed{}", "0"), ("", "1"),
]


@pytest.mark.parametrize("resp,gold", EQUIV)
def test_equivalent(resp, gold):
    assert math_reward(resp, gold) == 1.0


@pytest.mark.parametrize("resp,gold", NOT_EQUIV)
def test_not_equivalent(resp, gold):
    assert math_reward(resp, gold) == 0.0


def test_extract_answer():
    assert extract_answer("x \\boxed{\\frac{a}{b^{2}}} y") == "\\frac{a}{b^{2}}"
    assert extract_answer("\\boxed{unbalanced") is None
    assert extract_answer("#### 1,234") == "1,234"
    assert extract_answer("The answer is: $12$.") == "12"
    assert extract_answer(None) is None and extract_answer("") is None


@pytest.mark.parametrize("resp", ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{" + "(" * 5000 + "}", "\\boxed{10^{10^{10^{10}}}!}",
                                  "\\boxed{" + "x+" * 2000 + "1}"])
def test_pathological_inputs_return_in_bounded_time(resp):
    """Bounded by counts, not wall time: at most one math-verify call and one kill (its own deadline)."""
    from rewards.math import _worker
    asked, killed = _worker.asked, _worker.killed
    assert math_reward(resp, "1") == 0.0
    assert _worker.asked - asked <= 1 and _worker.killed - killed <= 1
    assert math_reward("\\boxed{2}", "2") == 1.0  # the worker came back after a kill


# Answers built to be slow cost the worker's whole deadline and a restart each (6 s): they
# are recognised as too large to be the answer before math-verify sees them (bench/hostile_parsers.py
# prints their times). Counted, not timed: none reaches the worker, none kills it.
HUGE = ["10^{10^{10}}", "9^{9^{9^9}}", "(10^9)!", "10^{10^{10^{10}}}!", "9**9**9", "\\binom{10^{9}}{5 \\cdot 10^{8}}",
        "\\dbinom{10^9}{5 \\cdot 10^8}", "\\tbinom{10^9}{5 \\cdot 10^8}",
        "0.1^{10^{10}}", "(1+1)^{10^{10}}", "\\Gamma(10^9)", "(x+y+1)^{60}", "(x+1)^{1000}", "(2+3i)^{10^{6}}",
        "\\sqrt{10^{10^{10}}}", "\\frac{1}{10^{10^{10}}}", "10^{10}!", "1.0000001^{10^{10}}",
        "(a+b)(c+d)(e+f)(g+h)(i+j)(k+l)(m+n)(o+p)(q+r)(s+t)"]


def test_answers_too_large_to_be_the_truth_never_reach_math_verify():
    from rewards.math import _worker
    assert math_reward("\\boxed{2\\sqrt{2}}", "\\sqrt{8}") == 1.0  # the worker is up
    asked, killed = _worker.asked, _worker.killed
    for s in HUGE:
        assert math_reward(f"\\boxed{{{s}}}", "3628800") == 0.0, s
        assert math_reward(f"\\boxed{{{s}}}", "x^2 + 1") == 0.0, s
    assert (_worker.asked, _worker.killed) == (asked, killed)
    # legitimately big answers still score, and a truth as large as the answer lets it through
    assert math_reward("\\boxed{2^{10}}", "1024") == 1.0 and math_reward("\\boxed{10!}", "3628800") == 1.0
    assert math_reward("\\boxed{2^{512}}", str(2 ** 512)) == 1.0 and math_reward("\\boxed{\\binom{10}{3}}", "120") == 1.0
    assert math_reward("\\boxed{2^{2^{5}}}", str(2 ** 32)) == 1.0 and math_reward("\\boxed{3^{3^{3}}}", str(3 ** 27)) == 1.0
    assert math_reward("\\boxed{(x+1)^{2}}", "x^2+2x+1") == 1.0
    assert math_reward("\\boxed{4^{5000}}", "2^{10000}") == 1.0 and _worker.asked > asked  # past the cap, not the truth
    assert _worker.killed == killed


def test_garbage_never_raises():
    rng = random.Random(0)
    alphabet = list("0123456789abcxyz+-*/^{}()[]$\\,. %#") + ["\\boxed{", "\\frac", "\\sqrt", "####", "answer is "]
    for _ in range(2000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert math_reward(s, rng.choice(["1", "\\frac{1}{2}", "(1,2)", "x"])) in (0.0, 1.0)


# ---------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("text,want", [
    ("Verdict: Correct", True), ("verdict: incorrect", False), ("**Verdict:** **INCORRECT**", False),
    ("The work looks fine.\nVerdict - correct.", True), ("The solution is not correct.", False),
    ("I think it's correct... wait, it is wrong", False), ("Verdict: The solution is correct", True),
    ("`Verdict`: Incorrect!", False), ("no idea", None), ("", None), (None, None),
    ("It says correct at first. Verdict: Incorrect", False),
])
def test_parse_verdict(text, want):
    assert parse_verdict(text) is want


def test_messages_through_a_chat_template(tiny):
    _, tok = tiny
    msgs = build_messages("generator_refinement", "What is 2+2?", [("generator_initial", "\\boxed{5}"),
                                                                   ("evaluator_critique", "Verdict: Incorrect")])
    assert [m["role"] for m in msgs] == ["system", "user"]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert "What is 2+2?" in text and "\\boxed{5}" in text and "Critique:" in text
    with pytest.raises(KeyError):
        build_messages("nobody", "x", [])


# ---------------------------------------------------------------------------------- scripted episodes

TASK = {"question": "What is 3 + 4?", "answer": "7"}


def play(env, replies):
    turn = env.reset(TASK)
    roles = []
    for r in replies:
        assert turn is not None, "episode ended before the script"
        roles.append(turn.role)
        turn = env.step(r)
    assert turn is None, "episode did not end with the script"
    return roles, env.turn_rewards(), env.metrics()


def test_correct_first_try():
    roles, rew, m = play(MathTeamEnv(), ["3+4=7 \\boxed{7}", "Verdict: Correct"])
    assert roles == ["generator_initial", "evaluator_critique"]
    assert rew == [1.0, 1.0]
    assert m["initial_correct"] == m["final_correct"] == m["team_reward"] == 1.0 and m["eval_tp"] == 1
    assert m["refinements"] == 0


def test_wrong_then_incorrect_then_fixed():
    roles, rew, m = play(MathTeamEnv(), ["\\boxed{6}", "Verdict: Incorrect", "oops \\boxed{7}", "**Verdict: correct**"])
    assert roles == ["generator_initial", "evaluator_critique", "generator_refinement", "evaluator_critique"]
    assert rew == [0.0, 1.0, 1.0, 1.0]
    assert (m["initial_correct"], m["final_correct"], m["refine_fixed"], m["refine_broken"]) == (0.0, 1.0, 1, 0)
    assert (m["eval_tn"], m["eval_tp"], m["refinements"]) == (1, 1, 1)


def test_wrong_but_critic_says_correct_is_punished():
    roles, rew, m = play(MathTeamEnv(), ["\\boxed{6}", "Looks right. Verdict: Correct"])
    assert rew == [0.0, -1.0] and m["final_correct"] == 0.0 and m["eval_fp"] == 1  # symmetric: a wrong verdict costs


def test_max_iterations_reached():
    roles, rew, m = play(MathTeamEnv(max_refinement_iterations=2),
                         ["\\boxed{6}", "Verdict: Incorrect", "\\boxed{5}", "Verdict: Incorrect", "\\boxed{8}", "Verdict: Incorrect"])
    assert roles == ["generator_initial", "evaluator_critique", "generator_refinement", "evaluator_critique",
                     "generator_refinement", "evaluator_critique"]
    assert rew == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert m["refinements"] == 2 and m["final_correct"] == 0.0 and m["eval_tn"] == 3


def test_unparseable_replies():
    roles, rew, m = play(MathTeamEnv(), ["I don't know", "hmm, hard to say", "fine: \\boxed{7}", "Correct."])
    assert roles[2] == "generator_refinement"  # no verdict counts as Incorrect for the flow
    assert rew == [0.0, -1.0, 1.0, 1.0]  # an unparsed verdict is a wrong one; the refiner fixed it
    assert m["eval_unparsed"] == 1 and m["no_answer"] == 1 and m["final_correct"] == 1.0


def test_shaping_bonus_and_penalty():
    old = dict(evaluator_reward="accuracy", refiner_reward="correctness")
    _, rew, _ = play(MathTeamEnv(fix_bonus=0.5, break_penalty=0.25, **old), ["\\boxed{6}", "Verdict: Incorrect", "\\boxed{7}", "Verdict: Correct"])
    assert rew == [0.0, 1.0, 1.5, 1.0]
    # right -> critic wrongly says Incorrect (0) -> broken to wrong (-0.25) -> critic says Incorrect (1)
    _, rew, m = play(MathTeamEnv(fix_bonus=0.5, break_penalty=0.25, max_refinement_iterations=1, **old),
                     ["\\boxed{7}", "Verdict: Incorrect", "\\boxed{9}", "Verdict: Incorrect"])
    assert rew == [1.0, 0.0, -0.25, 1.0] and m["refine_broken"] == 1 and m["eval_fn"] == 1


def test_refiner_reward_is_relative_to_the_answer_it_was_given():
    """fix +1, break -1, keep a right answer +0.5, stay wrong 0 (the evaluator's verdicts: +-1)."""
    cases = {  # initial, refined -> refiner reward
        ("\\boxed{6}", "\\boxed{7}"): 1.0, ("\\boxed{7}", "\\boxed{9}"): -1.0,
        ("\\boxed{7}", "still \\boxed{7}"): 0.5, ("\\boxed{6}", "\\boxed{5}"): 0.0,
    }
    for (first, second), want in cases.items():
        _, rew, m = play(MathTeamEnv(max_refinement_iterations=1), [first, "Verdict: Incorrect", second, "Verdict: Correct"])
        assert rew[2] == want, (first, second, rew)
        assert m["refine_fixed"] == (want == 1.0) and m["refine_broken"] == (want == -1.0)
    with pytest.raises(ValueError, match="fix_bonus"):
        MathTeamEnv(fix_bonus=0.5)  # shaping belongs to refiner_reward="correctness"


def _judge_batch(verdict_of, mixed_only=True):
    """Evaluator steps from real episodes on a mostly-correct batch: 4 tasks x 4 chains, the
    generator right on 14 of 16 (tasks 0-2 all right, task 3 half right); `verdict_of(task, chain,
    truth)` is the judge's verdict (True = Correct)."""
    steps = []
    for t in range(4):
        for c in range(4):
            right = t < 3 or c < 2
            env = MathTeamEnv(max_refinement_iterations=0, evaluator_mixed_groups_only=mixed_only)
            roles, rew, _ = play(env, ["\\boxed{7}" if right else "\\boxed{6}",
                                       "Verdict: " + ("Correct" if verdict_of(t, c, right) else "Incorrect")])
            for k, (role, r, lab) in enumerate(zip(roles, rew, env.turn_labels())):
                if role == "evaluator_critique":
                    steps.append(Sample(t * 4 + c, t, role, k, [1], [2], [0.0], reward=r, label=lab,
                                      info={"says_correct": verdict_of(t, c, right)}))
    return steps


@pytest.mark.parametrize("mixed_only", [True, False])
def test_an_approving_judge_is_not_paid_for_the_batch_being_mostly_correct(mixed_only):
    """A judge blind to the solution says Correct 3 times in 4 on the all-right tasks and on one right and
    one wrong solution of the mixed task. Without the mixed-groups
    filter, GRPO pushes its "Correct" verdicts up (the batch is mostly right: approving pays); with it,
    the push is zero and a discriminating judge's right verdicts are what gets credit."""
    import torch

    import ppo
    from config import Config
    cfg = Config()
    blind = _judge_batch(lambda t, c, right: c in (0, 2) if t == 3 else c != 3, mixed_only)
    kept = learner.mixed_label_groups(cfg, blind)
    adv = ppo.grpo_advantages(torch.tensor([s.reward for s in kept]), [s.task_id for s in kept], torch.ones(len(kept), 1))
    push = sum(float(a) for s, a in zip(kept, adv[:, 0]) if s.info["says_correct"])  # net push on "Correct"
    if mixed_only:
        assert {s.task_id for s in kept} == {3} and push == pytest.approx(0.0, abs=1e-6)
    else:
        assert len(kept) == 16 and push > 0.5
    # a judge right on 3 of the mixed task's 4 (it approves the last, wrong one) and flipping a coin on the
    # others: in what is kept, its right verdicts get credit and the wrong one is pushed down
    half = _judge_batch(lambda t, c, right: (right or c == 3) if t == 3 else c % 2 == 0, True)
    kept = learner.mixed_label_groups(cfg, half)
    adv = ppo.grpo_advantages(torch.tensor([s.reward for s in kept]), [s.task_id for s in kept], torch.ones(len(kept), 1))
    assert all((a > 0) == (s.reward > 0) for s, a in zip(kept, adv[:, 0]))
    # and in reward, on this mostly-correct batch, approving everything earns less than discriminating
    approve = sum(s.reward for s in _judge_batch(lambda t, c, right: True)) / 16
    judge = sum(s.reward for s in _judge_batch(lambda t, c, right: right)) / 16
    assert approve == pytest.approx((14 - 2) / 16) and judge == 1.0


def test_aggregate_metrics():
    eps = []
    for replies in (["\\boxed{7}", "Verdict: Correct"], ["\\boxed{6}", "Verdict: Correct"],
                    ["\\boxed{6}", "Verdict: Incorrect", "\\boxed{7}", "Verdict: Correct"]):
        env = MathTeamEnv()
        roles, _, m = play(env, replies)
        steps = [Sample(0, 0, r, i, [], [1] * (i + 1), []) for i, r in enumerate(roles)]
        eps.append(Episode(0, 0, env, steps, m))
    a = aggregate(eps)
    assert set(a) == {"evaluator_precision", "evaluator_recall", "evaluator_acc", "evaluator_balanced_acc",
                      "evaluator_fpr", "evaluator_tpr", "evaluator_tnr", "evaluator_approve_rate", "refine_success",
                      "refine_break_rate", "refine_fixed_count", "refine_broken_count"}  # only its own
    assert (a["evaluator_tpr"], a["evaluator_tnr"], a["evaluator_approve_rate"]) == pytest.approx((1.0, 0.5, 0.75))
    assert a["evaluator_fpr"] == pytest.approx(1 / 2) and (a["refine_fixed_count"], a["refine_broken_count"]) == (1, 0)
    assert a["evaluator_precision"] == pytest.approx(2 / 3)  # 3 "Correct" verdicts, 2 right
    assert a["evaluator_recall"] == 1.0 and a["evaluator_acc"] == pytest.approx(3 / 4)
    assert a["refine_success"] == 1.0 and a["refine_break_rate"] == 0.0
    # verdicts: right sol -> Correct, wrong -> Correct, wrong -> Incorrect, right -> Correct:
    # recall on correct ones 2/2, on wrong ones 1/2
    assert a["evaluator_balanced_acc"] == pytest.approx((1 + 0.5) / 2)
    # an unparsed verdict on a correct solution counts against it; a break counts
    env = MathTeamEnv(max_refinement_iterations=1)
    roles, _, m = play(env, ["\\boxed{7}", "no verdict", "\\boxed{8}", "Verdict: Incorrect"])
    steps = [Sample(0, 0, r, i, [], [1] * (i + 1), []) for i, r in enumerate(roles)]
    b = aggregate([Episode(0, 0, env, steps, m)])
    assert b["evaluator_balanced_acc"] == pytest.approx((0 + 1) / 2) and b["refine_break_rate"] == 1.0
    # a batch with no right solution: the recall on the wrong ones (2/2), not half of it (it read 0.5)
    env = MathTeamEnv(max_refinement_iterations=1)
    roles, _, m = play(env, ["\\boxed{6}", "Verdict: Incorrect", "\\boxed{5}", "Verdict: Incorrect"])
    c = aggregate([Episode(0, 0, env, [Sample(0, 0, r, i, [], [1] * (i + 1), []) for i, r in enumerate(roles)], m)])
    assert c["evaluator_balanced_acc"] == 1.0 and c["evaluator_fpr"] == 0.0


def test_single_agent_env():
    env = MathSingleEnv()
    t = env.reset(TASK)
    assert t.role == "solver" and env.step("\\boxed{7}") is None
    assert env.turn_rewards() == [1.0] and env.metrics()["final_correct"] == 1.0


# ---------------------------------------------------------------------------------- data


def test_loader_formats_and_errors(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [{"question": "q1", "answer": "1"}, {"question": "q2", "answer": "Natalia... #### 1,072"},
            {"problem": "p3", "solution": "so \\boxed{\\frac{1}{2}}"}, {"problem": "p4", "answer": 4},
            {"question": "q5", "final_answer": "x^2"}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert [t["answer"] for t in load_math(str(p))] == ["1", "1072", "\\frac{1}{2}", "4", "x^2"]
    (tmp_path / "l.json").write_text(json.dumps(rows[:2]))
    assert len(load_math(str(tmp_path / "l.json"))) == 2
    for bad, msg in [('{"question": "q"}', "missing field 'answer'"), ('{"question": 3, "answer": "1"}', "must be a string"),
                     ('{"question": " ", "answer": "1"}', "empty question"), ("{not json", "not valid JSON"),
                     ('{"problem": "p", "solution": "no box"}', "no \\\\boxed")]:
        f = tmp_path / "bad.jsonl"
        f.write_text('{"question": "ok", "answer": "1"}\n' + bad + "\n")
        with pytest.raises(DataError, match=f"bad.jsonl:2: .*{msg}"):
            load_math(str(f))
    with pytest.raises(FileNotFoundError):
        load_math(str(tmp_path / "none.jsonl"))


def test_shipped_data_is_valid_and_disjoint():
    train, val = load_math("data/arith_train.jsonl"), load_math("data/arith_val.jsonl")
    assert len(train) == 2000 and len(val) == 200
    assert not {t["question"] for t in train} & {t["question"] for t in val}
    for t in val[:50]:
        assert math_reward(f"\\boxed{{{t['answer']}}}", t["answer"]) == 1.0
    assert generate(20, seed=5) == generate(20, seed=5)


# ---------------------------------------------------------------------------------- under the driver


def test_team_env_under_driver_with_tiny_model(tiny):
    import lora
    m, tok = tiny
    lora.add_lora(m, list(ROLES), rank=4, alpha=8)
    roles = {r: RoleSpec(r, SamplingParams(max_new_tokens=12, seed=0)) for r in ROLES}
    tasks = load_math("data/arith_val.jsonl")[:3]
    steps, eps = run_episodes(TorchEngine(m, tok), tok, lambda: MathTeamEnv(max_refinement_iterations=1), tasks,
                              roles, num_chains=2, max_turns=8)
    assert len(eps) == 6 and steps
    for e in eps:
        seq = [s.role for s in e.samples]
        assert seq[:2] == ["generator_initial", "evaluator_critique"]
        assert all(a != b for a, b in zip(seq, seq[1:]))  # roles alternate generator / evaluator
        assert len(seq) in (2, 4) and not e.truncated
    assert all(s.reward in (-1.0, 0.0, 0.5, 1.0) for s in steps)  # verdicts +-1, relative refiner credit
    assert all(isinstance(s.label, bool) for s in steps if s.role == "evaluator_critique")
    a = aggregate(eps)
    assert 0 <= a["evaluator_acc"] <= 1 and all(0 <= e.metrics["final_correct"] <= 1 for e in eps)


def test_balanced_labels_give_an_approving_judge_zero_net_push_on_a_9_to_1_batch():
    """roles.balance_labels: 9 right and 1 wrong solution judged, a judge that approves everything is
    paid +1 nine times and -1 once; weighted, each label weighs 5 and the push on approving is 0."""
    import torch
    steps = [Sample(i, i, "evaluator_critique", 1, [1], [2], [0.0], reward=1.0 if i < 9 else -1.0,
                  label=i < 9) for i in range(10)] + [Sample(10, 10, "evaluator_critique", 1, [1], [2], [0.0])]
    w, m = learner.label_weights(steps)
    assert w.tolist() == pytest.approx([10 / 18] * 9 + [5.0, 1.0])  # the unlabelled turn keeps weight 1
    assert float((w[:10] * torch.tensor([s.reward for s in steps[:10]])).sum()) == pytest.approx(0.0, abs=1e-6)
    assert m == {"labelled_false": 1.0, "labelled_true": 9.0, "reward_false": -1.0, "reward_true": 1.0}
    unweighted = sum(s.reward for s in steps)
    assert unweighted == 8.0  # what the same judge is pushed by without the option


@pytest.mark.parametrize("estimator,kept", [("grpo", {3}), ("rloo", {3}), ("remax", {0, 1, 2, 3}), ("ema_baseline", {0, 1, 2, 3})])
def test_the_label_filter_drops_only_groups_a_group_centred_estimator_zeroes(estimator, kept):
    """mixed_label_groups leaves out uniform-label groups only for roles in ppo.GROUPED: under remax or
    a running baseline a uniform group still carries advantage (like DAPO's filter)."""
    from config import AlgoConfig, Config
    cfg = Config(algo=AlgoConfig(adv_estimator=estimator))
    batch = _judge_batch(lambda t, c, right: c != 3, True)
    assert {s.task_id for s in learner.mixed_label_groups(cfg, batch)} == kept


def test_probes_train_the_judge_only_and_never_reach_the_team():
    """probes=True: after the team's last turn the judge judges the first (right) solution and its near
    miss; the team's history, final answer, team reward, evaluator counts and the other roles' rewards
    are those of the same episode without probes."""
    task = {"question": "What is 53 + 75?", "answer": "128"}
    for replies in (["53 + 75 = 128, so \\boxed{128}.", "Verdict: Correct"],
                    ["53 + 75 = 128, so \\boxed{128}.", "Verdict: Incorrect", "It is \\boxed{129}.", "Verdict: Correct"],
                    ["53 + 75 = 127, so \\boxed{127}.", "Verdict: Correct"]):
        plain = MathTeamEnv(max_refinement_iterations=1)
        roles, rew, met = tplay(plain, task, replies)[:3]
        probed = MathTeamEnv(max_refinement_iterations=1, probes=True)
        n_probes = 2 if replies[0].endswith("{128}.") else 0
        p_roles, p_rew, p_met = tplay(probed, task, replies + ["Verdict: Correct"] * n_probes)[:3]
        assert p_roles == roles + ["evaluator_critique"] * n_probes and p_rew[:len(rew)] == rew
        assert probed.history == plain.history and probed.final_answer() == plain.final_answer()
        assert {k: v for k, v in p_met.items() if not k.startswith("probe")} == met
        assert p_met.get("probes", 0) == n_probes
        if n_probes:  # an approve-all judge: right on the right one, wrong on the near miss
            assert sorted(p_rew[len(rew):]) == [-1.0, 1.0] and p_met["probe_fp"] == 1 and p_met["probe_tp"] == 1
            assert sorted(probed.turn_labels()[len(rew):]) == [False, True]
    agg = aggregate([types.SimpleNamespace(metrics=p_met)])
    assert "probe_balanced_acc" not in agg  # the last episode's solution was wrong: no probes
    eps = [types.SimpleNamespace(metrics=tplay(MathTeamEnv(probes=True), task, r)[2]) for r in (
        ["\\boxed{128}", "Verdict: Correct", "Verdict: Correct", "Verdict: Incorrect"],)]
    agg = aggregate(eps)
    assert agg["probe_balanced_acc"] in (0.5, 1.0) and "evaluator_balanced_acc" in agg


def test_the_blind_judge_checks_before_it_sees_the_solution():
    """evaluator_prompt="blind": the judge's first turn shows the problem only (never the solution); its
    check is paid on its own result against the truth and unlabelled; every verdict after it (the
    team's, after a refinement, and the probes') extends that one conversation with the check said; the
    team reads the check line with the verdict as the judge's critique; the flow, final answer and
    rewards of the other roles are the "check" judge's."""
    task = {"question": "What is 53 + 75?", "answer": "128"}
    env = MathTeamEnv(max_refinement_iterations=1, probes=True, evaluator_prompt="blind")
    env.reset(task)
    check_turn = env.step("53 + 75 = 127, so \\boxed{127}.")
    assert check_turn.role == "evaluator_critique" and len(check_turn.messages) == 2
    assert "127" not in str(check_turn.messages) and "Before you see the solution" in str(check_turn.messages)
    verdict_turn = env.step("Check: ends in 8, 3 digits. I get \\boxed{128}.")
    assert verdict_turn.role == "evaluator_critique" and verdict_turn.messages[:2] == check_turn.messages
    assert verdict_turn.messages[2] == {"role": "assistant", "content": "Check: ends in 8, 3 digits. I get \\boxed{128}."}
    assert "Solution:\n53 + 75 = 127" in verdict_turn.messages[3]["content"]
    refine = env.step("The solution says 127: different.\nVerdict: Incorrect")
    assert refine.role == "generator_refinement" and "I get \\boxed{128}.\nThe solution says 127" in refine.messages[1]["content"]
    second = env.step("So it is \\boxed{128}.")
    assert second.messages[:3] == verdict_turn.messages[:3] and "Refined solution:\nSo it is" in second.messages[3]["content"]
    probe = env.step("Verdict: Correct")  # the first solution was wrong: no probes, the episode ends
    assert probe is None and env.final_answer() == "128"
    assert env.turn_rewards() == [0.0, 1.0, 1.0, 1.0, 1.0] and env.turn_labels() == [None, None, False, None, True]
    m = env.metrics()
    assert (m["eval_checks"], m["eval_check_right"], m["eval_tn"], m["eval_tp"], m["refine_fixed"]) == (1, 1, 1, 1, 1)
    replies = ["53 + 75 = 128, so \\boxed{128}.", "Check: I get \\boxed{120}.", "Verdict: Incorrect", "It is \\boxed{129}.",
               "Verdict: Correct", "Verdict: Correct", "Verdict: Correct"]
    blind = MathTeamEnv(max_refinement_iterations=1, probes=True, evaluator_prompt="blind")
    roles, rew, met = tplay(blind, task, replies)[:3]
    check = MathTeamEnv(max_refinement_iterations=1, probes=True, evaluator_prompt="check")
    c_roles, c_rew, c_met = tplay(check, task, replies[:1] + replies[2:])[:3]
    assert roles == c_roles[:1] + ["evaluator_critique"] + c_roles[1:] and rew == c_rew[:1] + [-1.0] + c_rew[1:]
    assert blind.final_answer() == check.final_answer() == "129" and blind.solution_correct == check.solution_correct
    assert {k: v for k, v in met.items() if not k.startswith("eval_check")} == c_met and met["eval_check_right"] == 0
    assert [r for r, _ in blind.history] == [r for r, _ in check.history]
    blind.reset(task)  # the probes' verdicts extend the same check, and show the probe alone
    turn, seen = blind.step(replies[0]), []
    for r in replies[1:]:
        seen.append(turn)
        turn = blind.step(r)
    for probe in seen[-2:]:
        assert probe.messages[:3] == seen[1].messages[:3] and probe.messages[2]["content"] == replies[1]
        assert "Critique" not in probe.messages[3]["content"] and "Solution:\n53 + 75 = 12" in probe.messages[3]["content"]
    from config import load_config_file
    from workflows import check_roles
    tiny = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    blind_cfg = dataclasses.replace(tiny, data=dataclasses.replace(tiny.data, env_kwargs={"evaluator_prompt": "blind"}))
    with pytest.raises(ConfigError, match="config field algo.group_by_turn: evaluator_prompt='blind' with the judge's 'grpo'"):
        check_roles(blind_cfg)  # grpo would centre the check among the verdicts
    check_roles(dataclasses.replace(blind_cfg, algo=dataclasses.replace(tiny.algo, group_by_turn=True)))
    with pytest.raises(ConfigError, match="config field rollout.merge_turns: evaluator_prompt='blind'"):
        check_roles(dataclasses.replace(blind_cfg, rollout=dataclasses.replace(tiny.rollout, merge_turns=True)))
    check_roles(dataclasses.replace(tiny, rollout=dataclasses.replace(tiny.rollout, merge_turns=True)))
    check_roles(load_config_file(str(ROOT / "configs" / "smollm2_math_judge_blind.py")))  # reinforce++: per turn
    agg = aggregate([types.SimpleNamespace(metrics=m), types.SimpleNamespace(metrics=met)])
    assert agg["evaluator_check_acc"] == 0.5 and "evaluator_check_acc" not in aggregate([types.SimpleNamespace(metrics=c_met)])
    with pytest.raises(ValueError, match="evaluator_prompt must be 'plain', 'check', 'blind' or 'digit'"):
        MathTeamEnv(evaluator_prompt="blnd")


def test_the_blind_teacher_checks_right_on_every_train_problem_without_the_solution():
    """sft.py's math teacher for the blind judge: per task a check turn (the problem only -> the truth's
    check line, right on every train problem) and, after it, one verdict on a right and one on a wrong
    solution, each verdict right, in exactly the env's prompts."""
    from agents.math_team import blind_messages, check_line
    from model import load_model
    from sft import math_teacher
    _, tok = load_model("tiny")
    rows = [json.loads(x) for x in open(ROOT / "data" / "arith12_train.jsonl")]
    tasks = [{"question": r["question"], "answer": r["answer"]} for r in rows]
    ex, counts = math_teacher([], tasks, tok, "judge", 0, 0, "blind")
    truth = {t["question"]: t["answer"] for t in tasks}
    assert counts["teacher:check"] == len(truth) - counts.get("tasks_without_incorrect", 0) > 900
    assert len(ex) == 3 * counts["teacher:check"]
    for e in ex:
        q = e.prompt.split("Problem: ")[1].split("\n")[0]
        task = {"question": q, "answer": truth[q]}
        if e.source == "teacher:check":
            assert "Solution:" not in e.prompt and e.reply == check_line(task["answer"])
            assert math_reward(e.reply, task["answer"]) == 1.0
            env = MathTeamEnv(evaluator_prompt="blind")
            env.reset(task)
            assert e.prompt == tok.apply_chat_template(env.step("\\boxed{0}").messages, add_generation_prompt=True,
                                                       tokenize=False)
        else:
            solution = e.prompt.split("Solution:\n")[1].split("<|")[0].split("\n\nIs the latest")[0]
            assert parse_verdict(e.reply) == (math_reward(solution, task["answer"]) == 1.0)
            assert e.prompt == tok.apply_chat_template(blind_messages(task["question"], check_line(task["answer"]),
                                                                      [("generator_initial", solution)]),
                                                       add_generation_prompt=True, tokenize=False)


def test_the_digit_judge_checks_the_sign_and_last_digit_blind_and_is_paid_on_that_claim():
    """evaluator_prompt="digit": the blind judge's check turn asks for the sign and last digit only (the
    problem, never the solution); it is paid +1 when its claim is the truth's sign and last digit (a
    wrong full result with the right last digit is still a right claim), -1 otherwise; its verdicts
    follow in the same conversation with the digit question; the rest of the flow is the blind judge's."""
    from agents.math_team import digit_check_right, digit_claim
    task = {"question": "What is 41 - 88?", "answer": "-47"}
    env = MathTeamEnv(max_refinement_iterations=1, probes=True, evaluator_prompt="digit")
    env.reset(task)
    check_turn = env.step("41 - 88 = 47, so \\boxed{47}.")
    assert "\\boxed{47}" not in str(check_turn.messages) and "the sign and the last digit only" in str(check_turn.messages)
    verdict_turn = env.step("Check: 41 is less than 88, so the answer is negative: 88 - 41, 8 - 1 = 7, so the answer "
                            "is negative and ends in 7.")
    assert verdict_turn.messages[:2] == check_turn.messages and "end in your digit" in verdict_turn.messages[3]["content"]
    assert env.turn_rewards() == [0.0, 1.0] and env.check_right
    env.step("The solution says 47: it should be negative.\nVerdict: Incorrect")
    env.step("So it is \\boxed{-47}.")
    assert env.step("Verdict: Correct") is None and env.metrics()["eval_check_right"] == 1.0
    assert env.turn_rewards() == [0.0, 1.0, 1.0, 1.0, 1.0]
    for claim, right in (("so the answer ends in 7.", False), ("the answer is negative and ends in 3", False),
                         ("so the answer is negative and ends in 7", True), ("I get \\boxed{-47}.", False)):
        assert digit_check_right(claim, "-47") is right, claim
        wrong = MathTeamEnv(evaluator_prompt="digit")
        wrong.reset(task)
        wrong.step("\\boxed{-47}")
        wrong.step(claim)
        assert wrong.turn_rewards() == [1.0, 1.0 if right else -1.0]
    assert digit_check_right("so the answer ends in 8.", "138") and digit_check_right("answer is positive, and ends in 8", "8")
    assert digit_claim("answer is negative and " * 50_000) is None and digit_claim("ends in " * 100_000) is None
    frac = MathTeamEnv(evaluator_prompt="digit")  # no whole-number truth: no digit to check, the check is paid 0
    frac.reset({"question": "What is 5 / 2?", "answer": "2.5"})
    frac.step("\\boxed{2.5}")
    frac.step("Check: so the answer ends in 5.")
    assert frac.turn_rewards() == [1.0, 0.0] and frac.check_right is None
    from config import load_config_file
    from workflows import check_roles
    tiny = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    with pytest.raises(ConfigError, match="config field algo.group_by_turn: evaluator_prompt='digit'"):
        check_roles(dataclasses.replace(tiny, data=dataclasses.replace(tiny.data, env_kwargs={"evaluator_prompt": "digit"})))
    cfg = load_config_file(str(ROOT / "configs" / "smollm2_math_judge_digit.py"))
    check_roles(cfg)
    assert cfg.data.env_kwargs["evaluator_prompt"] == "digit" and cfg.roles[1].max_tokens == 64


def test_verdict_from_check_makes_every_verdict_the_checks_comparison_and_trains_only_the_check():
    """verdict_from_check=True: the judge's only turn is its blind digit check (paid on its claim, unlabelled);
    every verdict, on each solution and on the probes, is the env's comparison of the answer (the whole number
    it stands for, as math_reward reads it) with the claimed sign and last digit, shown to the team in the
    words sft.py's teacher taught the judge; a wrong answer that fits the claim passes (the check's blind
    spot), a right one that does not is rejected (a wrong check); probes count but add no turn; off = the
    judge's own verdict turns; only with evaluator_prompt="digit"."""
    task = {"question": "What is 41 - 88?", "answer": "-47"}
    check = "Check: 41 is less than 88, so the answer is negative: 88 - 41, 8 - 1 = 7, so the answer is negative and ends in 7."
    env = MathTeamEnv(max_refinement_iterations=2, probes=True, evaluator_prompt="digit", verdict_from_check=True)
    env.reset(task)
    check_turn = env.step("So \\boxed{47}.")
    assert check_turn.role == "evaluator_critique" and "boxed{47}" not in str(check_turn.messages)  # blind
    refine = env.step(check)  # no verdict turn: the env compares 47 with (negative, 7): Incorrect
    assert refine.role == "generator_refinement"
    assert f"{check}\nThe solution says 47: it should be negative.\nVerdict: Incorrect" in refine.messages[-1]["content"]
    again = env.step("Then \\boxed{-48}.")  # the sign fixed, not the digit: Incorrect
    assert again.role == "generator_refinement" and "The solution says -48: it ends in 8, not 7." in again.messages[-1]["content"]
    assert env.step("It is \\boxed{$-47$}.") is None  # read as math_reward reads it: fits the claim, Correct; the
    m = env.metrics()  # team stops; no right first answer, so no probes
    assert env.turn_rewards() == [0.0, 1.0, 0.0, 1.0] and env.verdicts == [False, False, True]
    assert env.turn_labels() == [None] * 4  # the check is paid on its claim, not on a solution's truth
    assert (m["eval_tn"], m["eval_tp"], m["refine_fixed"], m["eval_checks"], m["eval_check_right"]) == (2, 1, 1, 1.0, 1.0)
    off = MathTeamEnv(max_refinement_iterations=2, evaluator_prompt="digit")  # the same replies, verdicts by the judge
    off.reset(task)
    off.step("So \\boxed{47}.")
    assert off.step(check).role == "evaluator_critique" and off.turn_rewards() == [0.0, 1.0]
    for shown in ("\\boxed{91 + 57 = -47}", "\\boxed{\u221247}", "\\boxed{-47.00}", "\\boxed{(-47)}"):  # right answers
        right = MathTeamEnv(evaluator_prompt="digit", verdict_from_check=True)
        right.reset(task)
        right.step(shown)
        assert right.step(check) is None and right.verdicts == [True], shown
    blind_spot = MathTeamEnv(evaluator_prompt="digit", verdict_from_check=True, probes=True)
    blind_spot.reset(task)
    blind_spot.step("\\boxed{-57}")  # a tens slip: ends in 7, negative, so the check passes it
    assert blind_spot.step(check) is None and blind_spot.metrics()["eval_fp"] == 1 and blind_spot.turn_rewards() == [0.0, 1.0]
    probed = MathTeamEnv(evaluator_prompt="digit", verdict_from_check=True, probes=True, max_refinement_iterations=0)
    probed.reset(task)
    probed.step("41 - 88 = -47, so \\boxed{-47}.")
    assert probed.step("Check: so the answer ends in 7.") is None  # a wrong claim (no sign): rejects the right answer
    m = probed.metrics()  # and its probes: the right solution rejected; the near miss's fate is its digit's
    assert probed.turn_rewards() == [1.0, -1.0] and m["eval_fn"] == 1  # the generator and the check: no probe turns
    assert (m["probes"], m["probe_fn"], m["probe_tn"]) == (2, 1, 1)
    mute = MathTeamEnv(evaluator_prompt="digit", verdict_from_check=True, max_refinement_iterations=1)
    mute.reset(task)
    mute.step("\\boxed{-47}")
    assert "I cannot tell.\nNo verdict." in mute.step("I cannot tell.").messages[-1]["content"] and mute.verdicts == [None]
    with pytest.raises(ValueError, match="verdict_from_check needs evaluator_prompt='digit'"):
        MathTeamEnv(evaluator_prompt="blind", verdict_from_check=True)
    with pytest.raises(ConfigError, match="verdict_from_check"):
        MathTeamEnv(evaluator_prompt="digit", verdict_from_check="yes")
    from config import load_config_file
    from workflows import check_roles
    cfg = load_config_file(str(ROOT / "configs" / "smollm2_math_judge_derived.py"))
    check_roles(cfg)
    assert cfg.data.env_kwargs == {"probes": True, "evaluator_prompt": "digit", "verdict_from_check": True}
    assert not cfg.roles[1].balance_labels and cfg.roles[1].train_windows == ((9, 16),)


def test_the_digit_teacher_checks_right_on_every_train_problem_and_its_verdicts_follow_the_check():
    """sft.py's math teacher for the digit judge: per task a check turn worked from the operands (right
    sign and last digit on every train problem, and consistent: its arithmetic step ends in the digit it
    claims), then a verdict on a right and on a wrong solution, in the env's prompts; every wrong solution
    it shows fails the check (own samples the check cannot catch are skipped), so each verdict is both
    the check's and the truth."""
    from agents.math_team import blind_messages, digit_check_line, digit_check_right, digit_consistent
    from model import load_model
    from sft import math_teacher
    _, tok = load_model("tiny")
    rows = [json.loads(x) for x in open(ROOT / "data" / "arith12_train.jsonl")]
    tasks = [{"question": r["question"], "answer": r["answer"]} for r in rows]
    uncatchable = {"task": tasks[1], "turns": [{"role": "generator_initial", "reply": "\\boxed{63}"}]}  # 79 - 26 = 53
    catchable = {"task": tasks[1], "turns": [{"role": "generator_initial", "reply": "\\boxed{52}"}]}
    empty = {"task": tasks[2], "turns": [{"role": "generator_initial", "reply": "So \\boxed{}."}]}  # 9 + 7
    comma = {"task": tasks[3], "turns": [{"role": "generator_initial", "reply": "\\boxed{1,0.}"}]}
    ex, counts = math_teacher([("a:1", uncatchable), ("a:2", catchable), ("a:3", empty), ("a:4", comma)], tasks, tok,
                              "judge", 0, 0, "digit")
    truth = {t["question"]: t["answer"] for t in tasks}
    assert counts["teacher:check"] == len(truth) - counts.get("tasks_without_incorrect", 0) > 900
    assert len(ex) == 3 * counts["teacher:check"] and counts["teacher:own_wrong"] == 3
    assert any(e.reply == "The solution gives no final answer.\nVerdict: Incorrect" for e in ex)
    worked = 0
    for e in ex:
        q = e.prompt.split("Problem: ")[1].split("\n")[0]
        y = truth[q]
        if e.source == "teacher:check":
            assert "Solution:" not in e.prompt and e.reply == digit_check_line(q, y) and digit_check_right(e.reply, y)
            step = re.search(r"= (-?\d+), so the answer", e.reply)
            worked += step is not None
            assert step is None or step.group(1)[-1] == y[-1], e.reply
            env = MathTeamEnv(evaluator_prompt="digit")
            env.reset({"question": q, "answer": y})
            assert e.prompt == tok.apply_chat_template(env.step("\\boxed{0}").messages, add_generation_prompt=True,
                                                       tokenize=False)
        else:
            solution = e.prompt.split("Solution:\n")[1].split("<|")[0].split("\n\nDoes the latest")[0]
            right = math_reward(solution, y) == 1.0
            assert parse_verdict(e.reply) == right and (right or not digit_consistent(extract_answer(solution), y))
            assert not re.search(r"ends in (\S), not \1\b", e.reply), e.reply  # the reason agrees with the verdict
            assert "63" not in solution or q != tasks[1]["question"]
            assert e.prompt == tok.apply_chat_template(blind_messages(q, digit_check_line(q, y),
                                                                      [("generator_initial", solution)], "evaluator_digit"),
                                                       add_generation_prompt=True, tokenize=False)
    assert worked == counts["teacher:check"]  # every train problem is one operation: the check is worked
    with pytest.raises(ValueError, match="evaluator_prompt must be one of"):
        math_teacher([], tasks, tok, "judge", 0, 0, "digits")


def test_the_teacher_never_takes_a_blind_check_turn_for_the_prompt_a_solution_was_judged_with():
    """A blind run's trajectory: the turn after a solution is the judge's check, whose prompt holds no
    solution; the plain teacher builds the verdict prompt itself rather than train a critique on it."""
    from model import load_model
    from sft import math_teacher
    _, tok = load_model("tiny")
    task = {"question": "What is 53 + 75?", "answer": "128"}
    env = MathTeamEnv(evaluator_prompt="blind")
    env.reset(task)
    check = env.step("53 + 75 = 127, so \\boxed{127}.")
    rec = {"task": task, "turns": [{"role": "generator_initial", "reply": "53 + 75 = 127, so \\boxed{127}."},
                                   {"role": "evaluator_critique", "reply": "Check: I get \\boxed{128}.",
                                    "prompt": tok.apply_chat_template(check.messages, add_generation_prompt=True,
                                                                      tokenize=False)}]}
    ex, _ = math_teacher([("blind.jsonl:1", rec)], [], tok, "judge", 0, 0)
    assert len(ex) == 2 and all("Solution:\n" in e.prompt for e in ex)
    assert any("53 + 75 = 127, so \\boxed{127}." in e.prompt and e.source == "teacher:own_wrong" for e in ex)


def test_a_near_miss_is_never_the_truth_on_every_train_problem():
    from envs.math_3agent import near_miss
    rows = [json.loads(x) for x in open(ROOT / "data" / "arith12_train.jsonl")]
    for r in rows:
        sol = f"The result is {r['answer']}, so the answer is \\boxed{{{r['answer']}}}."
        miss = near_miss(sol, r["answer"])
        assert miss is not None and math_reward(miss, r["answer"]) == 0.0, r
        assert not re.search(rf"(?<![\d.]){re.escape(r['answer'])}(?![\d.])", miss), miss  # every occurrence changed
    assert near_miss("so \\boxed{x+1}", "x+1") is None  # not an integer: no probe


def test_self_refine_gives_the_single_solver_a_second_look_at_its_own_answer():
    env = MathSingleEnv(self_refine=True)
    roles, rew, met, seen = tplay(env, TASK, ["3 + 4 = 8, \\boxed{8}", "I was wrong: 3 + 4 = 7, \\boxed{7}"])
    assert roles == ["solver", "solver"] and rew == [0.0, 1.0]
    assert "3 + 4 = 8" in seen[1].messages[1]["content"] and "Check your solution" in seen[1].messages[1]["content"]
    assert met["team_reward"] == 1.0 and met["initial_correct"] == 0.0 and met["refine_fixed"] == 1.0
    assert env.final_answer() == "7"
    once = MathSingleEnv()
    assert tplay(once, TASK, ["\\boxed{7}"])[1] == [1.0] and "refine_fixed" not in once.metrics()
    from config import load_config_file
    cfg = load_config_file(str(ROOT / "configs" / "math_self_refine.py")).validate()
    assert cfg.data.env_kwargs == {"self_refine": True} and cfg.rollout.max_turns == 2 and cfg.roles[0].name == "solver"


def test_a_relative_revision_reward_pays_the_change_not_the_copy():
    """revision_reward="relative": the second look is paid for what it changed (fix +1, break -1, keep right
    +0.5, stay wrong 0), the first answer for its correctness; a copy of a right answer earns less than a
    fix and a copy of a wrong one nothing. The arm's config centres revisions among revisions."""
    for first, second, want in (("\\boxed{8}", "\\boxed{7}", [0.0, 1.0]), ("\\boxed{7}", "\\boxed{8}", [1.0, -1.0]),
                                ("\\boxed{7}", "\\boxed{7}", [1.0, 0.5]), ("\\boxed{8}", "\\boxed{8}", [0.0, 0.0])):
        env = MathSingleEnv(self_refine=True, revision_reward="relative")
        assert tplay(env, TASK, [first, second])[1] == want
        assert tplay(MathSingleEnv(self_refine=True), TASK, [first, second])[1] == [float(first == "\\boxed{7}"),
                                                                                     float(second == "\\boxed{7}")]
    with pytest.raises(ValueError, match="revision_reward='relative' pays the revision of self_refine=True"):
        MathSingleEnv(revision_reward="relative")
    with pytest.raises(ValueError, match="revision_reward must be"):
        MathSingleEnv(self_refine=True, revision_reward="fix")
    from config import load_config_file
    cfg = load_config_file(str(ROOT / "configs" / "math_self_refine_relative.py")).validate()
    assert cfg.algo.group_by_turn and cfg.data.env_kwargs["revision_reward"] == "relative"
    from rollout import Sample
    s = [Sample(0, 0, "solver", t, [1], [2], [-1.0], key=t) for t in (0, 1)]  # key: the driver's (the solver's k-th turn)
    assert learner.group_key(cfg, s[0]) != learner.group_key(cfg, s[1])


def test_the_check_prompt_and_the_teachers_check_is_right_on_every_train_problem():
    """evaluator_prompt="check": the judge is asked for its own check line before the verdict; the line
    sft.py's teacher writes for it (agents.math_team.check_line) states the truth's last digit, size and
    value right on every train problem, and the teacher's critiques open with it and end right."""
    from agents.math_team import check_line
    from sft import math_teacher
    env = MathTeamEnv(evaluator_prompt="check")
    env.reset(TASK)
    assert "First check the answer yourself" in env.step("\\boxed{7}").messages[0]["content"]
    rows = [json.loads(x) for x in open(ROOT / "data" / "arith12_train.jsonl")]
    for r in rows:
        line, t = check_line(r["answer"]), r["answer"]
        m = re.fullmatch(r"Check: ends in (\d), (\d+) digits?\. I get \\boxed\{(-?\d+)\}\.", line)
        assert m and m[1] == t[-1] and int(m[2]) == len(t.lstrip("-")) and m[3] == t, (line, t)
        assert math_reward(line, t) == 1.0
    from model import load_model
    _, tok = load_model("tiny")
    tasks = [{"question": r["question"], "answer": r["answer"]} for r in rows[:40]]
    ex, counts = math_teacher([], tasks, tok, "judge", 0, 0, "check")
    assert len(ex) >= 70 and counts["teacher:perturbed"] == counts["teacher:synthetic_right"] == len(ex) // 2
    for e in ex:
        truth = next(t["answer"] for t in tasks if f"Problem: {t['question']}" in e.prompt)
        assert e.reply.startswith(check_line(truth)) and "First check the answer yourself" in e.prompt
        solution = e.prompt.split("Solution:\n")[1]
        assert parse_verdict(e.reply) == (math_reward(solution, truth) == 1.0)


def test_the_scripted_refiner_lesson_is_a_caught_near_miss_then_the_claimed_digit_and_the_right_result():
    """MathTeamEnv.scripted_replies / scripted_repair (sft.py's scripted teacher, verdict_from_check only):
    on every train task the perfect team scores the maximum through the env's own rewards; the repair's
    first answer is a mistake the teacher's check catches (the refiner's prompt shows the env's Incorrect
    verdict on it), and the fix names the claimed sign and digit before the right result; a judge that
    writes its own verdicts gets none (its teacher is teacher=math)."""
    from agents.math_team import digit_check_line, digit_consistent
    from agents.math_team import solution_text
    from rewards.math import extract_answer, math_reward
    env = MathTeamEnv(max_refinement_iterations=1, probes=True, evaluator_prompt="digit", verdict_from_check=True)
    tasks = [json.loads(x) for x in (ROOT / "data" / "arith12_train.jsonl").read_text().splitlines()][:300]
    kinds = set()
    for task in tasks:
        y = task["answer"]
        first, check = env.scripted_replies(task)
        assert check == digit_check_line(task["question"], y) and math_reward(first, y) == 1.0
        env.reset(task)
        assert env.step(first).role == "evaluator_critique" and env.step(check) is None  # the check clears it
        assert env.turn_rewards() == [1.0, 1.0] and env.metrics()["team_reward"] == 1.0
        mistake, check2, fix = env.scripted_repair(task)
        said = extract_answer(mistake)
        assert check2 == check and not digit_consistent(said, y) and said in mistake.split("=")[-1]
        kinds.add("sign" if said.lstrip("-") == y.lstrip("-") else "near" if abs(int(said) - int(y)) < 10 else "far")
        env.reset(task)
        env.step(mistake)
        refine = env.step(check2)
        assert refine.role == "generator_refinement" and "Verdict: Incorrect" in refine.messages[-1]["content"]
        assert mistake in refine.messages[-1]["content"]
        assert env.step(fix) is None and env.turn_rewards() == [0.0, 1.0, 1.0]
        m = env.metrics()
        assert (m["refine_fixed"], m["team_reward"]) == (1, 1.0)
        neg = y.startswith("-")
        assert fix.startswith(f"The answer must {'be negative and ' * neg}end in {y[-1]}: ") and fix.endswith(f"\\boxed{{{y}}}.")
    assert kinds == {"sign", "near", "far"}  # +-1/+-2/another digit, a flipped sign, swapped digits
    assert env.scripted_repair({"question": "What is 1 / 4?", "answer": "0.25"}) is None  # no digit to claim
    assert solution_text("What is 3 + 4 * 2?", "11") == "11, so the answer is \\boxed{11}."  # not one operation
    for kw in ({"evaluator_prompt": "digit"}, {}):  # a judge that writes its verdicts: its teacher is teacher=math
        assert MathTeamEnv(**kw).scripted_replies(tasks[0]) == [] and MathTeamEnv(**kw).scripted_repair(tasks[0]) is None


def test_the_single_solvers_scripted_reply_is_the_teachers_right_solution():
    """MathSingleEnv.scripted_replies (arm a-sft's SFT): the solution the team's refiner is taught, right on
    every train task through the env's reward; under self_refine, kept as the revision."""
    from agents.math_team import solution_text
    from envs.math_single import MathSingleEnv
    for kw, n in (({}, 1), ({"self_refine": True}, 2)):
        env = MathSingleEnv(**kw)
        for task in [json.loads(x) for x in (ROOT / "data" / "arith12_train.jsonl").read_text().splitlines()][:300]:
            replies = env.scripted_replies(task)
            assert len(replies) == n and replies[0] == solution_text(task["question"], task["answer"])
            turn = env.reset(task)
            for r in replies:
                turn = env.step(r)
            assert turn is None and env.turn_rewards() == [1.0] * n and env.metrics()["team_reward"] == 1.0


def test_the_held_out_test_set_is_what_its_builder_writes_and_shares_no_question_with_train_or_val():
    from data.math_data import held_out_12
    read = lambda name: [json.loads(x) for x in open(ROOT / "data" / name)]  # noqa: E731
    train, val, test = read("arith12_train.jsonl"), read("arith12_val.jsonl"), read("arith12_test.jsonl")
    assert test == held_out_12(train, val)  # the shipped file is the builder's output, reproducible
    questions = [r["question"] for r in test]
    assert len(test) == len(set(questions)) == 500
    assert not set(questions) & {r["question"] for r in train + val}
    for r in test:
        a, op, b = re.fullmatch(r"What is (\d\d) ([+-]) (\d\d)\?", r["question"]).groups()
        assert int(r["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))
    assert {r["question"][11] for r in test} == {"+", "-"}
    # the builder skips a question train or val holds: give it a val that holds its first draw
    first = held_out_12(train, val, n=1)[0]
    assert held_out_12(train, val + [first], n=1)[0] != first
