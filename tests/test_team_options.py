"""The field's team options, each against numbers computed by hand: per-role advantage normalisation
(algo.norm_adv_by_role), the team reward mix per role (roles[i].team_reward_weight), and agent-and-turn groups
(algo.group_by_turn, AT-GRPO's)."""
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

import learner
import ppo
import train
from config import Config, ConfigError, RoleConfig, load_config_file
from rollout import Episode, Sample

ROOT = Path(__file__).resolve().parent.parent


def test_group_whiten_by_hand():
    """Two roles' rows: role 0 has tokens 1, 2, 3 (mean 2, unbiased var 1) and role 1 tokens 10, 30 (mean 20, var
    200); each is (x - mean) / sqrt(var + 1e-8), masked entries 0."""
    x = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0], [10.0, 30.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    out = ppo.group_whiten(x, mask, torch.tensor([0, 0, 1]), 2)
    s0, s1 = math.sqrt(1 + 1e-8), math.sqrt(200 + 1e-8)
    want = torch.tensor([[-1 / s0, 0.0, 0.0], [1 / s0, 0.0, 0.0], [-10 / s1, 10 / s1, 0.0]])
    assert torch.allclose(out, want, atol=1e-6)
    # the sums go through all_sum: a second rank with the same rows doubles n, s1, s2 (mean stays, var shrinks)
    doubled = ppo.group_whiten(x, mask, torch.tensor([0, 0, 1]), 2, all_sum=lambda v: [2 * a for a in v])
    assert doubled[0, 0] == pytest.approx(-1 / math.sqrt(4 / 5 + 1e-8), abs=1e-6)  # (6 - 1) -> var 4/5


def test_team_reward_mix_by_hand():
    """alpha 0.25 on the judge: 0.25 * team 1.0 + 0.75 * own -1.0 = -0.5; the solver (alpha 0) keeps its own;
    the own reward stays for the logs."""
    cfg = Config(roles=(RoleConfig("solver"), RoleConfig("judge", team_reward_weight=0.25)))
    ep = Episode(0, 0, None, [Sample(0, 0, "solver", 0, [1], [2], [0.0], reward=1.0),
                              Sample(0, 0, "judge", 1, [1], [2], [0.0], reward=-1.0)], {"team_reward": 1.0})
    learner.mix_team_reward(cfg, [ep])
    assert [s.reward for s in ep.samples] == [1.0, -0.5] and ep.samples[1].info["own_reward"] == -1.0
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match=r"roles\[1\]\.team_reward_weight: (must be in \[0, 1\]|is NaN)"):
            Config(roles=(RoleConfig("solver"), RoleConfig("judge", team_reward_weight=bad))).validate()


def test_agent_and_turn_groups_by_hand():
    """AT-GRPO's groups are group_by_turn's: (task, role, turn). Two chains of one task, the judge speaking twice in
    each: rewards turn 1 = (1, 0), turn 2 = (0, 0). By turn: turn 1 -> (+0.7071, -0.7071) (GRPO, unbiased std
    0.7071), turn 2 -> (0, 0); one group per role: mean 0.25, std 0.5 -> (1.5, -0.5, -0.5, -0.5)."""
    samples = [Sample(e, 0, "judge", t, [1], [2], [0.0], reward=r, key=t) for e, t, r in
               [(0, 0, 1.0), (0, 1, 0.0), (1, 0, 0.0), (1, 1, 0.0)]]
    for by_turn, want in ((True, [0.7071, 0.0, -0.7071, 0.0]), (False, [1.5, -0.5, -0.5, -0.5])):
        cfg = dataclasses.replace(Config(), algo=dataclasses.replace(Config().algo, group_by_turn=by_turn))
        rb = learner.AdapterBatch(samples, [1.0] * 4, 0, 1)
        adv, _ = learner.advantages(cfg, rb, None, None, 0.0, "grpo")
        assert adv[:, 0].tolist() == pytest.approx(want, abs=1e-4)


