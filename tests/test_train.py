"""train.py end to end on the tiny model: every estimator, checkpoints, exact resume after SIGKILL,
the NaN guard, config handling (2 ranks against 1: tests/test_rl_core.py)."""
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import idle
import learner
import lora
import session
import train
from config import AlgoConfig, Config, ConfigError, load_config_file
from workflows import check_names

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs" / "tiny_math_3agent.py")


def tiny_cfg(tmp_path, **over) -> Config:
    cfg = load_config_file(TINY)
    t = dataclasses.replace(cfg.trainer, output_dir=str(tmp_path / "run"), resume="none", total_steps=2, save_freq=0,
                            test_freq=0, val_before_train=False)
    cfg = dataclasses.replace(cfg, trainer=t)
    for section, kw in over.items():
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **kw)})
    return cfg


def rows(path):
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln]


@pytest.mark.parametrize("algo", [
    dict(adv_estimator="grpo"), dict(adv_estimator="grpo", norm_by_std=False, loss_agg="seq-mean-token-sum-norm"),
    dict(adv_estimator="rloo", kl_coef=0.05, kl_kind="low_var_kl"),
    dict(adv_estimator="reinforce++", kl_coef=0.05, kl_in_reward=True, kl_kind="kl", gamma=0.99),
    dict(adv_estimator="reinforce++_baseline", policy_loss="gspo", clip_low=3e-4, clip_high=4e-4),
    dict(adv_estimator="remax"), dict(adv_estimator="gae", critic_warmup_steps=1, lam=0.95),
    dict(adv_estimator="grpo", kl_coef=0.1, kl_in_reward=True, kl_adaptive=True, kl_target=0.01, ppo_epochs=2,
         mini_batch_size=4, micro_batch_size=2, recompute_old_logprobs="always"),
    dict(adv_estimator="grpo", dynamic_sampling=True),
    dict(adv_estimator="grpo", policy_loss="gspo", kl_coef=0.05, kl_kind="full"),
    dict(adv_estimator="rloo", kl_coef=0.05, kl_kind="full", kl_in_reward=True),
])
def test_estimators_and_modes_run(tmp_path, algo):
    m = train.main(tiny_cfg(tmp_path, algo=algo))
    assert all(math.isfinite(v) for v in m.values() if isinstance(v, float))
    last = rows(tmp_path / "run" / "metrics.jsonl")[-1]
    assert last["step"] == 2 and "train/reward/generator_initial" in last
    if algo.get("dynamic_sampling"):  # a random model scores 0 on math: every group is flat and leaves
        assert last["train/kept_frac"] == 0.0 and "train/grad_norm/generator_initial" not in last
    if algo.get("kl_coef"):
        assert last["train/kl"] > 0  # every KL kind, `full` included, is measured and used
    if algo.get("recompute_old_logprobs") == "always":
        assert last["train/logprob_gap/generator_initial"] < 1e-4  # engine and trainer agree
    if algo.get("kl_adaptive"):
        assert last["train/kl_coef"] != 0.1


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_trainable_false_freezes_a_role(tmp_path, estimator):
    cfg = tiny_cfg(tmp_path, trainer=dict(save_freq=2), algo=dict(adv_estimator=estimator))
    roles = tuple(dataclasses.replace(r, trainable=(r.name != "evaluator_critique")) for r in cfg.roles)
    cfg = dataclasses.replace(cfg, roles=roles)
    train.main(cfg)
    ck = tmp_path / "run" / "checkpoints" / "step_000002" / "adapters"
    ev = load_file(ck / "evaluator_critique" / "adapter_model.safetensors")
    gen = load_file(ck / "generator_initial" / "adapter_model.safetensors")
    assert all(torch.all(v == 0) for k, v in ev.items() if "lora_B" in k)  # frozen: still the identity
    assert any(torch.any(v != 0) for k, v in gen.items() if "lora_B" in k)  # trained


