"""Hostile configs: names that would write outside the run, numbers
that crash torch or train on NaN, env kwargs each env checks in its constructor, files that are not
files. Each is one ConfigError naming the field, raised before any model loads."""
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import ConfigError, load_config_file, pop_env_kwargs
from workflows import check_roles

ROOT = Path(__file__).resolve().parent.parent
BASE = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))


def with_(section, **kw):
    return dataclasses.replace(BASE, **{section: dataclasses.replace(getattr(BASE, section), **kw)})


def roles(**kw):
    return dataclasses.replace(BASE, roles=(dataclasses.replace(BASE.roles[0], **kw),) + BASE.roles[1:])


# ------------------------------------------------------------------------------ names and numbers

@pytest.mark.parametrize("cfg, field", [
    (roles(name="/tmp/x"), r"roles\[0\]\.name: '/tmp/x' is not a usable name"),
    (roles(name="../x"), r"roles\[0\]\.name: '\.\./x'"), (roles(name="a.b"), r"roles\[0\]\.name: 'a\.b'"),
    (roles(adapter="../../evil"), r"roles\[0\]\.adapter: '\.\./\.\./evil'"),
    (roles(adapter="critic"), r"roles\[0\]\.adapter: 'critic' is reserved"),
    (roles(name="critic"), r"roles\[0\]\.name: 'critic' is reserved"),
    (roles(temperature=1e-300), r"roles\[0\]\.temperature: must be a finite number >= 0\.01"),
    (roles(lr=1e30), r"roles\[0\]\.lr: must be in \(0, 1\.0\]"), (roles(targets=("../x",)), r"roles\[0\]\.targets"),
    (with_("algo", lr=1e30), r"algo\.lr: must be <= 1\.0"), (with_("algo", critic_lr=5.0), r"algo\.critic_lr"),
    (with_("trainer", threads=99999), r"trainer\.threads: must be <= 1024"),
    (with_("trainer", seed=2**32), r"trainer\.seed: must be in \[0, 2147483647\]"),
    (with_("trainer", seed=-1), r"trainer\.seed: must be in \[0, 2147483647\], got -1"),
    (with_("trainer", strategy="ddp"), r"trainer\.strategy: use fsdp2 or replicate, got 'ddp'"),
    (with_("data", max_refinement_iterations=-1), r"data\.max_refinement_iterations"),
])
def test_bad_names_and_numbers_name_their_field(cfg, field):
    with pytest.raises(ConfigError, match="config field " + field):
        cfg.validate()


def test_a_run_directory_or_logger_directory_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match=rf"trainer\.output_dir: {f} exists and is not a directory"):
        with_("trainer", output_dir=str(f)).validate()
    for logger in ("tensorboard", "wandb"):
        run = tmp_path / logger
        run.mkdir()
        (run / logger).write_text("a file where the logger makes its directory")
        with pytest.raises(ConfigError, match=rf"trainer\.output_dir: {run / logger} exists and is not a directory"):
            with_("trainer", output_dir=str(run), logger=("console", logger)).validate()
        with_("trainer", output_dir=str(run), logger=("console",)).validate()  # a logger not used: no matter


def test_a_value_nested_too_deep_is_one_config_error():
    deep = "[" * 20_000 + "]" * 20_000
    with pytest.raises(ConfigError, match=r"data\.env_kwargs\.x: the value is nested too deep"):
        pop_env_kwargs(["--data.env-kwargs.x", deep])
    x = []
    for _ in range(20_000):
        x = [x]
    with pytest.raises(ConfigError, match=r"data\.env_kwargs: a value is nested too deep"):
        with_("data", env_kwargs={"x": x}).validate()


