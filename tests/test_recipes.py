"""recipes.py: one workflow's teacher -> SFT -> RL -> eval -> compare, on the tiny model; killed in the middle
of RL and run again, it redoes no finished stage and RL resumes from its checkpoint."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import recipes
import sft as sft_mod

ROOT = Path(__file__).resolve().parent.parent


def test_every_recipe_plans_every_trainable_role_from_its_sft(tmp_path, capsys):
    for name in recipes.recipes():
        _, cfg, sft = recipes.load_recipe(name)
        stages = dict(recipes.plan(name, tmp_path, cfg, sft, tiny=False))
        assert list(stages) == list(recipes.STAGES)
        rl = stages["rl"]
        for i, r in enumerate(cfg.roles):  # each role starts from its adapter's SFT
            assert (f"--roles.{i}.init-from" in rl) == r.trainable
        assert "--teacher" in stages["sft"] and "scripted" in stages["sft"]
        parsed = sft_mod.cli(stages["sft"][2:])
        for k, v in sft.items():  # every SFT option of the recipe (min_steps, pack_turns too) reaches sft.py
            assert getattr(parsed, k) == v, (name, k)
        tiny = sft_mod.cli(dict(recipes.plan(name, tmp_path, cfg, sft, tiny=True))["sft"][2:])
        assert (tiny.teacher_tasks, tiny.epochs) == (recipes.TINY["teacher_tasks"], 1), name  # --tiny's SFT
        import workflows
        n_val = len(workflows.workflow(cfg)[2](cfg.data.val_files))
        assert cfg.data.val_size >= min(100, n_val), name  # >= 100 held-out tasks, or all the set has
        assert cfg.trainer.val_before_train, name  # its step 0 is the SFT start
        assert cfg.trainer.total_steps % cfg.trainer.test_freq == 0, name  # a val at the end
    with pytest.raises(SystemExit, match="no recipe 'nope'"):
        recipes.main(["nope"])


def test_a_killed_recipe_resumes_without_redoing_finished_stages(tmp_path):
    out = tmp_path / "rec"
    cmd = [sys.executable, "recipes.py", "video_qa", "--tiny", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    ck = out / "rl" / "checkpoints" / "step_000001"
    while p.poll() is None and not (ck / "config.json").exists():  # RL's first checkpoint: kill it there
        time.sleep(0.2)
    assert p.poll() is None, p.stdout.read()
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert (out / "sft.done").exists() and (out / "base.done").exists() and not (out / "rl.done").exists()
    logs = {s: (out / f"{s}.log").read_text() for s in ("sft", "base")}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1. sft      [done]" in r.stdout and "2. base     [done]" in r.stdout and "3. rl       [to do]" in r.stdout
    assert {s: (out / f"{s}.log").read_text() for s in ("sft", "base")} == logs  # not run again
    assert "resumed from" in (out / "rl.log").read_text()
    rows = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert sorted(x["step"] for x in rows if "time/step" in x) == [1, 2]  # each step once
    assert [x["step"] for x in rows if "val/team_reward" in x] == [0, 2]  # the SFT start and the end
    s = json.loads((out / "summary.json").read_text())
    assert s["val_tasks"] == 2 and s["steps"] == 2 and set(s["minutes"]) == {"sft", "base", "rl"}
    for role in ("captioner", "grapher", "organizer"):  # every role's adapter came from the teacher's SFT
        assert (out / "sft" / role / "adapter_config.json").exists()
    assert (out / "curves.png").stat().st_size > 0
    # the same directory for another recipe (here: the full one, not --tiny) is refused, nothing redone
    r = subprocess.run([sys.executable, "recipes.py", "video_qa", "--out", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "done with another recipe" in r.stderr and "sft, base, rl, compare" in r.stderr
    assert json.loads((out / "summary.json").read_text()) == s


# video_qa: the killed recipe's test above; math_tool: the BASE_TASKS test below runs its config through every stage
@pytest.mark.parametrize("name", [n for n in recipes.recipes() if n not in ("video_qa", "math_tool")])
def test_each_recipe_runs_teacher_sft_rl_eval_on_the_tiny_model(tmp_path, name):
    """Every recipe's config, on the tiny model: the teacher's SFT writes an adapter for every role (the code
    refiner's from its repair lessons), RL takes 2 steps from them, val at 0 and 2, the summary."""
    out = tmp_path / name
    r = subprocess.run([sys.executable, "recipes.py", name, "--tiny", "--out", str(out)], cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    _, cfg, _ = recipes.load_recipe(name)
    written = {ro.name for ro in cfg.roles if recipes.adapter_written(out, cfg, ro)}
    assert written == {ro.name for ro in cfg.roles}, written
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 2 and s["val_tasks"] >= 1 and all((out / f"{st}.done").exists() for st in recipes.STAGES)
    run = json.loads((out / "rl" / "config.json").read_text())  # --tiny's reply cap reached the RL run
    assert [r["max_tokens"] for r in run["roles"]] == [min(r.max_tokens, recipes.TINY["max_tokens"]) for r in cfg.roles]
    val = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines() if "val/team_reward" in x]
    assert run["trainer"]["adapter_kl_turns"] == 0 and not [k for r in val for k in r if "adapter_kl" in k]


def test_base_tasks_limits_the_base_eval_and_its_pairing(tmp_path, monkeypatch):
    """A recipe's BASE_TASKS = N: the base stage evaluates the first N val tasks (eval.py --limit N), the
    summary pairs the base with RL's end on those N, and the SFT start with RL's end on all of them; N is part
    of the fingerprint (a finished stage made with another N is stale), and a recipe without it keeps the
    fingerprint it had. --tiny ignores it (its val is 2 tasks). A bad value is one clear line."""
    _, cfg, sft = recipes.load_recipe("search")
    assert recipes.base_tasks("search") == 60
    base = dict(recipes.plan("search", tmp_path, cfg, sft, tiny=False))["base"]
    assert base[base.index("--limit") + 1] == "60"
    assert "--limit" not in dict(recipes.plan("search", tmp_path, cfg, sft, tiny=True))["base"]
    assert "--limit" not in dict(recipes.plan("react", tmp_path, *recipes.load_recipe("react")[1:], tiny=False))["base"]
    rec = tmp_path / "recipes"
    rec.mkdir()
    body = (f"from config import load_config_file\nimport dataclasses\nR = dataclasses.replace\n"
            f"c = load_config_file({str(ROOT / 'configs' / 'cpu' / 'math_tool.py')!r})\n"
            "config = R(c, model=R(c.model, spec='tiny'), rollout=R(c.rollout, num_chains=2, progress=False),\n"
            "           roles=tuple(R(r, max_tokens=16) for r in c.roles),\n"
            "           data=R(c.data, batch_size=1, val_size=3), trainer=R(c.trainer, total_steps=1, test_freq=1))\n"
            "SFT = {'teacher_tasks': 2, 'epochs': 1}\n")
    (rec / "mine.py").write_text(body + "BASE_TASKS = 2\n")
    (rec / "bad.py").write_text(body + "BASE_TASKS = 0\n")
    (rec / "big.py").write_text(body + "BASE_TASKS = 4\n")
    monkeypatch.setattr(recipes, "RECIPES", rec)
    with pytest.raises(SystemExit, match=r"bad.py: BASE_TASKS must be a positive int"):
        recipes.base_tasks("bad")
    with pytest.raises(SystemExit, match=r"big.py: BASE_TASKS = 4 is more than the recipe's data.val_size = 3"):
        recipes.base_tasks("big")
    out = tmp_path / "mine"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    s = recipes.main(["mine", "--out", str(out)])
    assert (s["val_tasks"], s["n_vs_base"]) == (3, 2)  # SFT start vs end on all 3; base vs end on its 2
    _, cfg, _ = recipes.load_recipe("mine")  # math_tool's roles, each from the teacher's SFT, every stage done
    assert all(recipes.adapter_written(out, cfg, ro) for ro in cfg.roles) and s["steps"] == 1
    assert all((out / f"{st}.done").exists() for st in recipes.STAGES)
    end = [json.loads(x) for x in (out / "rl" / "trajectories" / "val_step_000001.jsonl").read_text().splitlines()]
    by_task = {r["task_id"]: r["metrics"]["team_reward"] for r in end}  # greedy: one episode a task
    assert s["rl_end_on_base_tasks"] == pytest.approx((by_task[0] + by_task[1]) / 2)
    base_rows = [json.loads(x) for x in (out / "base" / "greedy.jsonl").read_text().splitlines() if x.strip()]
    assert len(base_rows) == 2, len(base_rows)
    fp = recipes.fingerprint(out, {'teacher_tasks': 2, 'epochs': 1}, False, 2)
    assert recipes.stale(out, *fp) == []
    assert set(recipes.stale(out, *recipes.fingerprint(out, {'teacher_tasks': 2, 'epochs': 1}, False, 3))) == \
        set(recipes.STAGES)  # another N: every stage is stale
    import hashlib
    from config import load_config_file, to_dict
    before = {"config": to_dict(load_config_file(str(out / "recipe_config.py"))), "sft": {}, "tiny": False}
    assert recipes.fingerprint(out, {}, False)[0] == \
        hashlib.sha256(json.dumps(before, sort_keys=True, default=str).encode()).hexdigest()[:16]  # unset: as before


def test_seed_reaches_the_sft_and_the_train_config_and_the_fingerprint(tmp_path, capsys):
    """--seed N: sft.py gets --seed N, the train config every stage reads gets trainer.seed N, the default output
    is runs/recipes/<workflow>_seed<N>, and a finished stage of another seed is stale; a negative one is one line."""
    from config import load_config_file
    assert recipes.main(["code", "--seed", "3", "--plan"]) is None
    text = capsys.readouterr().out
    assert text.startswith(f"recipe code -> {ROOT / 'runs' / 'recipes' / 'code_seed3'}\n") and "--seed 3" in text
    recipe, cfg, sft = recipes.load_recipe("code")
    fps = {}
    for seed in (None, 3):
        out = tmp_path / str(seed)
        out.mkdir()
        recipes.write_config(out / "recipe_config.py", recipe, out, False, seed)
        assert load_config_file(str(out / "recipe_config.py")).trainer.seed == (seed or 0)
        fps[seed] = recipes.fingerprint(out, {**sft, **({} if seed is None else {"seed": seed})}, False)
        recipes.mark(out, "sft", 1.0, *fps[seed])
    assert recipes.stale(tmp_path / "3", *fps[3]) == [] and recipes.stale(tmp_path / "None", *fps[3]) == ["sft"]
    with pytest.raises(SystemExit, match="--seed must be an integer >= 0, got -1"):
        recipes.main(["code", "--seed", "-1", "--plan"])


def test_plan_and_list_run_nothing(tmp_path, capsys):
    assert recipes.main(["--list"]) is None and capsys.readouterr().out.split() == recipes.recipes()
    out = tmp_path / "p"
    assert recipes.main(["code", "--plan", "--out", str(out)]) is None
    text = capsys.readouterr().out
    assert "1. sft      [to do]" in text and "--teacher scripted" in text and not out.exists()


def test_a_change_to_the_teachers_code_makes_finished_stages_stale(tmp_path, capsys):
    """The fingerprint a finished stage carries covers the teacher's code, per file, not only the config:
    the workflow's module, its task loader's, and the troupe modules they import anywhere in their code
    (prompts, parsers, rewards, the sandbox), and sft_teachers.py. A code edit there makes the stage stale,
    naming the file; a docstring or comment edit does not; a stage finished before the code was recorded is
    taken with a note; sft.py's own done-check (its fingerprint's "teacher" part) sees the same change."""
    from config import load_config_file
    from sft_teachers import teacher_sources
    from workflows import workflow

    def sources(path):
        _, module, loader = workflow(load_config_file(str(path)))
        return {str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else f.name for f in teacher_sources(module, loader)}
    code = sources(ROOT / "configs" / "cpu" / "code.py")
    assert {"sft_teachers.py", "envs/code_team.py", "envs/sandbox.py", "rewards/code.py", "data/code_data.py"} <= code
    assert "data/swe_data.py" in sources(ROOT / "configs" / "cpu" / "swe.py")  # the loader's module
    env = tmp_path / "my_env.py"
    env.write_text('"""My env."""\nfrom envs.toy import ToyEnv as Env\n\n\ndef helper():\n'
                   '    from rewards.math import math_reward  # imported inside a function\n    return math_reward\n')
    out = tmp_path / "rec"
    out.mkdir()
    (out / "recipe_config.py").write_text(
        "import dataclasses\nfrom config import load_config_file\n"
        f"config = load_config_file({str(ROOT / 'configs' / 'tiny_toy.py')!r})\n"
        f"config = dataclasses.replace(config, data=dataclasses.replace(config.data, env={str(env) + ':Env'!r}))\n")
    names = sources(out / "recipe_config.py")
    assert {"my_env.py", "rewards/math.py", "envs/toy.py", "sft_teachers.py"} <= names, names
    assert not names & {"envs/code_team.py", "envs/math_3agent.py", "rewards/code.py"}, names  # loaded, not used
    import sft
    tc = load_config_file(str(out / "recipe_config.py"))
    sft_fp = sft.fingerprint(sft.SFTConfig(teacher="scripted", out=str(tmp_path / "s")), tc, [], {})
    fp, code = recipes.fingerprint(out, {"lr": 1e-4}, False)
    recipes.mark(out, "sft", 1.0, fp, code)
    assert recipes.stale(out, *recipes.fingerprint(out, {"lr": 1e-4}, False)) == []
    assert recipes.stale(out, *recipes.fingerprint(out, {"lr": 2e-4}, False)) == ["sft"]  # another SFT option
    env.write_text(env.read_text().replace('"""My env."""', '"""My env, its docstring reworded."""') + "# a comment\n")
    assert recipes.fingerprint(out, {"lr": 1e-4}, False) == (fp, code)  # words only: the same code
    env.write_text(env.read_text() + "X = 2\n")
    new = recipes.fingerprint(out, {"lr": 1e-4}, False)
    assert new[0] == fp and new[1] != code and recipes.stale(out, *new) == [f"sft (the teacher's code changed: {env})"]
    changed = sft.fingerprint(sft.SFTConfig(teacher="scripted", out=str(tmp_path / "s")), tc, [], {})
    assert [k for k in changed if changed[k] != sft_fp[k]] == ["teacher"]  # sft.py's own rerun check sees it too
    (out / "sft.done").write_text(json.dumps({"seconds": 1.0, "fingerprint": fp}) + "\n")  # before code was recorded
    capsys.readouterr()
    assert recipes.stale(out, *new) == [] and "finished before recipes.py recorded the teacher's code" in capsys.readouterr().out