def test_roles_naming_one_adapter_share_it(tmp_path):
    cfg = tiny_cfg(tmp_path, trainer=dict(save_freq=2))
    cfg = dataclasses.replace(cfg, roles=tuple(dataclasses.replace(r, adapter="shared") for r in cfg.roles))
    assert cfg.adapters == ["shared"]
    last = train.main(cfg)
    assert "train/grad_norm/shared" in last and "train/reward/evaluator_critique" in last
    ck = tmp_path / "run" / "checkpoints" / "step_000002" / "adapters"
    assert [p.name for p in ck.iterdir()] == ["shared"]
    with pytest.raises(ValueError, match="disagree on trainable"):
        dataclasses.replace(cfg, roles=(dataclasses.replace(cfg.roles[0], trainable=False),) + cfg.roles[1:]).validate()


def test_per_role_settings_reach_the_optimizer_adapter_and_estimator(tmp_path):
    """The evaluator gets its own lr, rank, alpha, targets, estimator (gae: a critic is built and
    trained on its turns only) and two frozen steps; the other roles keep the shared settings."""
    cfg = tiny_cfg(tmp_path, trainer=dict(total_steps=3, save_freq=3))
    ev = dataclasses.replace(cfg.roles[1], lr=3e-4, rank=4, alpha=2.0, targets=("q_proj", "v_proj"),
                             adv_estimator="gae", frozen_steps=2)
    cfg = dataclasses.replace(cfg, roles=(cfg.roles[0], ev, cfg.roles[2]), data=dataclasses.replace(
        cfg.data, env_kwargs={"evaluator_mixed_groups_only": False}))  # the random model is always wrong: keep its turns
    train.main(cfg)
    r = rows(tmp_path / "run" / "metrics.jsonl")
    assert "train/lr/evaluator_critique" not in r[1] and "train/grad_norm/evaluator_critique" not in r[1]  # frozen
    assert r[2]["train/lr/evaluator_critique"] == pytest.approx(3e-4)
    assert r[2]["train/lr/generator_initial"] == pytest.approx(cfg.algo.lr)
    assert "train/vf_loss/evaluator_critique" in r[0] and "train/vf_loss/generator_initial" not in r[0]
    ck = tmp_path / "run" / "checkpoints" / "step_000003"
    conf = {n: json.loads((ck / "adapters" / n / "adapter_config.json").read_text())
            for n in ("evaluator_critique", "generator_initial")}
    assert (conf["evaluator_critique"]["r"], conf["evaluator_critique"]["lora_alpha"]) == (4, 2.0)
    assert conf["evaluator_critique"]["target_modules"] == ["q_proj", "v_proj"]
    assert (conf["generator_initial"]["r"], conf["generator_initial"]["target_modules"]) == (
        cfg.lora.rank, sorted(cfg.lora.targets))
    assert (ck / "adapters" / "critic").is_dir()
    saved = json.loads((ck / "config.json").read_text())["roles"][1]  # saved with the checkpoint
    assert (saved["lr"], saved["rank"], saved["adv_estimator"], saved["frozen_steps"]) == (3e-4, 4, "gae", 2)


def test_per_role_settings_from_the_cli_and_their_checks():
    cfg = train.cli(["--config", TINY, "--roles.1.lr", "1e-4", "--roles.1.rank", "4", "--roles.1.adv-estimator", "rloo"])
    assert (cfg.roles[1].lr, cfg.roles[1].rank, cfg.roles[1].adv_estimator) == (1e-4, 4, "rloo")
    assert cfg.roles[0].lr is None and cfg.lr_of(cfg.roles[0]) == cfg.algo.lr
    for field, bad in (("lr", float("nan")), ("rank", 0), ("alpha", -1.0), ("targets", ()), ("frozen_steps", -1)):
        roles = (cfg.roles[0], dataclasses.replace(cfg.roles[1], **{field: bad}), cfg.roles[2])
        with pytest.raises(ValueError, match=rf"roles\[1\]\.{field}"):
            dataclasses.replace(cfg, roles=roles).validate()
    shared = tuple(dataclasses.replace(r, adapter="one") for r in cfg.roles)  # roles on one adapter must agree
    with pytest.raises(ValueError, match="disagree on lr"):
        dataclasses.replace(cfg, roles=shared).validate()


