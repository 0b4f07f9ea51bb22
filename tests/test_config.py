"""Config.validate names the bad field before anything expensive happens."""
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import ConfigError, RoleConfig, load_config_file

ROOT = Path(__file__).resolve().parent.parent
BASE = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))


def with_(section, **kw):
    return dataclasses.replace(BASE, **{section: dataclasses.replace(getattr(BASE, section), **kw)})


@pytest.mark.parametrize("cfg, field", [
    (with_("algo", lr=float("nan")), "algo.lr"), (with_("algo", lr=float("inf")), "algo.lr"),
    (with_("algo", lr=-1e-3), "algo.lr"), (with_("trainer", keep_checkpoints=-1), "trainer.keep_checkpoints"),
    (with_("trainer", keep_checkpoints=0), "trainer.keep_checkpoints"), (with_("trainer", total_steps=0), "trainer.total_steps"),
    (with_("rollout", max_batch_size=0), "rollout.max_batch_size"), (with_("rollout", top_p=0.0), "rollout.top_p"),
    (with_("rollout", top_p=1.5), "rollout.top_p"), (with_("lora", dropout=1.0), "lora.dropout"),
    (with_("lora", dropout=-0.1), "lora.dropout"), (with_("data", env="math_4agent"), "data.env"),
    (with_("data", train_files="data/missing.jsonl"), "data.train_files"), (with_("data", val_files="data"), "data.val_files"),
    (with_("trainer", resume="/tmp"), "trainer.resume"), (with_("algo", kl_kind="k4"), "algo.kl_kind"),
    (with_("algo", kl_ref="sft", kl_coef=0.1), "algo.kl_ref"),
    (with_("algo", gamma=1.5), "algo.gamma"), (with_("algo", dual_clip=0.5), "algo.dual_clip"),
    (with_("algo", clip_low=1.5), "algo.clip_low"), (with_("algo", kl_coef=-1.0), "algo.kl_coef"),
    (with_("rollout", num_chains=1), "rollout.num_chains"), (with_("trainer", eval_only=True, resume="none"), "trainer.eval_only"),
    (dataclasses.replace(BASE, roles=()), "roles"),
    (dataclasses.replace(BASE, roles=(RoleConfig("a"), RoleConfig("a"))), "roles"),
    (dataclasses.replace(BASE, roles=tuple(dataclasses.replace(r, trainable=False) for r in BASE.roles)), "roles"),
    (dataclasses.replace(BASE, roles=(RoleConfig("a", temperature=0.0),)), "roles[0].temperature"),
    # these once passed validation and trained on NaN or inf
    (with_("algo", dual_clip=float("nan")), "algo.dual_clip"), (with_("algo", kl_target=float("nan")), "algo.kl_target"),
    (with_("algo", vf_clip=float("nan")), "algo.vf_clip"), (with_("algo", vf_clip=float("inf")), "algo.vf_clip"),
    (with_("trainer", total_epochs=-1), "trainer.total_epochs"), (with_("trainer", total_epochs=0), "trainer.total_epochs"),
])
def test_bad_values_name_their_field(cfg, field):
    """Values are checked by Config.validate, names where they are defined (workflows, learner): all
    before any model loads, each error naming the field."""
    import learner
    from workflows import check_names
    with pytest.raises(ValueError, match=f"config field {field.replace('[', '.').replace(']', '.')}"):
        cfg.validate()
        check_names(cfg)
        learner.check_names(cfg)


def _float_fields(obj, name=""):
    for f in dataclasses.fields(obj):
        v, n = getattr(obj, f.name), f"{name}{f.name}"
        if dataclasses.is_dataclass(v):
            yield from _float_fields(v, n + ".")
        elif isinstance(v, float) or f.type in ("float", "float | None"):
            yield n


def test_nan_in_any_number_is_refused_by_name():
    """Every float field of every section (roles too): NaN is never a setting."""
    names = list(_float_fields(BASE))
    assert len(names) > 15 and "algo.dual_clip" in names and "algo.vf_clip" in names
    for name in names:
        section, _, field = name.rpartition(".")
        cfg = with_(section, **{field: float("nan")}) if section else dataclasses.replace(BASE, **{field: float("nan")})
        with pytest.raises(ValueError, match=f"config field {name}"):
            cfg.validate()
    roles = tuple(dataclasses.replace(r, temperature=float("nan")) if k == 1 else r for k, r in enumerate(BASE.roles))
    with pytest.raises(ValueError, match=r"config field roles\[1\]\.temperature"):
        dataclasses.replace(BASE, roles=roles).validate()


