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
from envs import Prompt
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


def test_group_whiten_gives_a_flat_groups_turn_the_steps_token_mean_and_scales_a_sparse_role_up():
    """What algo.norm_adv_by_role's docstring warns of, by hand. One role, one group whose turns got +1 (2 tokens) and
    -1 (4 tokens), and a turn of a flat group (advantage 0, 3 tokens). Token mean -2/9, unbiased var (6 - 9 * 4/81)
    / 8 = 0.6944: the flat turn gets (0 + 2/9) / 0.8333 = +0.2667, and the +1 turn (1 + 2/9) / 0.8333 = 1.4667."""
    x = torch.tensor([[1.0, 1.0, 0.0, 0.0], [-1.0, -1.0, -1.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    out = ppo.group_whiten(x, mask, torch.zeros(3, dtype=torch.long), 1)
    sd = math.sqrt((6 - 9 * (2 / 9) ** 2) / 8 + 1e-8)
    assert out[2, :3].tolist() == pytest.approx([(2 / 9) / sd] * 3, abs=1e-5) and out[2, :3].min() > 0.26
    assert out[0, 0].item() == pytest.approx((1 + 2 / 9) / sd, abs=1e-5) and out[0, 0] > 1.4


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


# ------------------------------------------------------------------------- tree sampling (AT-GRPO)


class TreeEnv:
    """The asker's turn, then a set of two (the asker goes on in its own chat, the answerer starts one), then done.
    Each turn is paid the length of its reply as soon as it is said."""
    roles = ("asker", "answerer")
    rewards_so_far = True
    fail_next = 0  # a test makes this many steps raise
    resets = 0

    def reset(self, task):
        TreeEnv.resets += 1
        self.said = []
        self.chat = [{"role": "user", "content": f"count from {TreeEnv.resets}"}]  # each reset its own prompt
        return Prompt("asker", list(self.chat))

    def step(self, reply):
        if TreeEnv.fail_next:
            TreeEnv.fail_next -= 1
            raise RuntimeError("a broken candidate")
        replies = reply if isinstance(reply, list) else [reply]
        self.said += replies
        if len(self.said) == 3:
            return None
        self.chat += [{"role": "assistant", "content": replies[0]}, {"role": "user", "content": "more"}]
        return [Prompt("asker", list(self.chat)), Prompt("answerer", [{"role": "user", "content": "answer " + replies[0]}])]

    def turn_rewards(self):
        return [float(len(r)) for r in self.said]

    def metrics(self):
        return {"path_length": float(sum(len(r) for r in self.said))}


def _tree_run(tiny, tree, chains=3, env=TreeEnv):
    from rollout import RoleSpec, SamplingParams, TorchEngine, run_episodes
    m, tok = tiny
    sp = SamplingParams(max_new_tokens=6, stop_token_ids=[], seed=0)
    return run_episodes(TorchEngine(m, tok), tok, env, tasks=[{}], roles={r: RoleSpec(None, sp) for r in TreeEnv.roles},
                        num_chains=chains, max_turns=3, tree=tree)


def test_tree_sampling_by_hand(tiny):
    """Three chains of one task, reset once (the env's prompt names its reset). Node 1: the three askers'
    candidates share one prompt, each is paid its reply's
    length, the longest (the first on a tie) is tree_best. Node 2: every chain's two prompts are the same ids, the
    asker's continuing the node-1 best's sampled ids token for token; the best member is the largest sum over the
    set; every chain ends on the chosen path (its metrics the best texts' lengths). Without tree the node-2
    prompts differ between chains."""
    before = TreeEnv.resets
    _, eps = _tree_run(tiny, tree=True)
    assert TreeEnv.resets == before + 1
    n1 = [e.samples[0] for e in eps]
    assert len({tuple(s.prompt_ids) for s in n1}) == 1
    assert [s.reward for s in n1] == [float(len(s.text)) for s in n1]
    want1 = max(range(3), key=lambda c: (len(n1[c].text), -c))
    assert [s.info["tree_best"] for s in n1] == [c == want1 for c in range(3)]
    n2 = [e.samples[1:] for e in eps]
    for pos in range(2):
        assert len({tuple(ss[pos].prompt_ids) for ss in n2}) == 1
    best1 = n1[want1]
    assert n2[0][0].prompt_ids[:len(best1.prompt_ids) + len(best1.completion_ids)] == best1.prompt_ids + best1.completion_ids
    sums = [len(a.text) + len(b.text) for a, b in n2]
    want2 = max(range(3), key=lambda c: (sums[c], -c))
    assert [[s.info["tree_best"] for s in ss] for ss in n2] == [[c == want2] * 2 for c in range(3)]
    assert all(s.reward == float(len(s.text)) for ss in n2 for s in ss)
    assert [e.metrics for e in eps] == [{"path_length": float(len(best1.text) + sums[want2]), "candidate_errors": 0.0}] * 3
    assert all(e.scored and e.error is None for e in eps)
    _, plain = _tree_run(tiny, tree=False)
    assert len({tuple(e.samples[0].prompt_ids) for e in plain}) == 3 and not plain[0].scored  # three resets
    assert len({tuple(e.samples[1].prompt_ids) for e in plain}) > 1


def test_tree_sampling_a_broken_candidate_earns_zero_and_its_chain_goes_on(tiny):
    """The first step of node 1 (chain 0's) raises: that candidate earns 0 with the error noted, is not the best,
    and chain 0 goes on from the best one's state to the end. An env without rewards_so_far is refused."""
    TreeEnv.fail_next = 1
    try:
        _, eps = _tree_run(tiny, tree=True)
    finally:
        TreeEnv.fail_next = 0
    s = eps[0].samples[0]
    assert s.reward == 0.0 and s.info["env_error"] == "RuntimeError: a broken candidate" and s.info["tree_best"] is False
    assert eps[0].error is None and len(eps[0].samples) == 3
    assert eps[0].metrics == {**eps[1].metrics, "candidate_errors": 1.0} and eps[1].metrics["candidate_errors"] == 0.0

    class Unpaid(TreeEnv):
        rewards_so_far = False
    from rollout import RoleSpec, SamplingParams, TorchEngine, run_episodes
    m, tok = tiny
    with pytest.raises(ValueError, match="rewards_so_far"):
        run_episodes(TorchEngine(m, tok), tok, Unpaid, [{}], {r: RoleSpec(None, SamplingParams(max_new_tokens=2))
                                                               for r in TreeEnv.roles}, num_chains=2, tree=True)


class UnpaidLast(TreeEnv):
    def turn_rewards(self):
        if len(self.said) == 3:
            raise ValueError("no pay for the last set")
        return super().turn_rewards()


def test_tree_sampling_when_every_candidate_fails_the_chains_end_and_keep_earlier_pay(tiny):
    """Node 2's rewards raise in every chain: the chains end there with the error (none goes on alone), the node-2
    turns earn 0, and node 1's candidates keep the pay that chose the best."""
    _, eps = _tree_run(tiny, tree=True, env=UnpaidLast)
    assert all(e.error == "ValueError: no pay for the last set" for e in eps)
    assert [e.samples[0].reward for e in eps] == [float(len(e.samples[0].text)) for e in eps]
    assert sum(e.samples[0].info["tree_best"] for e in eps) == 1
    assert all(s.reward == 0.0 and "tree_best" not in s.info for e in eps for s in e.samples[1:])
    assert all(e.metrics == {"env_error": 1.0, "candidate_errors": 1.0} for e in eps)


def test_tree_sampling_config_rules(tmp_path):
    """Each rule is one line naming rollout.tree_sampling: group_by_turn off, one chain, merge_turns, remax, a team
    reward mix, the calculator, a workflow that pays only at the end (split_info)."""
    from workflows import check_roles
    cfg = _toy_two_roles(tmp_path, group_by_turn=True)
    ok = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, tree_sampling=True))
    ok.validate()
    check_roles(ok)
    R = dataclasses.replace
    for bad, why in ((R(ok, algo=R(ok.algo, group_by_turn=False)), "algo.group_by_turn"),
                     (R(ok, rollout=R(ok.rollout, num_chains=1)), "num_chains >= 2"),
                     (R(ok, rollout=R(ok.rollout, merge_turns=True)), "merge_turns"),
                     (R(ok, algo=R(ok.algo, adv_estimator="remax")), "remax"),
                     (R(ok, roles=(ok.roles[0], R(ok.roles[1], team_reward_weight=0.5))), "team_reward_weight"),
                     (R(ok, data=R(ok.data, reward="calculator")), "data.reward=env")):
        with pytest.raises(ConfigError, match=r"^config field rollout\.tree_sampling: .*" + why):
            bad.validate()
    split = load_config_file(str(ROOT / "configs" / "tiny_split_info.py"))
    split = R(split, algo=R(split.algo, group_by_turn=True), rollout=R(split.rollout, tree_sampling=True,
                                                                         num_chains=max(2, split.rollout.num_chains)))
    with pytest.raises(ConfigError, match=r"rollout\.tree_sampling: .*rewards_so_far"):
        check_roles(split.validate())


def test_tree_sampling_reaches_training(tmp_path):
    """train.py with rollout.tree_sampling: in the step's trajectory file every chain of a task shows the echo the
    same prompt, one speaker candidate is tree_best, the best paid (the first on a tie), and each speaker turn is
    paid its own reply's 7s."""
    cfg = _toy_two_roles(tmp_path, group_by_turn=True)
    train.main(dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, tree_sampling=True)))
    recs = [json.loads(x) for x in (tmp_path / "run" / "trajectories" / "train_step_000001.jsonl").read_text().splitlines()]
    by_task = {}
    for r in recs:
        by_task.setdefault(r["task_id"], []).append(r)
    assert by_task and all(len(rs) == cfg.rollout.num_chains for rs in by_task.values())
    for rs in by_task.values():
        echo = {tuple(r["turns"][1]["prompt_ids"]) for r in rs}
        best = [r["turns"][0] for r in rs if r["turns"][0]["tree_best"]]
        paid = [r["turns"][0]["reward"] for r in sorted(rs, key=lambda r: r["episode_id"])]
        assert len(echo) == 1 and [r["turns"][0]["tree_best"] for r in sorted(rs, key=lambda r: r["episode_id"])] == \
            [i == paid.index(max(paid)) for i in range(len(paid))]
        for r in rs:
            t = r["turns"][0]["reply"]
            assert r["turns"][0]["reward"] == pytest.approx(10.0 * t.count("7") / max(len(t), 1))