def test_outputs_checkpoints_and_plot(tmp_path):
    cfg = tiny_cfg(tmp_path, trainer=dict(total_steps=3, save_freq=1, keep_checkpoints=2, test_freq=3,
                                          val_before_train=True))
    train.main(cfg)
    run = tmp_path / "run"
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step_000002", "step_000003"]  # older ones pruned, no .tmp left
    ad = run / "checkpoints" / "step_000003" / "adapters" / "generator_initial"
    assert (ad / "adapter_config.json").exists() and (ad / "adapter_model.safetensors").exists()
    assert (run / "rewards.png").stat().st_size > 1000
    steps = [r["step"] for r in rows(run / "metrics.jsonl")]
    assert steps == [0, 1, 2, 3, 3]  # val before train, 3 train lines, final val
    r = rows(run / "metrics.jsonl")
    pair = "val/adapter_kl/evaluator_critique~generator_initial"  # fresh adapters are the base; trained ones differ
    assert r[0][pair] == 0 and r[0]["val/adapter_kl/generator_initial~base"] == 0 and r[-1][pair] > 0
    # a standalone eval of an older checkpoint: its results go next to it, the training log is untouched
    log = (run / "metrics.jsonl").read_bytes()
    ev = train.main(dataclasses.replace(cfg, trainer=dataclasses.replace(  # adapter_kl_turns 0: not measured
        cfg.trainer, eval_only=True, resume=str(run / "checkpoints" / "step_000002"), adapter_kl_turns=0)))
    assert "val/final_correct" in ev and "val/evaluator_precision" in ev and not [k for k in ev if "adapter_kl" in k]
    assert (run / "metrics.jsonl").read_bytes() == log
    with pytest.raises(ValueError, match="trainer.adapter_kl_turns"):
        dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, adapter_kl_turns=-1)).validate()
    assert json.loads((run / "checkpoints" / "step_000002" / "eval_metrics.json").read_text())["step"] == 2


def test_nan_loss_skips_step_and_leaves_weights(tiny):
    m, tok = tiny
    lora.add_lora(m, ["a"], rank=4, alpha=8)
    from rollout import Sample
    comp = tok.encode(" the answer is 2")
    steps = [Sample(0, 0, "r", 0, tok.encode("What is 1 + 1?"), comp, [-1.0] * len(comp), reward=1.0)] * 2
    with pytest.raises(ValueError, match="logprobs"):
        learner.AdapterBatch([Sample(0, 0, "r", 0, [1, 2], comp, [-1.0], reward=1.0)], [1.0], tok.pad_token_id, 16)
    rb = learner.AdapterBatch(steps, [1.0, 1.0], tok.pad_token_id, 16)
    cfg = Config(algo=AlgoConfig(mini_batch_size=4, micro_batch_size=2))
    before = [p.detach().clone() for p in lora.adapter_parameters(m, "a")]
    opt = torch.optim.AdamW(lora.adapter_parameters(m, "a"), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    adv = torch.full_like(rb.mask, float("nan"))
    out = learner.policy_update(m, [learner.AdapterUpdate("a", rb, adv, rb.sample_logp, None, opt, sched, torch.Generator().manual_seed(0))], cfg, torch.device("cpu"), 0.0)["a"]
    assert out["skipped"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, lora.adapter_parameters(m, "a")))
    out = learner.policy_update(m, [learner.AdapterUpdate("a", rb, torch.ones_like(rb.mask), rb.sample_logp, None, opt, sched, torch.Generator().manual_seed(0))], cfg, torch.device("cpu"), 0.0)["a"]
    assert out["skipped"] == 0 and not all(torch.equal(a, b) for a, b in zip(before, lora.adapter_parameters(m, "a")))


def _run(args, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), "--config", TINY, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _comparable(path):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows(path)]


def test_sigkill_and_resume_reproduces_the_uninterrupted_run(tmp_path):
    common = ["--trainer.total-steps", "4", "--trainer.save-freq", "1", "--trainer.test-freq", "2"]
    ref = _run(common + ["--trainer.output-dir", str(tmp_path / "a")])
    out, _ = ref.communicate(timeout=600)
    assert ref.returncode == 0, out[-3000:]
    # the same run, killed with SIGKILL as soon as the step-2 checkpoint exists
    p = _run(common + ["--trainer.output-dir", str(tmp_path / "b")])
    ck = tmp_path / "b" / "checkpoints" / "step_000002"
    deadline = time.time() + 600
    while not ck.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert p.poll() is None, "run ended before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    # a half-written later checkpoint must not be picked up
    (tmp_path / "b" / "checkpoints" / "step_000003.tmp").mkdir(exist_ok=True)
    r = _run(common + ["--trainer.output-dir", str(tmp_path / "b")])
    out, _ = r.communicate(timeout=600)
    assert r.returncode == 0, out[-3000:]
    assert "resumed from" in out
    a, b = _comparable(tmp_path / "a" / "metrics.jsonl"), _comparable(tmp_path / "b" / "metrics.jsonl")
    assert [x["step"] for x in a] == [x["step"] for x in b]
    assert a == b
    fa = load_file(tmp_path / "a/checkpoints/step_000004/adapters/generator_initial/adapter_model.safetensors")
    fb = load_file(tmp_path / "b/checkpoints/step_000004/adapters/generator_initial/adapter_model.safetensors")
    assert all(torch.equal(fa[k], fb[k]) for k in fa)