def _toy_two_roles(tmp_path, **algo):
    """The toy speaker as two roles on one shared adapter (a file env: speaker then echo, each paid for its 7s)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = tmp_path / "two.py"
    env.write_text(
        "from envs import Prompt\n"
        "from envs.toy import ToyEnv, load_tasks\n"
        "class Two(ToyEnv):\n"
        "    roles = ('speaker', 'echo')\n"
        "    def reset(self, task):\n"
        "        self.said = []\n"
        "        return Prompt('speaker', [{'role': 'user', 'content': task['question']}])\n"
        "    def step(self, reply):\n"
        "        self.said.append(reply)\n"
        "        if len(self.said) == 2:\n"
        "            return None\n"
        "        return Prompt('echo', [{'role': 'user', 'content': 'Say it again: ' + reply[-40:]}])\n"
        "    def turn_rewards(self):\n"
        "        return [10.0 * t.count('7') / max(len(t), 1) if i == 0 else t.count('7') / max(len(t), 1)\n"
        "                for i, t in enumerate(self.said)]\n"
        "    def metrics(self):\n"
        "        return {'team_reward': float(any('7' in t for t in self.said))}\n")
    cfg = load_config_file(str(ROOT / "configs" / "tiny_toy.py"))
    roles = (RoleConfig("speaker", adapter="team", max_tokens=8), RoleConfig("echo", adapter="team", max_tokens=8))
    return dataclasses.replace(cfg, roles=roles, algo=dataclasses.replace(cfg.algo, **algo),
                               rollout=dataclasses.replace(cfg.rollout, max_turns=2),
                               data=dataclasses.replace(cfg.data, env=f"{env}:Two"),
                               trainer=dataclasses.replace(cfg.trainer, total_steps=1, output_dir=str(tmp_path / "run"),
                                                           resume="none", trajectory_sample=1.0))


def _advantages(tmp_path):
    recs = [json.loads(x) for x in (tmp_path / "run" / "trajectories" / "train_step_000001.jsonl").read_text().splitlines()]
    return {role: [t["advantage"] for r in recs for t in r["turns"] if t["role"] == role] for role in ("speaker", "echo")}


def test_per_role_normalisation_reaches_the_update_on_a_shared_adapter(tmp_path):
    """On one shared adapter the speaker's rewards spread 10x the echo's: GRPO's advantages are already per group,
    so the per-role whitening rescales each role to unit spread over its tokens; the trajectory files show each
    role's (row-mean) advantages centred with a similar spread, where without the option they differ."""
    got = {}
    for on in (False, True):
        train.main(_toy_two_roles(tmp_path / str(on), adv_estimator="reinforce++_baseline", norm_adv_by_role=on))
        got[on] = _advantages(tmp_path / str(on))
    sd = {on: {r: torch.tensor(v).std().item() for r, v in a.items()} for on, a in got.items()}
    assert got[True] != got[False]
    assert sd[True]["speaker"] == pytest.approx(sd[True]["echo"], rel=0.5)
    assert all(abs(sum(v) / len(v)) < 0.3 for v in got[True].values())


def test_the_team_mix_reaches_training_and_the_logs_keep_each_roles_own(tmp_path):
    """team_reward_weight 1.0 on the echo: its trajectory rewards are the episodes' team rewards (what trains),
    train/reward/echo the mean of its own; remax with a mix is refused."""
    cfg = _toy_two_roles(tmp_path)
    cfg = dataclasses.replace(cfg, roles=(cfg.roles[0], dataclasses.replace(cfg.roles[1], team_reward_weight=1.0)))
    train.main(cfg)
    recs = [json.loads(x) for x in (tmp_path / "run" / "trajectories" / "train_step_000001.jsonl").read_text().splitlines()]
    echo = [(r["metrics"]["team_reward"], t["reward"]) for r in recs for t in r["turns"] if t["role"] == "echo"]
    assert echo and all(team == got for team, got in echo)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["train/reward/echo"] < 1.0 and sum(t for t, _ in echo) > 0  # own (share of 7s) vs any 7 at all
    with pytest.raises(ConfigError, match="roles.team_reward_weight: remax"):
        dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, adv_estimator="remax")).validate()


def test_judge_rates_by_hand_and_in_every_judge_like_workflow():
    """TPR, TNR and approve rate: right ones 3 approved, 1 rejected, 1 no verdict; wrong ones 1 approved, 2
    rejected, 1 no verdict -> 3/5, 2/4, 4/9. The math team's evaluator, math_tool's verifier and SWE's validator
    log them (aggregate, every step and at eval)."""
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    from envs import judge_counts, judge_rates
    from envs.math_3agent import MathTeamEnv, aggregate as team_aggregate
    from envs.math_tool import MathToolEnv, aggregate as tool_aggregate, scripted_replies
    from helpers import play
    judged = [(True, True)] * 3 + [(False, True), (None, True), (True, False), (False, False), (False, False),
                                   (None, False)]
    rates = judge_rates("j", judge_counts("j", judged))
    assert rates == pytest.approx({"j_tpr": 0.6, "j_tnr": 0.5, "j_approve_rate": 4 / 9})
    task = {"question": "What is 2 + 3?", "answer": "5"}
    eps = []
    for replies in (["\\boxed{5}", "Verdict: Correct"], ["\\boxed{4}", "Verdict: Correct"],
                    ["\\boxed{4}", "Verdict: Incorrect", "\\boxed{4}", "hmm"]):
        env = MathTeamEnv(1)
        eps.append(Episode(0, 0, env, [], play(env, task, replies)[2]))
    # verdicts: right approved; wrong approved; wrong rejected; wrong, no verdict
    agg = team_aggregate(eps)
    assert {k: agg[k] for k in ("evaluator_tpr", "evaluator_tnr", "evaluator_approve_rate")} == \
        pytest.approx({"evaluator_tpr": 1.0, "evaluator_tnr": 1 / 3, "evaluator_approve_rate": 0.5})
    env = MathToolEnv(1)
    m = play(env, {"question": "What is 3 + 4?", "answer": "7"}, scripted_replies({"question": "What is 3 + 4?",
                                                                                "answer": "7"}))[2]
    assert m["verifier_tp"] == 1.0
    assert tool_aggregate([Episode(0, 0, env, [], m)])["verifier_tpr"] == 1.0
