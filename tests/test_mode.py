"""train.py --mode both: SFT (sft.py) then RL from its adapters, from one config."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import train
from config import ConfigError, load_config_file
from workflows import check_names

ROOT = Path(__file__).resolve().parent.parent


def test_mode_both_runs_sft_then_rl_from_its_adapters(tmp_path, capsys):
    sft_file = tmp_path / "sft_cfg.py"
    sft_file.write_text("from sft import SFTConfig\n"
                        "config = SFTConfig(teacher='math', teacher_tasks=4, lr=1e-3, progress=False)\n")
    cfg = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    roles = (cfg.roles[0], dataclasses.replace(cfg.roles[1], trainable=False), cfg.roles[2])  # frozen: stays = SFT's
    cfg = dataclasses.replace(cfg, roles=roles, mode="both", sft_config=str(sft_file),
                              trainer=dataclasses.replace(cfg.trainer, output_dir=str(tmp_path / "run"), resume="none",
                                                          total_steps=1, test_freq=0, save_freq=1,
                                                          val_before_train=False))
    train.main(cfg)
    sft_dir = tmp_path / "run" / "sft"
    assert f"frozen from {sft_dir / 'evaluator_critique'}," in capsys.readouterr().out  # the start line says so
    summary = json.loads((sft_dir / "summary.json").read_text())
    assert summary["teacher"]["teacher:perturbed"] == 4 and summary["losses"]["evaluator_critique"]["steps"] >= 1
    assert list(summary["adapters"]) == ["evaluator_critique"]  # only the teacher's role had examples
    ck = tmp_path / "run" / "checkpoints" / "step_000001"
    saved = json.loads((ck / "config.json").read_text())
    assert [r["init_from"] for r in saved["roles"]] == [None, str(sft_dir / "evaluator_critique"), None]
    a, b = (load_file(str(d / "adapter_model.safetensors")) for d in (sft_dir / "evaluator_critique",
                                                                      ck / "adapters" / "evaluator_critique"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)  # RL started from exactly what SFT saved
    assert [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1]
    mtime = (sft_dir / "summary.json").stat().st_mtime_ns
    train.main(dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, total_steps=2, resume="auto")))
    assert (sft_dir / "summary.json").stat().st_mtime_ns == mtime  # resuming does not redo the SFT
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2
    # another seed is another tiny base: the SFT it holds is not this one's, and it is neither reused
    # (RL from adapters trained on another base) nor overwritten
    files = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    other = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, seed=1, resume="none"))
    with pytest.raises(ConfigError, match="config field sft_config: the SFT stage"):
        train.main(other)
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == files


def test_mode_sft_needs_an_sft_config():
    cfg = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    with pytest.raises(ConfigError, match="config field sft_config"):
        dataclasses.replace(cfg, mode="sft").validate()


def test_calculator_as_the_online_reward(tmp_path):
    from envs.toy import target_fraction
    from rewards.calculator import RewardCalculator
    cfg = load_config_file(str(ROOT / "configs" / "tiny_toy.py"))
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, reward="calculator"),
                              trainer=dataclasses.replace(cfg.trainer, output_dir=str(tmp_path), resume="none",
                                                          total_steps=1, trajectory_sample=1.0))
    train.main(cfg)
    recs = [json.loads(x) for x in (tmp_path / "trajectories" / "train_step_000001.jsonl").read_text().splitlines()]
    turns = [t for r in recs for t in r["turns"]]
    assert all(t["env_reward"] == pytest.approx(target_fraction(t["reply"])) for t in turns)  # the env's, kept
    calc = RewardCalculator.from_config(cfg)
    for r in recs:  # what the roles trained on: the calculator's weighted reward
        assert [t["reward"] for t in r["turns"]] == pytest.approx([s.weighted for s in calc.score_episode(r)])
    env = [t["env_reward"] for t in turns]
    assert max(env) > 0 and [t["reward"] for t in turns] != pytest.approx(env)  # not a no-op
    with pytest.raises(ConfigError, match=r"data\.reward_weights: unknown reward component 'speed'"):
        check_names(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, reward_weights={"speed": 1.0})))
    with pytest.raises(ConfigError, match=r"data\.reward: remax"):
        dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, adv_estimator="remax")).validate()