def test_config_cli_and_errors(tmp_path):
    cfg = train.cli(["--config", TINY, "--algo.adv-estimator", "rloo", "--trainer.total-steps", "7"])
    assert cfg.algo.adv_estimator == "rloo" and cfg.trainer.total_steps == 7 and cfg.roles[0].max_tokens == 12
    with pytest.raises(ValueError, match="config field algo.lr"):
        dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, lr=0)).validate()
    with pytest.raises(ValueError, match="rollout.num_chains"):
        learner.check_names(dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, num_chains=1)))
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(TypeError, match="must define `config"):
        load_config_file(str(bad))
    with pytest.raises(FileNotFoundError):
        load_config_file(str(tmp_path / "missing.py"))
    for path, say in ((tmp_path / "missing.py", "does not exist"), (bad, "must define `config")):
        r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", str(path)], capture_output=True, text=True,
                           timeout=120)  # one line naming the file, not a 20-line traceback
        want = (f"error: --config: config file {path} does not exist" if say == "does not exist"
                else f"error: --config: {path} must define `config = Config(...)`, found NoneType")
        assert r.returncode != 0 and r.stderr.strip().splitlines() == [want], r.stderr
    with pytest.raises(ValueError, match="config field trainer.resume"):
        dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, resume=str(tmp_path))).validate()
    assert train.cli([f"--config={TINY}", "--trainer.total-steps", "3"]).trainer.total_steps == 3
    h = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and "--config PATH" in h.stdout and "--algo.adv-estimator" in h.stdout


def test_a_broken_init_from_adapter_or_a_checkpoint_of_other_roles_is_one_line_before_anything_is_written(tmp_path):
    """init_from weights that do not load (here NaN: the run started, logged its step-0 eval and crashed in the
    sampler) are a ConfigError naming the file before the engine runs (train.py prints it as one line); so is an
    eval of a checkpoint whose adapters are not the config's roles' (a FileNotFoundError from deep in loading)."""
    import lora
    from safetensors.torch import load_file, save_file
    import eval as eval_
    m, _ = __import__("model").load_model("tiny", seed=0)
    lora.add_lora(m, ["x"], rank=8, alpha=16, targets=load_config_file(TINY).lora.targets)
    lora.save_adapter(m, "x", tmp_path / "ad")
    w = tmp_path / "ad" / "adapter_model.safetensors"
    t = load_file(str(w))
    t[sorted(t)[-1]][0, 0] = float("nan")
    save_file(t, str(w))
    cfg = tiny_cfg(tmp_path, trainer=dict(val_before_train=True, test_freq=1))
    cfg = dataclasses.replace(cfg, roles=(dataclasses.replace(cfg.roles[0], init_from=str(tmp_path / "ad")),
                                          *cfg.roles[1:]))
    with pytest.raises(ConfigError, match=f"config field init_from of generator_initial: {w}: tensor .* holds NaN/inf"):
        train.main(cfg)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    run = tmp_path / "r2"
    train.main(tiny_cfg(tmp_path, trainer=dict(output_dir=str(run), total_steps=1, save_freq=1)))
    ckpt = run / "checkpoints" / "step_000001"
    with pytest.raises(SystemExit, match=f"error: {ckpt} holds no adapter speaker .it holds evaluator_critique, "
                                         "generator_initial, generator_refinement.: a checkpoint of another config's roles"):
        eval_.main(["--config", str(ROOT / "configs" / "tiny_toy.py"), "--checkpoint", str(ckpt), "--out", str(tmp_path / "ev")])