def test_an_init_from_adapter_of_another_base_is_named(tmp_path):
    import json
    d = tmp_path / "adapter"
    d.mkdir()
    (d / "adapter_model.safetensors").write_bytes(b"")
    (d / "adapter_config.json").write_text(json.dumps({"target_modules": list(BASE.lora.targets),
                                                      "base_model_name_or_path": "Qwen/Qwen2.5-0.5B"}))
    cfg = dataclasses.replace(BASE, roles=tuple(dataclasses.replace(r, init_from=str(d)) if k == 1 else r
                                                for k, r in enumerate(BASE.roles)))
    with pytest.warns(UserWarning, match=r"roles\[1\]\.init_from: .* base model 'Qwen/Qwen2.5-0.5B', but model.spec is "
                                         r"'tiny'"):
        cfg.validate()
    (d / "adapter_config.json").write_text(json.dumps({"target_modules": list(BASE.lora.targets),
                                                      "base_model_name_or_path": "tiny"}))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg.validate()  # the same base: no word


def test_the_shipped_configs_validate():
    for f in sorted((ROOT / "configs").glob("*.py")):
        cfg = load_config_file(str(f))
        if cfg.data.train_files.startswith("data/gsm8k"):  # needs data/prepare_hf.py (network) first
            continue
        cfg.validate()


def test_bad_input_is_one_clear_line_on_the_command_line(tmp_path):
    import subprocess
    import sys
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1 + 1?", "answer": "2"}\n{"question": "q", "answer": {"a": 1}}\n')
    for args, want in [(["--data.train-files", str(bad)], f"{bad}:2: field 'answer'"),
                       (["--algo.lr", "nan"], "config field algo.lr"),
                       (["--trainer.keep-checkpoints", "-1"], "config field trainer.keep_checkpoints")]:
        r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny_math_3agent.py"),
                            "--trainer.output-dir", str(tmp_path / "run"), *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "Traceback" not in r.stderr and want in r.stderr, r.stderr[-2000:]
        assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing ran


def test_rollout_compile_needs_cuda_and_the_torch_engine():
    """rollout.compile reaches TorchEngine(compile=True) (CUDA graphs); without CUDA it is a config
    error naming the field, not a silent eager fallback."""
    import dataclasses

    import torch
    cfg = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    on = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, compile=True))
    if torch.cuda.is_available():
        on.validate()
    else:
        with pytest.raises(ConfigError, match=r"config field rollout\.compile: .*CUDA available: False"):
            on.validate()
    vllm = dataclasses.replace(on, rollout=dataclasses.replace(on.rollout, engine="vllm"))
    with pytest.raises(ConfigError, match=r"rollout\.compile"):
        vllm.validate()


def test_env_kwargs_from_the_cli_for_keys_the_config_did_not_list():
    import train
    cfg = train.cli(["--config", str(ROOT / "configs" / "tiny_math_3agent.py"), "--data.env-kwargs.evaluator-reward",
                     "accuracy", "--data.env-kwargs.refiner_reward=correctness", "--data.env-kwargs.fix-bonus", "0.5",
                     "--trainer.total-steps", "3"])
    assert cfg.data.env_kwargs == {"evaluator_mixed_groups_only": False,  # the config's own
                                   "evaluator_reward": "accuracy", "refiner_reward": "correctness", "fix_bonus": 0.5}
    assert cfg.trainer.total_steps == 3
    from workflows import check_roles, workflow
    env = workflow(cfg)[0]()
    assert (env.evaluator_reward, env.refiner_reward, env.fix_bonus) == ("accuracy", "correctness", 0.5)
    bad = train.cli(["--config", str(ROOT / "configs" / "tiny_math_3agent.py"), "--data.env-kwargs.no-such-knob", "1"])
    with pytest.raises(ValueError, match=r"data\.env_kwargs: workflow 'math_3agent' refused \{.*'no_such_knob': 1\}: .*"
                                         r"unexpected keyword argument 'no_such_knob'"):
        check_roles(bad)


