"""recipes.py: one workflow's teacher -> SFT -> RL -> eval -> compare, on the tiny model; killed in the middle
of RL and run again, it redoes no finished stage and RL resumes from its checkpoint."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import recipes
import sft as sft_mod
import trajectories

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


def _spent(path: Path) -> float:
    try:
        return json.loads(path.read_text())["seconds"]
    except (OSError, ValueError, KeyError):
        return 0.0


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """video_qa --tiny, killed (with its stage's process) in the middle of RL once RL's first checkpoint is written
    and its time recorded, the directory then moved elsewhere, and the same command run again there."""
    first, out = tmp_path_factory.mktemp("first") / "rec", tmp_path_factory.mktemp("moved") / "rec"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "recipes.py", "video_qa", "--tiny", "--out", str(first)], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    ck = first / "rl" / "checkpoints" / "step_000001"
    while p.poll() is None and not ((ck / "config.json").exists() and _spent(first / "rl.time") > 0):
        time.sleep(0.2)
    assert p.poll() is None, p.stdout.read()
    os.killpg(p.pid, signal.SIGKILL)  # RL's first checkpoint: kill it there
    p.wait()
    killed_after = _spent(first / "rl.time")
    assert (first / "sft.done").exists() and (first / "base.done").exists() and not (first / "rl.done").exists()
    logs = {s: (first / f"{s}.log").read_text() for s in ("sft", "base")}
    shutil.move(first, out)
    r = subprocess.run([sys.executable, "recipes.py", "video_qa", "--tiny", "--out", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return {"out": out, "stdout": r.stdout, "logs": logs, "killed_after": killed_after, "env": env}


def test_a_killed_recipe_resumes_without_redoing_finished_stages(killed):
    out, stdout = killed["out"], killed["stdout"]
    assert "1. sft      [done]" in stdout and "2. base     [done]" in stdout and "3. rl       [to do]" in stdout
    assert {s: (out / f"{s}.log").read_text() for s in ("sft", "base")} == killed["logs"]  # not run again
    assert "resumed from" in (out / "rl.log").read_text()
    rows = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert sorted(x["step"] for x in rows if "time/step" in x) == [1, 2]  # each step once
    assert [x["step"] for x in rows if "val/team_reward" in x] == [0, 2]  # the SFT start and the end
    s = json.loads((out / "summary.json").read_text())
    assert s["val_tasks"] == 2 and s["steps"] == 2 and set(s["minutes"]) == {"sft", "base", "rl"}
    for role in ("captioner", "grapher", "organizer"):  # every role's adapter came from the teacher's SFT
        assert (out / "sft" / role / "adapter_config.json").exists()
    assert (out / "curves.png").stat().st_size > 0
    # the same directory for another recipe (here: the full one, not --tiny) is refused, nothing redone, and its
    # recipe_config.py is the finished run's still (it was rewritten before the check)
    conf = (out / "recipe_config.py").read_bytes()
    r = subprocess.run([sys.executable, "recipes.py", "video_qa", "--out", str(out)], cwd=ROOT, env=killed["env"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "done with another recipe" in r.stderr and "sft, base, rl, compare" in r.stderr
    assert json.loads((out / "summary.json").read_text()) == s and (out / "recipe_config.py").read_bytes() == conf
    assert not (out / "recipe_config.next.py").exists()


def test_a_moved_recipe_directory_is_the_same_recipe(killed):
    """The fingerprint held the output path: a moved directory was refused as "another recipe" (and RL's resume
    as "another config": its roles' init_from moved with it). The fixture moved it mid-RL: it went on."""
    out = killed["out"]
    assert "done with another recipe" not in killed["stdout"] and "resumed from" in (out / "rl.log").read_text()
    assert str(out / "rl") in (out / "recipe_config.py").read_text()


def test_summary_minutes_count_every_attempt_of_a_resumed_stage(killed):
    """summary.json's minutes counted the last attempt of a stage only: the killed RL attempt's time was lost."""
    s = json.loads((killed["out"] / "summary.json").read_text())
    marker = json.loads((killed["out"] / "rl.done").read_text())
    assert s["minutes"]["rl"] == pytest.approx(marker["seconds"] / 60)
    assert marker["seconds"] > killed["killed_after"] > 0  # the killed attempt's seconds and the resumed one's


def test_torn_markers_and_a_lost_summary_make_their_stage_run_again(killed, tmp_path):
    """An empty or torn <stage>.done was a JSONDecodeError / AttributeError at every rerun, and a finished recipe
    without summary.json never made it again. A bad marker, or a stage's output gone, is a note naming it and the
    stage runs again (the SFT's own done-check keeps it cheap); markers are written whole."""
    out = tmp_path / "rec"
    shutil.copytree(killed["out"], out)
    (out / "sft.done").write_text("")
    (out / "compare.done").write_text('{"seconds": 1.0, "fingerp')
    (out / "summary.json").unlink()
    r = subprocess.run([sys.executable, "recipes.py", "video_qa", "--tiny", "--out", str(out)], cwd=ROOT,
                       env=killed["env"], capture_output=True, text=True)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"note: {out / 'sft.done'} is unreadable (JSONDecodeError): stage sft runs again" in r.stdout
    assert f"note: {out / 'compare.done'} is unreadable (JSONDecodeError): stage compare runs again" in r.stdout
    assert "not run again" in (out / "sft.log").read_text().splitlines()[-1]  # sft.py's own check: the same SFT
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    assert all(json.loads((out / f"{st}.done").read_text())["fingerprint"] for st in recipes.STAGES)


def test_a_lost_sft_adapter_stops_the_recipe_before_rl(killed, tmp_path):
    """An adapter sft/summary.json lists, gone: RL started that role from the base model while summary.json called
    step 0 the SFT start. One line, and RL does not start."""
    out = tmp_path / "rec"
    shutil.copytree(killed["out"], out)
    shutil.rmtree(out / "sft" / "grapher")
    shutil.rmtree(out / "rl")
    for f in ("rl.done", "compare.done", "summary.json"):
        (out / f).unlink()
    r = subprocess.run([sys.executable, "recipes.py", "video_qa", "--tiny", "--out", str(out)], cwd=ROOT,
                       env=killed["env"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"recipes.py: {out / 'sft' / 'summary.json'} lists the SFT's adapter 'grapher', but {out / 'sft' / 'grapher'} "
        f"is missing or incomplete: RL would start that role from the base model; delete {out / 'sft.done'} and "
        f"{out / 'sft'} to redo the SFT (and {out / 'rl'} if RL has started)"], r.stderr[-2000:]
    assert not (out / "rl").exists() and not (out / "summary.json").exists()


def test_a_recipe_directory_in_use_is_refused_naming_the_holder(killed):
    """Two recipes in one directory both ran, every metrics line doubled: the directory is locked (rundir.DirLock)."""
    from rundir import DirLock
    out = killed["out"]
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
    with DirLock(out, "another recipes.py"):
        r = subprocess.run([sys.executable, "recipes.py", "video_qa", "--tiny", "--out", str(out)], cwd=ROOT,
                           env=killed["env"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert r.stderr.startswith(f"recipes.py: {out} is in use by another recipes.py (pid {os.getpid()} on ")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"} == before


# video_qa: the killed recipe's test above; math_tool: the BASE_TASKS test below runs its config through every stage;
# split_info and its baseline: the --baselines test below runs both through every stage
@pytest.mark.parametrize("name", [n for n in recipes.recipes()
                                  if n not in ("video_qa", "math_tool", "split_info", "split_info_single")])
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
    assert recipes.legacy_fingerprint(out, {}, False) == \
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
        (out / "sft").mkdir()
        (out / "sft" / "summary.json").write_text("{}")  # the stage's output: a marker alone is no finished stage
    assert recipes.stale(tmp_path / "3", *fps[3]) == [] and recipes.stale(tmp_path / "None", *fps[3]) == ["sft"]
    with pytest.raises(SystemExit, match=r"--seed must be an integer in \[0, 2147483647\], got -1"):
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
    assert {"sft_teachers.py", "envs/code_team.py", "runtime/sandbox.py", "rewards/code.py", "data/code_data.py"} <= code
    assert "data/swe_data.py" in sources(ROOT / "configs" / "cpu" / "swe.py")  # the loader's module
    env = tmp_path / "my_env.py"
    env.write_text('"""My env."""\nfrom envs.toy import ToyEnv as Env, load_tasks  # noqa: F401\n\n\ndef helper():\n'
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
    (out / "sft").mkdir()
    (out / "sft" / "summary.json").write_text("{}")  # the stage's output: a marker alone is no finished stage
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


def test_a_change_to_the_tasks_makes_finished_stages_stale_and_a_move_does_not(tmp_path, capsys):
    """The fingerprint held the config (file names), not the tasks: after a data change a resumed recipe paired
    arms on different tasks (n = 0) and trained RL from an SFT on other data. It holds the train and val sets as
    loaded, and not where the recipe directory is. A stage marked before (the fingerprint of the config with the
    output path) is taken with a note."""
    data = {}
    for split in ("train", "val"):
        data[split] = tmp_path / f"{split}.jsonl"
        data[split].write_text("".join(ROOT.joinpath("data", f"arith_{split}.jsonl").read_text().splitlines(True)[:4]))

    def recipe_dir(name):
        out = tmp_path / name
        out.mkdir()
        (out / "recipe_config.py").write_text(
            "import dataclasses\nfrom config import load_config_file\nR = dataclasses.replace\n"
            f"c = load_config_file({str(ROOT / 'configs' / 'tiny_math_3agent.py')!r})\n"
            f"config = R(c, data=R(c.data, train_files={str(data['train'])!r}, val_files={str(data['val'])!r}),\n"
            f"           trainer=R(c.trainer, output_dir={str(out / 'rl')!r}))\n")
        (out / "sft").mkdir()
        (out / "sft" / "summary.json").write_text("{}")
        return out
    a, b = recipe_dir("a"), recipe_dir("b")
    fp = recipes.fingerprint(a, {}, False)
    assert recipes.fingerprint(b, {}, False) == fp  # the same recipe elsewhere (a moved directory)
    recipes.mark(a, "sft", 1.0, *fp)
    assert recipes.stale(a, *fp) == []
    rows = data["val"].read_text().splitlines(True)
    data["val"].write_text(rows[0].replace('"answer": "', '"answer": "1') + "".join(rows[1:]))  # one answer changed
    new = recipes.fingerprint(a, {}, False)
    assert new[0] != fp[0] and recipes.stale(a, *new) == ["sft"]
    recipes.mark(b, "sft", 1.0, recipes.legacy_fingerprint(b, {}, False), new[1])  # marked by recipes.py before
    capsys.readouterr()
    assert recipes.stale(b, *new, recipes.legacy_fingerprint(b, {}, False)) == []
    assert "stage sft was finished before recipes.py recorded the tasks' content: not checked" in capsys.readouterr().out


def test_a_bad_seed_an_out_that_is_a_file_and_a_directory_it_cannot_write_are_one_line(tmp_path):
    """--seed 4294967296 was accepted: minutes of SFT, then the base eval died in numpy, and "run again" died the
    same way; --out a file, or a path under one, and a recipe directory it cannot write in were tracebacks. Each is
    one line before anything runs, and nothing is written."""
    f = tmp_path / "a_file"
    f.write_text("x")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    mounted = os.access(ro, os.W_OK) and not subprocess.run(  # root writes anywhere: a read-only filesystem then
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True).returncode
    cases = [(["--seed", "4294967296", "--out", str(tmp_path / "s")],
              "recipes.py: --seed must be an integer in [0, 2147483647], got 4294967296"),
             (["--out", str(f)], f"recipes.py: --out {f}: {f} is a file, not a directory"),
             (["--out", str(f / "sub")], f"recipes.py: --out {f / 'sub'}: {f} is a file, not a directory")]
    if mounted or not os.access(ro, os.W_OK):
        cases.append((["--out", str(ro)], f"recipes.py: {ro}: cannot be used ("))
    try:
        for args, want in cases:
            r = subprocess.run([sys.executable, "recipes.py", "react", "--tiny", *args], cwd=ROOT, capture_output=True,
                               text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith(want), (args, r.stderr[-2000:])
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "ro"] and f.read_text() == "x"
        assert list(ro.iterdir()) == []
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(ro)])
        ro.chmod(0o755)


def test_baselines_runs_the_team_its_one_agent_and_its_vote_at_the_teams_tokens_on_the_test_split(tmp_path):
    """recipes.py split_info --baselines --tiny: both recipes run every stage (the baseline in <out>/baseline), the
    team and the one agent are evaluated on the recipe's TEST_FILES at the SFT start (their SFT adapters) and at
    RL's end (the last checkpoint), the one agent's vote over N samples with N from the two arms' measured tokens,
    and one paired table per stage in baselines.json whose numbers are the eval folders' own."""
    out = tmp_path / "team"
    r = subprocess.run([sys.executable, "recipes.py", "split_info", "--baselines", "--tiny", "--out", str(out)],
                       cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    base = out / "baseline"
    for d in (out, base):
        assert all((d / f"{st}.done").exists() for st in recipes.STAGES), d
    rep = json.loads((out / "baselines.json").read_text())
    assert (rep["team"], rep["baseline"], rep["test_files"]) == ("split_info", "split_info_single",
                                                                 "data/split_info_test.jsonl")
    test = [json.loads(x)["question"] for x in (ROOT / "data" / "split_info_test.jsonl").read_text().splitlines()][:2]
    sft_conf = (out / "test_sft_config.py").read_text()
    assert str(out / "sft" / "agent_a") in sft_conf and str(out / "sft" / "agent_b") in sft_conf
    for stage, st in rep["stages"].items():
        dirs = [out / "test" / stage, base / "test" / stage, base / "test" / f"{stage}_maj"]
        assert [a["dir"].split(" (")[0] for a in st["arms"]] == [str(d) for d in dirs]
        for d in dirs:  # the test split's first tasks, not the val set's
            res = json.loads((d / "results.json").read_text())
            assert res["data"] == "data/split_info_test.jsonl"
        for d in dirs[:2]:
            recs = [json.loads(x) for x in (d / "greedy.jsonl").read_text().splitlines()]
            assert [x["task"]["question"] for x in recs] == test
        t, b = (recipes.tokens_per_task(d) for d in dirs[:2])
        assert (st["team_tokens"], st["single_tokens"]) == (t, b) and t > 0 and b > 0
        assert st["maj_k"] == max(1, round(t / b))
        assert json.loads((dirs[2] / "results.json").read_text())["maj_k"] == st["maj_k"]
        if stage == "rl":
            ck = json.loads((dirs[0] / "results.json").read_text())["checkpoint"]
            assert ck.endswith("step_000002") and str(out / "rl") in ck
    assert "| sft | single maj@" in r.stdout and "| rl | team |" in r.stdout
    again = subprocess.run([sys.executable, "recipes.py", "split_info", "--baselines", "--tiny", "--out", str(out)],
                           cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert again.returncode == 0 and "test eval:" not in again.stdout  # nothing redone


def test_baselines_needs_the_recipe_to_name_its_baseline_and_test_split(tmp_path):
    with pytest.raises(SystemExit, match="BASELINE"):
        recipes.main(["code", "--baselines", "--tiny", "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()
    assert recipes.test_split("reason_code") == ("reason_code_single", "data/multistep_test.jsonl", 100)


def test_baselines_table_reads_team_minus_arm():
    rep = {"team": "t", "baseline": "b", "test_files": "x.jsonl", "stages": {"rl": {
        "maj_k": 3, "team_tokens": 90.0, "single_tokens": 30.0, "arms": [
            {"arm": "team", "dir": "a", "n": 10, "score": 0.6, "tokens_per_task": 90.0},
            {"arm": "single", "dir": "b", "n": 10, "score": 0.4, "tokens_per_task": 30.0,
             "vs_team": {"n": 10, "diff": -0.2, "se": 0.1, "p": 0.5}},
            {"arm": "single maj@3", "dir": "c", "n": 12, "score": 0.5, "tokens_per_task": 90.0,
             "vs_team": {"n": 8, "diff": -0.25, "se": 0.125, "p": 0.25}},
            {"arm": "other", "dir": "d", "n": 4, "score": 1.0, "tokens_per_task": 9.0,
             "vs_team": {"n": 0, "diff": None, "se": None, "p": None}}]}}}
    text = recipes.baselines_table(rep)
    assert "| rl | single | 10 | 0.400 | 30 | +0.200 | 0.100 | +2.00 | 0.5 |" in text
    assert "| rl | single maj@3 | 12 | 0.500 | 90 | +0.250 (on the 8 shared) | 0.125 | +2.00 | 0.25 |" in text
    assert "| rl | other | 4 | 1.000 | 9 | not paired: no task in common with the team |" in text
    assert "rl 90 / 30 -> 3" in text


def test_the_compare_stage_refuses_arms_that_share_no_val_task(tmp_path):
    """compare.paired gives no statistic over n = 0 (it gave diff 0, p 1: "no difference"), and the summary does not
    pair what shares nothing: one line. Here RL's end and its start share their 3 tasks, the base eval none."""
    from test_compare import _arm, record
    out = tmp_path / "rec"
    rl = _arm(out, "rl", [1, 0, 1])
    start = [record(0, ["\\boxed{6}", "Verdict: Correct"], {"question": f"What is {i} + 0 + 7 - {i}?", "answer": "7"}, i)
             for i in range(3)]
    trajectories.write(rl / "trajectories" / "val_step_000000.jsonl", start)
    _arm(out, "base", [1, 1, 1], lambda i: {"question": f"What is {i} + 1 + 6 - {i}?", "answer": "7"})
    with pytest.raises(SystemExit, match="the base eval and RL's end share no val task"):
        recipes.compare_stage(out, "x")
    assert not (out / "summary.json").exists()


def test_a_test_eval_is_kept_only_when_made_by_the_same_command_and_readable(tmp_path):
    """--baselines keeps a test eval newer than rl.done only when the split, the task limit and the vote it was made
    with are the ones asked for now (a recipe's TEST_FILES or TEST_TASKS changed since: evaluated again, not the
    old tasks under the new file's name), and when its results.json reads (a torn one: evaluated again). Evaluating
    again here reaches 'no checkpoint to evaluate' (this folder has none), which is how the test sees it."""
    out = tmp_path / "r"
    (out / "test" / "rl").mkdir(parents=True)
    (out / "rl.done").write_text("{}")
    os.utime(out / "rl.done", (1e9, 1e9))  # the evals below are newer
    (out / "test" / "rl" / "results.json").write_text(json.dumps({"data": "a.jsonl", "tasks": 100}))
    (out / "test" / "rl.command.json").write_text(json.dumps(["--data", "a.jsonl", "--limit", "100"]))
    assert recipes.test_eval(out, "rl", "a.jsonl", 100, False) == out / "test" / "rl"  # the same command: kept
    for test, n in (("b.jsonl", 100), ("a.jsonl", 200), ("a.jsonl", None)):
        with pytest.raises(SystemExit, match="has no checkpoint to evaluate"):
            recipes.test_eval(out, "rl", test, n, False)
    (out / "test" / "rl" / "results.json").write_text('{"data": "a.js')
    with pytest.raises(SystemExit, match="has no checkpoint to evaluate"):
        recipes.test_eval(out, "rl", "a.jsonl", 100, False)
    (out / "test" / "rl" / "greedy.jsonl").write_text('{"task": {}, "turns": [\n')
    with pytest.raises(SystemExit, match=r"^recipes.py: .*greedy.jsonl:1: "):
        recipes.tokens_per_task(out / "test" / "rl")


OTHER_VALUE = {"fuse": True, "strategy": "replicate"}  # a value other than the default of each ADDED_SINCE field


@pytest.mark.parametrize("section,key,default", recipes.ADDED_SINCE, ids=[k for _, k, _ in recipes.ADDED_SINCE])
def test_a_config_field_added_later_keeps_finished_stages_at_its_default(tmp_path, monkeypatch, section, key, default):
    """rollout.fuse and trainer.strategy came after stages were fingerprinted: left at its default such a field
    is not hashed, so a stage made before it existed keeps its fingerprint (tree_sampling's arrival made every
    finished stage stale); set, it changes the fingerprint like any field."""
    import config as config_mod
    monkeypatch.chdir(ROOT)
    out = tmp_path / "stage"
    out.mkdir()
    (out / "recipe_config.py").write_text((ROOT / "configs" / "tiny_math_3agent.py").read_text())
    now = recipes.fingerprint(out, {}, False)[0]
    real, full = config_mod.to_dict, recipes.ADDED_SINCE

    def before_the_field(cfg):  # the config's dict as it was before the field existed
        d = real(cfg)
        assert d[section][key] == default
        del d[section][key]
        return d
    monkeypatch.setattr(config_mod, "to_dict", before_the_field)
    monkeypatch.setattr(recipes, "ADDED_SINCE", tuple(x for x in recipes.ADDED_SINCE if x[1] != key))
    assert recipes.fingerprint(out, {}, False)[0] == now
    monkeypatch.setattr(config_mod, "to_dict", real)
    monkeypatch.setattr(recipes, "ADDED_SINCE", full)
    (out / "recipe_config.py").write_text((ROOT / "configs" / "tiny_math_3agent.py").read_text()
                                          + f"\nimport dataclasses\nconfig = dataclasses.replace(config, {section}="
                                            f"dataclasses.replace(config.{section}, {key}={OTHER_VALUE[key]!r}))\n")
    assert recipes.fingerprint(out, {}, False)[0] != now