def test_a_role_frozen_when_saved_resumes_trainable_with_a_fresh_optimizer(tmp_path, capsys):
    """trainer.resume_if_changed with a role made trainable since the checkpoint: it holds no optimizer for that
    adapter (a KeyError in load_checkpoint): the role starts with a fresh one, said on the console, and trains."""
    cfg = tiny_cfg(tmp_path, trainer=dict(total_steps=1, save_freq=1))
    frozen = dataclasses.replace(cfg, roles=(cfg.roles[0], dataclasses.replace(cfg.roles[1], trainable=False),
                                             *cfg.roles[2:]))
    train.main(frozen)
    train.main(dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, total_steps=2, resume="auto",
                                                                    resume_if_changed=True)))
    assert f"holds no optimizer of adapter {cfg.roles[1].name} (not trained when saved): it starts afresh" in \
        capsys.readouterr().out
    assert [r["step"] for r in rows(tmp_path / "run" / "metrics.jsonl")] == [1, 2]


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_cfg(tmp_path, trainer=dict(total_steps=1, save_freq=1, logger=("console", "wandb"), resume="auto"))
    train.main(cfg)
    first = torch.load(tmp_path / "run/checkpoints/step_000001/trainer_state.pt", weights_only=False)["wandb_id"]
    train.main(dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, total_steps=2)))
    second = torch.load(tmp_path / "run/checkpoints/step_000002/trainer_state.pt", weights_only=False)["wandb_id"]
    assert first and first == second
    runs = sorted(p.name for p in (tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.endswith(first) for r in runs)  # two sessions of ONE run id


def test_a_new_workflow_is_two_files_outside_the_repo(tmp_path):
    """An env file and a config file in a directory of their own: nothing in troupe is edited."""
    (tmp_path / "haiku.py").write_text('''
from envs import Prompt

class HaikuEnv:
    roles = ("poet", "judge")

    def __init__(self, letter="a"):
        self.letter = letter

    def reset(self, task):
        self.r = []
        return Prompt("poet", [{"role": "user", "content": task["question"]}])

    def step(self, reply):
        self.r.append(reply.count(self.letter) / max(1, len(reply)))
        return Prompt("judge", [{"role": "user", "content": "Judge: " + reply}]) if len(self.r) == 1 else None

    def turn_rewards(self):
        return self.r

    def metrics(self):
        return {"team_reward": self.r[0], "letters": self.r[0]}

def load_tasks(spec):
    return [{"question": f"Write about {w}."} for w in ("rain", "snow", "wind", "sun")]
''')
    (tmp_path / "haiku_config.py").write_text(f'''
from config import Config, DataConfig, RoleConfig, RolloutConfig, TrainerConfig
config = Config(roles=(RoleConfig("poet", max_tokens=6), RoleConfig("judge", max_tokens=4)),
                data=DataConfig(env="{tmp_path / "haiku.py"}:HaikuEnv", env_kwargs={{"letter": "7"}},
                                train_files="any", val_files="any", batch_size=2),
                rollout=RolloutConfig(num_chains=2, progress=False),
                trainer=TrainerConfig(total_steps=2, test_freq=2, save_freq=2, output_dir="{tmp_path / "run"}"))
''')
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", str(tmp_path / "haiku_config.py"),
                        "--data.env-kwargs.letter", "e"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    last = rows(tmp_path / "run" / "metrics.jsonl")[-1]
    assert "val/reward/poet" in last and "val/letters" in last
    assert sorted(p.name for p in (tmp_path / "run/checkpoints/step_000002/adapters").iterdir()) == ["judge", "poet"]
    saved = json.loads((tmp_path / "run/checkpoints/step_000002/config.json").read_text())
    assert saved["data"]["env_kwargs"] == {"letter": "e"}  # the CLI override reached the env's constructor
    with pytest.raises(ValueError, match="config field data.env: unknown workflow 'haiku'"):
        check_names(dataclasses.replace(load_config_file(TINY), data=dataclasses.replace(load_config_file(TINY).data, env="haiku")))


def test_a_rerun_with_another_config_does_not_silently_resume(tmp_path):
    cfg = tiny_cfg(tmp_path, trainer=dict(total_steps=1, save_freq=1, resume="auto"))
    train.main(cfg)
    changed = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, lr=0.5),
                                  trainer=dataclasses.replace(cfg.trainer, total_steps=2))
    with pytest.raises(ValueError, match=r"written with another config \(algo.lr: 0.001 -> 0.5\)"):
        train.main(changed)
    assert [r["step"] for r in rows(tmp_path / "run" / "metrics.jsonl")] == [1]  # nothing ran, nothing lost
    train.main(dataclasses.replace(changed, trainer=dataclasses.replace(changed.trainer, resume_if_changed=True)))
    assert [r["step"] for r in rows(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
    train.main(dataclasses.replace(changed, trainer=dataclasses.replace(changed.trainer, total_steps=3)))  # length only
    assert [r["step"] for r in rows(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3]


def test_init_from_starts_a_role_from_a_saved_adapter(tmp_path):
    """A role's adapter starts from a PEFT directory (sft.py writes them): exactly its weights, its own
    rank, no dropout; bad directories are config errors naming the field."""
    from model import load_model
    cfg = tiny_cfg(tmp_path)
    m, _ = load_model("tiny")
    lora.add_lora(m, ["sft"], rank=4, alpha=8, dropout=0.1, targets=cfg.lora.targets, seed=3)
    with torch.no_grad():
        for p in lora.adapter_parameters(m, "sft"):
            p.add_(0.05)
    lora.save_adapter(m, "sft", tmp_path / "sft")
    saved = load_file(tmp_path / "sft" / "adapter_model.safetensors")
    roles = (dataclasses.replace(cfg.roles[0], init_from=str(tmp_path / "sft")),) + cfg.roles[1:]
    run, _ = session.build(dataclasses.replace(cfg, roles=roles), None)
    name = cfg.adapter_of(roles[0])
    got = lora.adapter_state_dict(run.model, name)
    assert got.keys() == saved.keys() and all(torch.equal(got[k], saved[k]) for k in saved)
    assert next(iter(got.values())).shape[0] == 4 and cfg.lora.rank != 4
    assert all(m.dropout_p[name] == 0.0 for m in lora.lora_modules(run.model).values())
    for bad_dir, msg in ((tmp_path / "nope", "is not a PEFT adapter directory"),):
        bad = (dataclasses.replace(cfg.roles[0], init_from=str(bad_dir)),) + cfg.roles[1:]
        with pytest.raises(ConfigError, match=r"roles\[0\]\.init_from: .*" + msg):
            dataclasses.replace(cfg, roles=bad).validate()
    other = dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, targets=("q_proj",)), roles=roles)
    with pytest.raises(ConfigError, match=r"roles\[0\]\.init_from: .* the role's targets are"):
        other.validate()


@pytest.mark.parametrize("kind, in_reward, fused", [("low_var_kl", False, True), ("full", False, False),
                                                    ("kl", True, True)])
def test_kl_ref_init_measures_the_kl_to_the_init_from_adapter(tmp_path, kind, in_reward, fused):
    """algo.kl_ref init: the KL of a role started from an adapter is measured to that adapter (0 before it
    moves), not to the base (> 0 from step 1), in the loss and in the reward, fused or not; the reference
    stays frozen, is never saved, a resumed run rebuilds it from init_from, not from the checkpoint, and
    eval.py's build has none."""
    from model import load_model
    m, _ = load_model("tiny")
    cfg = tiny_cfg(tmp_path, trainer=dict(total_steps=1, save_freq=1),
                   algo=dict(kl_coef=0.1, kl_kind=kind, kl_in_reward=in_reward, fused_update=fused))
    lora.add_lora(m, ["sft"], rank=cfg.lora.rank, alpha=cfg.lora.alpha, targets=cfg.lora.targets, seed=3)
    with torch.no_grad():
        for p in lora.adapter_parameters(m, "sft"):
            p.add_(0.05)
    lora.save_adapter(m, "sft", tmp_path / "sft")
    saved = load_file(tmp_path / "sft" / "adapter_model.safetensors")
    cfg = dataclasses.replace(cfg, roles=(dataclasses.replace(cfg.roles[0], init_from=str(tmp_path / "sft")),)
                              + cfg.roles[1:])
    gen = cfg.adapter_of(cfg.roles[0])
    keys = ["train/kl/"] + (["train/kl_loss/"] if not in_reward else [])  # kl_loss: the loss's KL, the policy's logits
    kl = {}
    for ref in ("base", "init"):
        c = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, kl_ref=ref),
                                trainer=dataclasses.replace(cfg.trainer, output_dir=str(tmp_path / ref)))
        last = train.main(c)
        kl[ref] = [last[k + gen] for k in keys]
    assert all(v == pytest.approx(0.0, abs=1e-5) for v in kl["init"]) and all(v > 1e-3 for v in kl["base"]), kl
    ck = tmp_path / "init" / "checkpoints" / "step_000001"
    assert sorted(p.name for p in (ck / "adapters").iterdir()) == sorted(cfg.adapters)  # no '@init' saved
    c = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, kl_ref="init"))
    run, _ = session.build(c, ck)
    ref = lora.adapter_state_dict(run.model, run.refs[gen])
    assert all(torch.equal(ref[k], saved[k]) for k in saved)  # the start, not the checkpoint
    assert not all(torch.equal(v, saved[k]) for k, v in lora.adapter_state_dict(run.model, gen).items())  # trained
    assert not any(p.requires_grad for p in lora.adapter_parameters(run.model, run.refs[gen]))
    assert set(run.refs) == {gen}  # fresh adapters keep the base, their start
    assert session.build(c, ck, train=False)[0].refs == {}  # eval.py, play.py
    with pytest.raises(ConfigError, match="algo.kl_ref: 'init' sets the KL's reference, but algo.kl_coef is 0"):
        dataclasses.replace(c, algo=dataclasses.replace(c.algo, kl_coef=0.0)).validate()
    c.validate()  # sft.py and eval.py --base validate a recipe's config before its roles have init_from
    for roles in (tuple(dataclasses.replace(r, init_from=None) for r in c.roles),
                  (dataclasses.replace(c.roles[0], trainable=False),) + c.roles[1:]):
        with pytest.raises(ConfigError, match="algo.kl_ref: 'init' changes nothing here: no trainable role has"):
            train.main(dataclasses.replace(c, roles=roles))