def test_threads_never_exceed_the_cores_and_a_strange_omp_setting_is_ignored(monkeypatch):
    """torch.set_num_threads(99999) is a SIGSEGV; int("²") a ValueError ("²".isdigit() is True)."""
    import session
    monkeypatch.setattr(session.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(session.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(session, "busy_cores", lambda: 0.0)
    for env, want in [("99999", 2), ("²", 2), ("1", 1), (" 1 ", 1), ("-3", 2), ("abc", 2), ("", 2)]:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
        assert session.pick_threads(0)[0] == want, env
    assert session.pick_threads(1000)[0] == 2  # a request too: capped at the cores


def test_a_lora_target_the_model_lacks_is_one_config_error(tiny):
    import session
    model, _ = tiny
    with pytest.raises(ConfigError, match=r"roles\[0\]\.targets: tiny has no linear layer named \['nope_proj'\]"):
        session.check_targets(roles(targets=("q_proj", "nope_proj")), model)
    with pytest.raises(ConfigError, match=r"lora\.targets: tiny has no linear layer named \['nope_proj'\]"):
        session.check_targets(with_("lora", targets=("nope_proj",)), model)
    session.check_targets(BASE, model)


# ------------------------------------------------------------------ env kwargs, in each constructor

def env_cfg(env, **kw):
    return with_("data", env=env, env_kwargs=kw)


@pytest.fixture(scope="module")
def fifo(tmp_path_factory):
    p = tmp_path_factory.mktemp("fifo") / "corpus.jsonl"
    os.mkfifo(p)
    return str(p)


@pytest.fixture(scope="module")
def huge(tmp_path_factory):
    p = tmp_path_factory.mktemp("huge") / "corpus.jsonl"
    with open(p, "wb") as f:  # sparse: 300 MB that take no disk
        f.truncate(300 * 2**20)
    return str(p)


@pytest.mark.parametrize("env, kw, field", [
    ("code", {"timeout": "abc"}, r"timeout: must be a number in \[1, 600\], got 'abc'"),
    ("code", {"timeout": 1e-3}, r"timeout: must be a number in \[1, 600\], got 0.001"),  # the reference scored 0
    ("code", {"timeout": float("nan")}, "timeout"), ("math_tool", {"code_timeout": -1}, "code_timeout"),
    ("math_tool", {"code_timeout": 1e-3}, r"code_timeout: must be a number in \[1, 600\], got 0.001"),
    ("swe", {"test_timeout": 1e-3}, r"test_timeout: must be a number in \[1, 3600\], got 0.001"),
    ("math_tool", {"analyzer_reward": "both"}, r"analyzer_reward: must be one of 'team', 'plan', got 'both'"),
    ("search", {"search_k": -3}, r"search_k: must be an integer in \[1, 1000\], got -3"),
    ("search", {"search_k": float("inf")}, "search_k: .* got inf"),  # --data.env-kwargs.search-k 1e999
    ("react", {"tools": ["search"], "search_k": float("inf")}, "search_k"),
    ("react", {"max_tool_calls": 1e999}, "max_tool_calls"),
    ("swe", {"disk_mb": -1}, r"disk_mb: must be an integer in \[1, 4096\]"), ("swe", {"test_timeout": 0}, "test_timeout"),
    ("swe", {"obs_chars": "many"}, "obs_chars"),
    ("math_3agent", {"refiner_reward": "correctness", "fix_bonus": float("inf")}, "fix_bonus: .* got inf"),
    ("math_3agent", {"refiner_reward": "correctness", "break_penalty": float("nan")}, "break_penalty"),
    ("math_3agent", {"evaluator_mixed_groups_only": "no"}, "evaluator_mixed_groups_only"),
    ("search", {"corpus": "/dev/zero"}, "corpus: /dev/zero is not a regular file"),
    ("search", {"corpus": "FIFO"}, "corpus: .* is not a regular file"),
    ("react", {"tools": ["search"], "corpus": "FIFO"}, "corpus: .* is not a regular file"),
    ("research", {"corpus": "FIFO"}, "corpus: .* is not a regular file"),
    ("research", {"corpus": "HUGE"}, "corpus: .* has 314572800 bytes, more than"),
    ("search", {"corpus": "data/none.jsonl"}, "corpus: data/none.jsonl does not exist"),
])
def test_env_kwargs_are_checked_by_each_env_before_the_model_loads(env, kw, field, fifo, huge):
    """A FIFO corpus used to hang, /dev/zero to end in MemoryError, 1e999 in OverflowError; a code
    timeout "abc" or 1e-3 (less than the sandbox takes to start) scored a right solution 0, search_k -3 made
    every episode raise, an infinite fix_bonus an infinite reward."""
    if env == "research":
        env = "envs.research:ResearchEnv"
    kw = {k: {"FIFO": fifo, "HUGE": huge}.get(v, v) if isinstance(v, str) else v for k, v in kw.items()}
    cfg = env_cfg(env, **kw)
    with pytest.raises(ConfigError, match="config field data.env_kwargs." + field):
        check_roles(cfg)


def test_the_envs_defaults_still_construct():
    from workflows import workflow
    for env in ("math_3agent", "math_single", "math_tool", "code", "search", "react", "swe", "toy",
                "envs.research:ResearchEnv"):
        workflow(env_cfg(env))[0]()


# ------------------------------------------------------------------------ on the command line

def test_hostile_config_is_one_line_without_a_traceback_and_writes_nothing(tmp_path):
    bad_role = tmp_path / "bad_role.py"
    bad_role.write_text(f"import dataclasses\nfrom config import load_config_file\n"
                        f"base = load_config_file({str(ROOT / 'configs' / 'tiny_math_3agent.py')!r})\n"
                        "config = dataclasses.replace(base, roles=(dataclasses.replace(base.roles[0], adapter='../../x'),)"
                        " + base.roles[1:])\n")
    tiny = ["--config", str(ROOT / "configs" / "tiny_math_3agent.py")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for args, want in [(tiny + ["--trainer.threads", "99999"], "config field trainer.threads"),
                       (tiny + ["--data.env-kwargs.refiner-reward", "correctness", "--data.env-kwargs.fix-bonus",
                                "Infinity"], "config field data.env_kwargs.fix_bonus"),
                       (["--config", str(bad_role)], "config field roles[0].adapter: '../../x'"),
                       (tiny + ["--algo.lr", "1e30"], "config field algo.lr")]:
        r = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "--trainer.output-dir", str(tmp_path / "run")],
                           capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
        assert r.returncode == 1 and "Traceback" not in r.stderr and want in r.stderr, r.stderr[-2000:]
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "run").exists() and not (tmp_path.parent / "x").exists()


def test_layout_option_is_checked_by_every_env_that_has_one():
    """The prompt layout (`layout`) of math_tool, search, the math team and research: an unknown value is one line
    naming the field and the choices, before any model; so are the parallel hand-out flags."""
    from config import ConfigError
    from envs.debate import DebateEnv
    from envs.math_3agent import MathTeamEnv
    from envs.math_tool import MathToolEnv
    from envs.research import ResearchEnv
    from envs.search_team import SearchTeamEnv
    from envs.video_qa import VideoQAEnv
    for make in (lambda v: MathToolEnv(layout=v), lambda v: SearchTeamEnv(layout=v), lambda v: MathTeamEnv(layout=v),
                 lambda v: ResearchEnv(layout=v)):
        with pytest.raises(ConfigError, match=r"data\.env_kwargs\.layout: must be one of .*'per_role'"):
            make("yes")
    for make in (lambda v: VideoQAEnv(parallel=v), lambda v: DebateEnv(parallel=v), lambda v: ResearchEnv(parallel=v)):
        with pytest.raises(ConfigError, match=r"data\.env_kwargs\.parallel: must be true or false"):
            make("yes")
    with pytest.raises(ConfigError, match=r"data\.env_kwargs\.layout: 'per_role' keeps one researcher"):
        ResearchEnv(layout="per_role", parallel=True)


def test_truncated_sampling_is_refused_where_the_engines_logprobs_enter_the_loss():
    """top_p < 1 / top_k > 0: the engines record a token's logprob under the truncated, renormalised distribution,
    the trainer under the full one, so exp(trainer - engine) is the kept mass on every token, not a policy change
    (TRL #6789): refused where that ratio enters the loss (the rollout IS weight, on by default with vLLM; the old
    logprobs taken from the engine), allowed where the trainer recomputes them and no IS weight is applied."""
    import torch

    import sampling
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(0)) * 3  # (B, V)
    one, zero = torch.ones(4, 1), torch.zeros(4, 1, dtype=torch.long)
    tok, lp = sampling.sample(logits, one, zero, one * 0.8, torch.zeros(4, dtype=torch.bool), torch.arange(4),
                              torch.tensor(0), True)
    full = logits.log_softmax(-1)  # (B, V) what the trainer scores
    probs = full.exp().sort(-1, descending=True).values  # (B, V)
    kept = (probs * ((probs.cumsum(-1) - probs) < 0.8)).sum(-1)  # (B,) the nucleus's mass
    assert torch.allclose(full.gather(-1, tok[:, None]).squeeze(-1) - lp, kept.log(), atol=1e-5)
    assert (kept < 0.9).all()
    R = dataclasses.replace
    for ro, al, field, what in [(dict(top_p=0.8), dict(rollout_is="on"), "top_p", "the rollout IS weight"),
                                (dict(top_k=20, engine="vllm"), {}, "top_k", "the rollout IS weight"),
                                (dict(top_p=0.9), dict(recompute_old_logprobs="never"), "top_p", "the old-policy ratio")]:
        with pytest.raises(ConfigError, match=f"config field rollout.{field}: truncated sampling: .* so {what}"):
            R(BASE, rollout=R(BASE.rollout, **ro), algo=R(BASE.algo, **al)).validate()
    for ro, al in [(dict(top_p=0.8, top_k=20), {}), (dict(top_p=0.8, engine="vllm"), dict(rollout_is="off")),
                   ({}, dict(rollout_is="on")), ({}, dict(recompute_old_logprobs="never"))]:
        R(BASE, rollout=R(BASE.rollout, **ro), algo=R(BASE.algo, **al)).validate()


def test_an_omp_setting_of_thousands_of_digits_is_more_threads_than_cores_not_a_traceback(monkeypatch):
    """OMP_NUM_THREADS of 4,301+ digits: int() refuses it (ValueError, from deep inside train.py's start). It is a
    count like 99999: more than the cores, so the cores."""
    import session
    monkeypatch.setattr(session.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(session, "busy_cores", lambda: 0.0)
    for env, want in [("9" * 4301, 2), ("0" * 5000 + "1", 1), ("0" * 5000, 2)]:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
        assert session.pick_threads(0)[0] == want, env[:10]