def test_threads_auto_takes_the_free_cores_and_names_a_busy_machine(monkeypatch):
    import session
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(session.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(session, "busy_cores", lambda: 0.1)
    monkeypatch.setattr(session.os, "getloadavg", lambda: (2.6, 2.0, 1.0))  # a job that just ended: lags
    assert session.pick_threads(0) == (2, None)  # idle now: both cores, whatever the load average still holds
    monkeypatch.setattr(session, "busy_cores", lambda: 1.2)
    assert session.pick_threads(0) == (1, None)  # one core busy now: the other
    monkeypatch.setattr(session, "busy_cores", lambda: 2.6)
    n, note = session.pick_threads(0)
    assert n == 1 and "looks busy (2.6 of 2 cores busy)" in note  # never more threads than free cores
    monkeypatch.setattr(session, "busy_cores", lambda: None)  # no /proc/stat: the load average
    assert session.pick_threads(0)[0] == 1 and "load average 2.6 on 2 cores" in session.pick_threads(0)[1]
    assert session.pick_threads(2)[0] == 2 and "2 thread(s)" in session.pick_threads(2)[1]  # asked for: kept, named
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(session.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert session.pick_threads(0) == (1, None)  # the environment's choice wins over auto


def test_busy_cores_reads_what_runs_now():
    """session.busy_cores: at least about one core busy while this process spins (other jobs on the machine
    can only add to it), never more than the CPUs."""
    import threading
    import session
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)])
    spinner.start()
    try:
        spinning = session.busy_cores(0.5)
    finally:
        stop.set()
        spinner.join()
    assert spinning is not None and 0.7 <= spinning <= os.cpu_count()


def test_the_threads_setting_reaches_torch(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny_toy.py"),
                        "--trainer.threads", "1", "--trainer.total-steps", "1", "--trainer.output-dir", str(tmp_path),
                        "--trainer.resume", "none"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| 1 rank(s), 1 torch thread(s) |" in r.stdout


PROBE = """
import builtins, importlib, os, sys
seen, real = [], builtins.__import__
def spy(name, *a, **k):
    if name.split(".")[0] == "torch" and not seen:
        seen.append(os.environ.get("OMP_WAIT_POLICY"))
    return real(name, *a, **k)
builtins.__import__ = spy
importlib.import_module(sys.argv[1])
print(seen[0])
"""


@pytest.mark.parametrize("entry", ["train", "eval", "sft", "play", "export"])
def test_entry_points_make_openmp_wait_passively_before_torch_loads(entry):
    """OpenMP reads OMP_WAIT_POLICY once, when torch loads: each entry point sets PASSIVE (README
    "Threads": spinning threads ran the smoke run 7.6x slower beside two busy processes) before its
    first torch import, and a user's own setting wins."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    run = lambda e: subprocess.run([sys.executable, "-c", PROBE, entry], cwd=ROOT, env=e, capture_output=True,
                                   text=True, check=True).stdout.split()[-1]
    assert run(env) == "PASSIVE"
    assert run({**env, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"


def test_a_file_env_is_executed_once_per_process(tmp_path):
    """data.env = path/to/file.py:Class: a short run looks its workflow up many times (checks, data, every rollout,
    val) and one more lookup by another spelling of the same path follows; the file's top-level code runs once."""
    import train
    from workflows import workflow
    count = tmp_path / "executions"
    env = tmp_path / "counted.py"
    env.write_text(f"with open({str(count)!r}, 'a') as f:\n    f.write('x')\n"
                   "from envs.toy import ToyEnv, load_tasks  # noqa: F401\n")
    cfg = load_config_file(str(ROOT / "configs" / "tiny_toy.py"))
    cfg = dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, env=f"{env}:ToyEnv", batch_size=2, val_size=2),
        rollout=dataclasses.replace(cfg.rollout, num_chains=2),
        algo=dataclasses.replace(cfg.algo, mini_batch_size=4, micro_batch_size=4),
        trainer=dataclasses.replace(cfg.trainer, total_steps=2, test_freq=1, output_dir=str(tmp_path / "run"),
                                    resume="none"))
    train.main(cfg)
    assert count.read_text() == "x"
    other = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, env=f"{tmp_path}/./counted.py:ToyEnv"))
    assert workflow(other)[1] is workflow(cfg)[1]
    assert count.read_text() == "x"


def test_vllm_sleep_needs_the_vllm_engine_and_says_on_cpu_that_it_frees_nothing():
    import torch
    with pytest.raises(ConfigError, match=r"config field rollout\.vllm_sleep: .*rollout\.engine=vllm, got 'torch'"):
        with_("rollout", vllm_sleep=True).validate()
    on = with_("rollout", vllm_sleep=True, engine="vllm")
    if torch.cuda.is_available():
        on.validate()
    else:
        with pytest.warns(UserWarning, match=r"rollout\.vllm_sleep: vLLM has no sleep mode on CPU"):
            on.validate()