@pytest.mark.parametrize("fused", [True, False])
def test_fused_update_option_reaches_the_loop(tmp_path, monkeypatch, fused):
    """algo.fused_update: one policy_update over every busy adapter, or one call per adapter (the
    weights are the same either way: tests/test_rl_core.py checks that)."""
    calls = []
    real = learner.policy_update

    def spy(model, parts, *a, **k):
        calls.append(sorted(p.adapter for p in parts))
        return real(model, parts, *a, **k)
    monkeypatch.setattr(learner, "policy_update", spy)
    train.main(tiny_cfg(tmp_path, algo=dict(fused_update=fused), trainer=dict(total_steps=1)))
    adapters = sorted({x for c in calls for x in c})
    assert len(adapters) >= 2
    assert calls == ([adapters] if fused else [[x] for x in adapters])


def test_the_smoke_config_updates_every_adapter(tmp_path):
    """configs/tiny_math_3agent.py (the README's smoke run): every adapter's weights move over its steps. With
    the math team's label filter on, the random model's evaluator groups (all solutions wrong) were all left
    out and its adapter never moved; the config turns the filter off."""
    cfg = tiny_cfg(tmp_path, trainer=dict(save_freq=2))
    assert cfg.data.env_kwargs.get("evaluator_mixed_groups_only") is False
    train.main(cfg)
    ck = tmp_path / "run" / "checkpoints" / "step_000002" / "adapters"
    for adapter in cfg.adapters:
        w = load_file(ck / adapter / "adapter_model.safetensors")
        assert any(torch.any(v != 0) for k, v in w.items() if "lora_B" in k), adapter  # B starts at 0


def test_a_role_that_gets_no_signal_is_named_on_the_console(tmp_path, capsys):
    """A trainable role whose turns a filter drops, or whose advantages are all 0, gets a console line naming
    it and the reason at every such step, train/idle/<role> = 1, and after 3 steps in a row what to change; a
    role the filter starves does not move (the line is no false alarm)."""
    cfg = tiny_cfg(tmp_path, trainer=dict(total_steps=3, save_freq=3),
                   data=dict(env_kwargs={"evaluator_mixed_groups_only": True}))
    train.main(cfg)
    out = capsys.readouterr().out
    for step in (1, 2, 3):
        assert (f"[step {step}] WARNING: role evaluator_critique gets no learning signal this step: the label filter "
                f"left out all 8 of its turns") in out
        assert f"[step {step}] WARNING: role generator_initial gets no learning signal this step: every advantage" in out
    assert "(3 steps in a row; to change it: raise rollout.num_chains" in out and \
        "evaluator_mixed_groups_only false" in out.split("[step 3] WARNING: role evaluator_critique")[1].split("\n")[0]
    assert "in a row" not in out.split("[step 3]")[0]  # not before the third
    last = rows(tmp_path / "run" / "metrics.jsonl")[-1]
    assert last["train/idle/evaluator_critique"] == 1.0 and last["train/dropped_by_labels/evaluator_critique"] == 1.0
    ev = load_file(tmp_path / "run" / "checkpoints" / "step_000003" / "adapters" / "evaluator_critique" /
                   "adapter_model.safetensors")
    assert all(torch.all(v == 0) for k, v in ev.items() if "lora_B" in k)  # it really did not learn


def test_a_role_whose_advantages_cancel_on_identical_turns_is_named(tmp_path):
    """Four chains of one group write the same reply (a near-deterministic role) and later roles make their
    rewards differ: the advantages are not 0, but on one sequence they sum to 0, and so does the gradient. The
    role is idle ("identical", with advice); one reply that differs, or copies whose sum is not 0, is signal."""
    from rollout import Sample
    cfg = tiny_cfg(tmp_path)
    role = cfg.roles[0].name

    def turns(advs, replies=None):
        return [Sample(0, c, role, 0, [1, 2, 3], list(replies[c] if replies else [7, 8]), [0.0, 0.0], advantage=a)
                for c, a in enumerate(advs)]
    metrics = {f"train/turns/{r.name}": 4.0 for r in cfg.roles}
    others = [Sample(0, c, r.name, 1, [1], [c], [0.0], advantage=float(c) - 1.5) for r in cfg.roles[1:] for c in range(4)]
    stalled = idle.idle_roles(cfg, turns([1.0, -1.0, 0.5, -0.5]) + others, metrics, 1)
    assert list(stalled) == [role] and stalled[role][0] == "identical" and "cancel" in stalled[role][1]
    assert "temperature" in idle.IDLE_ADVICE[stalled[role][0]]
    assert role not in idle.idle_roles(cfg, turns([1.0, -1.0, 0.5, -0.5], [[7, 8]] * 3 + [[7, 9]]) + others,
                                          metrics, 1)
    assert role not in idle.idle_roles(cfg, turns([1.0, -1.0, 0.5, -0.25]) + others, metrics, 1)
    assert idle.idle_roles(cfg, turns([0.0] * 4) + others, metrics, 1)[role][0] == "zero_advantage"


def test_a_role_with_signal_is_not_named(tmp_path, capsys):
    """The toy speaker (paid for its share of "7"s: rewards differ within a group) learns: no warning, idle 0."""
    cfg = load_config_file(str(ROOT / "configs" / "tiny_toy.py"))
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, total_steps=2, output_dir=str(tmp_path),
                                                               resume="none"))
    train.main(cfg)
    assert "gets no learning signal" not in capsys.readouterr().out
    assert [r["train/idle/speaker"] for r in rows(tmp_path / "metrics.jsonl")] == [0.0, 0.0]


def test_a_role_not_due_to_train_is_not_called_idle(tmp_path, capsys):
    """A role outside its train_windows does not train by design: no warning, no train/idle for it that step."""
    cfg = tiny_cfg(tmp_path, trainer=dict(total_steps=1), data=dict(env_kwargs={"evaluator_mixed_groups_only": True}))
    cfg = dataclasses.replace(cfg, roles=(cfg.roles[0], dataclasses.replace(cfg.roles[1], train_windows=((2, 2),)),
                                          cfg.roles[2]))
    train.main(cfg)
    assert "role evaluator_critique gets no learning signal" not in capsys.readouterr().out
    last = rows(tmp_path / "run" / "metrics.jsonl")[-1]
    assert "train/idle/evaluator_critique" not in last and last["train/idle/generator_initial"] == 1.0
