"""One command per workflow: a scripted teacher -> SFT -> RL -> eval -> paired comparison, on CPU.

    python recipes.py --list                 # the recipes (configs/cpu/*.py)
    python recipes.py math_tool --plan       # its stages and their commands; runs nothing
    python recipes.py math_tool              # everything into runs/recipes/math_tool/ (resumable: run it again)
    python recipes.py math_tool --tiny       # the tiny random model, 2 RL steps, 2 val tasks, 16-token replies
    python recipes.py code --seed 1          # the same recipe under another seed (runs/recipes/code_seed1)
    python recipes.py split_info --baselines # the team, its matched baselines, one paired table on the test split

A recipe is configs/cpu/<workflow>.py: `config` (the RL run: model, roles, data, its val set, steps, val at
step 0 and at the end) and `SFT` (sft.py options for the teacher's SFT, e.g. teacher_tasks, lr, epochs).
The stages, each a fresh process (one at a time; the machine's cores are theirs), each skipped when its
output is complete, so a killed run resumes where it stopped (train.py itself resumes from its last
checkpoint); a stage finished under another config, SFT options, tasks (the train and val sets' content) or
teacher code (the workflow's module and what it uses) is refused, not reused; where the recipe directory is
is no part of it (a moved directory resumes):
  1. sft      sft.py --teacher scripted: the workflow module's scripted_replies(task) (a perfect team) played
              on the first SFT['teacher_tasks'] training tasks, every role's turns (and, where the workflow
              has one, its scripted_repair(task) lesson's turns after the mistake) -> <out>/sft/<adapter>/
  2. base     eval.py --base: the base model on the val set, greedy (on its first BASE_TASKS tasks where the
              recipe sets BASE_TASKS; then compared with RL's end on those)           -> <out>/base/
  3. rl       train.py with every role's adapter from the SFT; its val at step 0 is the SFT start,
              its last val the end                                                    -> <out>/rl/
  4. compare  compare.py <out>/rl@0 <out>/rl <out>/base, and base against rl (paired on the same val tasks)
              -> <out>/compare_*.json, <out>/summary.json
              (before = the SFT start, after = RL's end, their paired difference and s.e., the base,
              minutes per stage) and <out>/curves.png (val team reward, each role's train reward by step)
--baselines (a team recipe that names BASELINE, its one-agent baseline's recipe, and TEST_FILES, its held-out
split; TEST_TASKS: its first N only): both recipes run (each resumable, as above, in its own directory: the
baseline's is its own default, runs/recipes/<baseline>, or with --out DIR, DIR/baseline), then the
team and the baseline (i) are evaluated greedy on the test split at the SFT start and at RL's end (eval.py ->
<out>/test/<stage>/), then (ii): (i)'s majority vote over N sampled episodes, N = max(1, round(the team's tokens
per task / (i)'s)) on those greedy test evals of the same stage; then compare.py pairs the team with (i) and (ii)
on the same tasks, and with each of its members alone where its env logs them (compare.py --alone: reason_code's
first-turn answers), each arm with its generated tokens per task -> <out>/baselines.json and a table per stage.
An eval is made again when its results.json is missing or older than its recipe's rl.done.
<out>/recipe_config.py is the train config every stage reads (the recipe's, --tiny's overrides applied); a run
refused as another recipe leaves it as it was. One recipe at a time in a directory (rundir.DirLock: a second
is one line naming the first). <stage>.done, the marker of a finished stage, holds the seconds of every attempt
at it (<stage>.time keeps them up to date while one runs, so a killed attempt counts) and is written whole
(tmp + rename); a marker that is unreadable, or whose stage's output is missing or unreadable, makes the stage
run again, with a note naming it. An adapter that sft/summary.json lists and that is gone stops the recipe before RL (one line).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import trajectories
from config import MAX_SEED, ConfigError, load_config_file

ROOT = Path(__file__).resolve().parent
RECIPES = ROOT / "configs" / "cpu"
STAGES = ("sft", "base", "rl", "compare")
OUTPUTS = {"sft": "sft/summary.json", "base": "base/results.json", "rl": "rl/metrics.jsonl", "compare": "summary.json"}
BEAT = 5.0  # seconds between the records of a running stage's time (<stage>.time)
# --tiny: the plumbing of every stage, not learning. max_tokens caps each role's reply: the random model never stops
# on its own, so every turn ran to the recipe's budget (128-512 tokens), most of a tiny recipe's time
TINY = {"model": "tiny", "total_steps": 2, "val_size": 2, "batch_size": 1, "num_chains": 2, "teacher_tasks": 2,
        "max_tokens": 16, "adapter_kl_turns": 0}


def recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.py") if not p.name.startswith("_"))


def recipe_module(name: str):
    path = RECIPES / f"{name}.py"
    if not path.is_file():
        sys.exit(f"recipes.py: no recipe {name!r} (configs/cpu/{name}.py); the recipes: {', '.join(recipes())}")
    spec = importlib.util.spec_from_file_location(f"troupe_recipe_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return path, mod


def load_recipe(name: str):
    path, mod = recipe_module(name)
    return path, mod.config, dict(getattr(mod, "SFT", {}))


def base_tasks(name: str, tiny: bool = False) -> int | None:
    """The recipe's BASE_TASKS: the base model is evaluated on the first N val tasks only (None: all of them, and
    under --tiny, whose val is 2 tasks). An untrained base that never answers runs every turn of every episode,
    the dearest eval of a recipe."""
    if tiny:
        return None
    path, mod = recipe_module(name)
    n, val_size = getattr(mod, "BASE_TASKS", None), mod.config.data.val_size
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        sys.exit(f"recipes.py: {path}: BASE_TASKS must be a positive int or None, got {n!r}")
    if n is not None and val_size is not None and n > val_size:  # eval.py's --limit would read past RL's val
        sys.exit(f"recipes.py: {path}: BASE_TASKS = {n} is more than the recipe's data.val_size = {val_size}")
    return n


def write_config(path: Path, recipe: Path, out: Path, tiny: bool, seed: int | None = None):
    """<out>/recipe_config.py: the recipe's config, its RL run writing to <out>/rl (and --tiny's and --seed's
    overrides)."""
    lines = ["# written by recipes.py: the train config of every stage of this recipe run", "import dataclasses", "",
             "from config import load_config_file", "", f"config = load_config_file({str(recipe)!r})",
             "R = dataclasses.replace",
             f"config = R(config, trainer=R(config.trainer, output_dir={str(out / 'rl')!r}, val_before_train=True))"]
    if tiny:
        t = TINY
        lines += [f"config = R(config, model=R(config.model, spec={t['model']!r}),",
                  f"          roles=tuple(R(r, max_tokens=min(r.max_tokens, {t['max_tokens']})) for r in config.roles),",
                  f"          rollout=R(config.rollout, num_chains={t['num_chains']}, progress=False),",
                  f"          data=R(config.data, batch_size={t['batch_size']}, val_size={t['val_size']}),",
                  f"          trainer=R(config.trainer, total_steps={t['total_steps']}, test_freq={t['total_steps']},"
                  f" save_freq=1, adapter_kl_turns={t['adapter_kl_turns']}))"]
    if seed is not None:
        lines.append(f"config = R(config, trainer=R(config.trainer, seed={seed}))")
    text = "\n".join(lines) + "\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def plan(name: str, out: Path, cfg, sft: dict, tiny: bool) -> list[tuple[str, list[str] | None]]:
    conf = str(out / "recipe_config.py")
    n_base = base_tasks(name, tiny)
    sft = {**sft, **({"teacher_tasks": TINY["teacher_tasks"], "epochs": 1, "min_steps": 0} if tiny else {})}
    sft_cmd = [sys.executable, "sft.py", "--train-config", conf, "--teacher", "scripted", "--out", str(out / "sft"),
               "--no-progress"]
    for k, v in sft.items():
        flag = k.replace('_', '-')
        if isinstance(v, bool):  # sft.py's booleans are flags: --pack-turns / --no-pack-turns
            sft_cmd.append(f"--{flag}" if v else f"--no-{flag}")
        else:
            sft_cmd += [f"--{flag}", *(map(str, v) if isinstance(v, (list, tuple)) else [str(v)])]
    init = [x for i, r in enumerate(cfg.roles) if r.trainable and (not done(out, "sft") or adapter_written(out, cfg, r))
            for x in (f"--roles.{i}.init-from", str(out / "sft" / cfg.adapter_of(r)))]
    return [("sft", sft_cmd),
            ("base", [sys.executable, "eval.py", "--config", conf, "--base", "--out", str(out / "base"),
                      *(["--limit", str(n_base)] if n_base else [])]),
            ("rl", [sys.executable, "train.py", "--config", conf, *init]),
            ("compare", None)]  # in this process: compare.py's rows, the summary, the plot


def sft_adapters(out: Path) -> dict:
    """The adapters sft/summary.json says the SFT wrote ({} when it is missing or unreadable)."""
    try:
        written = json.loads((out / "sft" / "summary.json").read_text(encoding="utf-8")).get("adapters")
    except (OSError, ValueError, AttributeError):
        return {}
    return written if isinstance(written, dict) else {}


def adapter_written(out: Path, cfg, role) -> bool:
    """Whether the SFT wrote this role's adapter: sft/summary.json lists it (a role the teacher gave no example
    starts from the base). One it lists whose files are gone stops the recipe before RL (check_sft)."""
    return cfg.adapter_of(role) in sft_adapters(out)


def check_sft(out: Path):
    """One line when an adapter sft/summary.json lists is not there: RL would start that role from the base model
    while the summary calls RL's step 0 the SFT start."""
    for a in sft_adapters(out):
        d = out / "sft" / str(a)
        if not all((d / f).is_file() for f in ("adapter_config.json", "adapter_model.safetensors")):
            sys.exit(f"recipes.py: {out / 'sft' / 'summary.json'} lists the SFT's adapter {a!r}, but {d} is missing or "
                     f"incomplete: RL would start that role from the base model; delete {out / 'sft.done'} and "
                     f"{out / 'sft'} to redo the SFT (and {out / 'rl'} if RL has started)")


def marker(out: Path, stage: str) -> tuple[dict | None, str | None]:
    """(the marker of a finished stage, None): <stage>.done a JSON object with its seconds and fingerprint, and the
    stage's output (OUTPUTS) there and readable. Else (None, why not, naming the file), why None when the stage
    was never marked."""
    p, o = out / f"{stage}.done", out / OUTPUTS[stage]
    if not os.path.lexists(p):
        return None, None
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # torn by a kill or a full disk before markers were written whole
        return None, f"{p} is unreadable ({type(e).__name__})"
    if not (isinstance(m, dict) and isinstance(m.get("fingerprint"), str) and isinstance(m.get("seconds"), (int, float))):
        return None, f"{p} is not a stage marker"
    try:
        if o.suffix == ".json":
            json.loads(o.read_text(encoding="utf-8"))
        elif not o.is_file():
            raise FileNotFoundError(o)
    except (OSError, ValueError) as e:
        return None, f"{o}, what stage {stage} made, is missing or unreadable ({type(e).__name__})"
    return m, None


def done(out: Path, stage: str) -> bool:
    return marker(out, stage)[0] is not None


def mark(out: Path, stage: str, seconds: float, fingerprint: str, code: dict):
    trajectories.write_text(out / f"{stage}.done", json.dumps({"seconds": seconds, "fingerprint": fingerprint,
                                                               "code": code}) + "\n")


def spent(out: Path, stage: str) -> float:
    """Seconds the attempts at a stage ran so far (<stage>.time: a killed attempt counts up to its last record)."""
    try:
        s = json.loads((out / f"{stage}.time").read_text())["seconds"]
        return float(s) if isinstance(s, (int, float)) and 0 <= s < math.inf else 0.0
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def run_stage(cmd: list[str], out: Path, stage: str, env: dict) -> tuple[int, float]:
    """Run a stage's command, its output appended to <stage>.log; every BEAT seconds <stage>.time gets the seconds
    of every attempt so far. (exit code, those seconds)."""
    before, t0 = spent(out, stage), time.time()

    def record():
        trajectories.write_text(out / f"{stage}.time", json.dumps({"seconds": before + time.time() - t0}) + "\n")
        return before + time.time() - t0
    with open(out / f"{stage}.log", "a") as log:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    return p.wait(timeout=BEAT), record()
                except subprocess.TimeoutExpired:
                    record()
        except BaseException:  # Ctrl-C: the stage's process goes too, as with subprocess.run
            p.kill()
            p.wait()
            raise


ADDED_SINCE = (("rollout", "fuse", False), ("trainer", "strategy", "fsdp2"))  # config fields added after stages were fingerprinted (section, key, default)


def fingerprint(out: Path, sft: dict, tiny: bool, base_tasks: int | None = None, conf: Path | None = None) \
        -> tuple[str, dict]:
    """What a finished stage was made with: a hash of the effective train config (<out>/recipe_config.py, or
    `conf`) but where it writes (a moved directory is the same recipe), the tasks it reads (the train and val
    sets as loaded: a data change makes every stage stale), the SFT options, --tiny and BASE_TASKS (where set);
    and the teacher's code, per file (sft_teachers.teacher_code: a stage made by an older teacher or reward is
    not reused silently; docstrings and comments do not count)."""
    from config import load_config_file, to_dict
    from sft_teachers import teacher_code
    from workflows import load_data, workflow
    cfg = load_config_file(str(conf or out / "recipe_config.py"))
    _, module, loader = workflow(cfg)
    config = to_dict(cfg)
    del config["trainer"]["output_dir"]
    for section, key, default in ADDED_SINCE:  # a field added later, at its default: old stages stay valid
        if config[section].get(key) == default:
            del config[section][key]
    what = {"config": config, "sft": sft, "tiny": tiny, **({"base_tasks": base_tasks} if base_tasks else {}),
            "tasks": hashlib.sha256(json.dumps(load_data(cfg), sort_keys=True, default=str).encode()).hexdigest()}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16], \
        teacher_code(module, loader)


def legacy_fingerprint(out: Path, sft: dict, tiny: bool, base_tasks: int | None = None, conf: Path | None = None):
    """The fingerprint recipes.py gave stages before it held the tasks' content (and held the output path)."""
    from config import load_config_file, to_dict
    what = {"config": to_dict(load_config_file(str(conf or out / "recipe_config.py"))), "sft": sft, "tiny": tiny,
            **({"base_tasks": base_tasks} if base_tasks else {})}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def stale(out: Path, fp: str, code: dict, legacy: str | None = None) -> list[str]:
    """Finished stages made with another recipe: its config, tasks, SFT options or --tiny changed since, or the
    teacher's code (the changed files named). A stage finished before the code (or the tasks) was recorded is
    taken as it is, with a note."""
    old = []
    for s in STAGES:
        m = marker(out, s)[0]
        if m is None:
            continue
        if legacy and m["fingerprint"] == legacy and legacy != fp:
            print(f"  note: stage {s} was finished before recipes.py recorded the tasks' content: not checked")
        elif m["fingerprint"] != fp:
            old.append(s)
            continue
        if "code" not in m:
            print(f"  note: stage {s} was finished before recipes.py recorded the teacher's code: not checked")
        elif m["code"] != code:
            changed = sorted(f for f in set(m["code"]) | set(code) if m["code"].get(f) != code.get(f))
            old.append(f"{s} (the teacher's code changed: {', '.join(changed)})")
    return old


def compare_rows(out: Path, arms: list[str], name: str, flags: tuple[str, ...] = ()) -> list[dict]:
    """compare.py's rows for these arms (each with `paired`: the first arm against it), via its --json."""
    path = out / f"compare_{name}.json"
    with open(out / "compare.log", "a") as log:
        rc = subprocess.run([sys.executable, "compare.py", *arms, *flags, "--json", str(path)], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT).returncode
    if rc:
        sys.exit(f"recipes.py: compare.py {' '.join(arms)} failed (exit {rc}); its output: {out / 'compare.log'}")
    return json.loads(path.read_text())


def compare_stage(out: Path, name: str) -> dict:
    start, end, base = compare_rows(out, [f"{out / 'rl'}@0", str(out / "rl"), str(out / "base")], "vs_sft_start")
    gain, vs_base = end["paired"], compare_rows(out, [str(out / "base"), str(out / "rl")], "vs_base")[1]["paired"]
    for what, q in (("RL's end and its SFT start", gain), ("the base eval and RL's end", vs_base)):
        if not q["n"]:
            sys.exit(f"recipes.py: {out}: {what} share no val task (compare.log): nothing to pair")
    minutes = {s: m["seconds"] / 60 for s in STAGES[:-1] if (m := marker(out, s)[0])}  # every attempt's
    summary = {"workflow": name, "val_tasks": gain["n"], "steps": end["step"], "base": base["team"],
               "sft_start": start["team"], "rl_end": end["team"], "diff": gain["diff"], "se": gain["se"],
               "b": gain["b"], "c": gain["c"], "p": gain["p"], "n_vs_base": vs_base["n"], "diff_vs_base": vs_base["diff"],
               "se_vs_base": vs_base["se"], "rl_end_on_base_tasks": vs_base["y"], "minutes": minutes,
               "total_minutes": sum(minutes.values()),
               "learned": bool(gain["diff"] > 2 * gain["se"]) if math.isfinite(gain["se"]) else False}
    summary = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in summary.items()}  # JSON
    trajectories.write_text(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    curves(out, out / "curves.png")
    return summary


def curves(out: Path, png: Path):
    """Val team reward at each eval and every role's train reward at each step, from the RL run's metrics."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines() if x.strip().startswith("{")]
    fig, ax = plt.subplots(figsize=(7, 4))
    val = [(r["step"], r["val/team_reward"]) for r in rows if "val/team_reward" in r]
    if val:
        ax.plot(*zip(*val), "o-", lw=2, label="val team reward")
    for key in sorted({k for r in rows for k in r if k.startswith("train/reward/")}):
        pts = [(r["step"], r[key]) for r in rows if key in r]
        ax.plot(*zip(*pts), ".-", alpha=0.7, label=key.replace("train/reward/", "train: "))
    ax.set_xlabel("RL step (0 = the SFT start)")
    ax.set_ylabel("reward")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workflow", nargs="?", help="a recipe name (configs/cpu/<name>.py)")
    ap.add_argument("--out", help="output directory (default runs/recipes/<workflow>, --tiny: runs/recipes/tiny_<workflow>)")
    ap.add_argument("--tiny", action="store_true", help=f"the tiny random model, {TINY['total_steps']} RL steps, "
                    f"{TINY['val_size']} val tasks, replies of at most {TINY['max_tokens']} tokens: the plumbing")
    ap.add_argument("--plan", action="store_true", help="print the stages and their commands, run nothing")
    ap.add_argument("--list", action="store_true", help="list the recipes")
    ap.add_argument("--baselines", action="store_true", help="the team recipe, its one-agent baseline's (the recipe's "
                    "BASELINE), then both on the recipe's TEST_FILES at the SFT start and RL's end, with the baseline's "
                    "majority vote at the team's generated tokens: one paired table per stage (<out>/baselines.json)")
    ap.add_argument("--seed", type=int, help="another seed for every stage (SFT's order, split and new adapters, RL's "
                    "sampling and data order): another run of the same recipe, to see run-to-run variation (default: "
                    "the recipe's own, 0; output runs/recipes/<workflow>_seed<N>)")
    a = ap.parse_args(argv)
    if a.list or not a.workflow:
        print("\n".join(recipes()))
        return None
    if a.baselines and not a.plan:
        return baselines(a)
    recipe, cfg, sft = load_recipe(a.workflow)
    if a.seed is not None:
        if not 0 <= a.seed <= MAX_SEED:  # past it numpy refuses the seed: after minutes of SFT, at the base eval
            sys.exit(f"recipes.py: --seed must be an integer in [0, {MAX_SEED}], got {a.seed}")
        sft = {**sft, "seed": a.seed}  # sft.py --seed; the train config's trainer.seed: write_config
    name = ("tiny_" if a.tiny else "") + a.workflow + ("" if a.seed is None else f"_seed{a.seed}")
    try:
        out = Path(a.out or ROOT / "runs" / "recipes" / name).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        sys.exit(f"recipes.py: --out {a.out}: {e}")
    stages = plan(a.workflow, out, cfg, sft, a.tiny)
    print(f"recipe {a.workflow} -> {out}")
    for i, (stage, cmd) in enumerate(stages, 1):
        state = "done" if done(out, stage) else "to do"
        print(f"  {i}. {stage:8} [{state}] {' '.join(cmd[1:]) if cmd else 'compare.py rl@0 rl base -> summary.json'}")
    if a.plan:
        return None
    if up := next((d for d in [out, *out.parents] if os.path.lexists(d) and not d.is_dir()), None):
        sys.exit(f"recipes.py: --out {out}: {up} is a file, not a directory")
    from rundir import DirLock
    try:
        with DirLock(out, "recipes.py"):  # one recipe at a time in a directory
            summary = run(a, recipe, cfg, sft, out)
    except ConfigError as e:  # in use, or a directory this process cannot write
        sys.exit(f"recipes.py: {e}")
    except OSError as e:  # a write that fails (a full disk, a directory it may not write in)
        sys.exit(f"recipes.py: {out}: {e}")
    se = summary["se"]
    on = "" if summary["n_vs_base"] == summary["val_tasks"] else f" (its first {summary['n_vs_base']} tasks)"
    print(f"{a.workflow}: val team reward base {summary['base']:.3f}{on}, SFT start {summary['sft_start']:.3f} -> "
          f"RL end {summary['rl_end']:.3f} (paired diff {summary['diff']:+.3f} ± "
          f"{'—' if se is None else f'{se:.3f}'} s.e., n={summary['val_tasks']}), {summary['total_minutes']:.0f} min")
    return summary


def out_dir(a, name: str) -> Path:
    """Where recipe `name` runs under a's --tiny and --seed (--out names the team's directory only)."""
    return (ROOT / "runs" / "recipes" / (("tiny_" if a.tiny else "") + name + ("" if a.seed is None else f"_seed{a.seed}"))).resolve()


def test_split(name: str) -> tuple[str, str, int | None]:
    """(the baseline's recipe name, the test file, how many of its tasks) a team recipe names for --baselines."""
    path, mod = recipe_module(name)
    base, test, n = getattr(mod, "BASELINE", None), getattr(mod, "TEST_FILES", None), getattr(mod, "TEST_TASKS", None)
    if not isinstance(base, str) or not isinstance(test, str):
        sys.exit(f"recipes.py: {path}: --baselines needs BASELINE (the one-agent baseline's recipe name) and TEST_FILES "
                 f"(the held-out split), got BASELINE={base!r}, TEST_FILES={test!r}")
    recipe_module(base)  # one line when it is not a recipe
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        sys.exit(f"recipes.py: {path}: TEST_TASKS must be a positive int or None, got {n!r}")
    if not (ROOT / test).is_file():
        sys.exit(f"recipes.py: {path}: TEST_FILES {test!r}: no such file")
    return base, test, n


def stage_env() -> dict:
    """The environment of a stage's process: this one's, with the repo first on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def tokens_per_task(d: Path) -> float:
    """Generated tokens per task of an eval.py folder's greedy episodes (every role's turns)."""
    try:
        recs = trajectories.read(d / "greedy.jsonl")
    except trajectories.TrajectoryError as e:
        sys.exit(f"recipes.py: {e}")
    return sum(t.get("reply_tokens") or 0 for r in recs for t in r["turns"]) / max(1, len(recs))


def test_eval(out: Path, stage: str, test: str, n: int | None, tiny: bool, maj_k: int = 0) -> Path:
    """eval.py on the test split of this recipe's SFT start (its adapters: <out>/test_sft_config.py) or RL end (the
    last checkpoint), greedy, or with maj_k its majority vote -> <out>/test/<stage>[_maj]/ (kept while newer than
    the recipe's rl.done and made by the same command: the same split, task limit and vote; an unreadable one is
    made again)."""
    dest = out / "test" / (stage + ("_maj" if maj_k else ""))
    res, made_by = dest / "results.json", out / "test" / f"{dest.name}.command.json"
    args = ["--data", test] + (["--limit", str(2 if tiny else n)] if (tiny or n) else []) + \
        (["--maj-k", str(maj_k)] if maj_k else [])
    try:
        fresh = res.stat().st_mtime > (out / "rl.done").stat().st_mtime and json.loads(made_by.read_text()) == args \
            and isinstance(json.loads(res.read_text()), dict)
    except (OSError, ValueError):  # missing, or torn by a kill
        fresh = False
    if fresh:
        return dest
    if stage == "sft":
        conf = out / "test_sft_config.py"
        cfg = load_config_file(str(out / "recipe_config.py"))
        init = {r.name: str(out / "sft" / cfg.adapter_of(r)) for r in cfg.roles if adapter_written(out, cfg, r)}
        conf.write_text("# written by recipes.py --baselines: the recipe's config, every role from its SFT adapter\n"
                        "import dataclasses\n\nfrom config import load_config_file\n\n"
                        f"config = load_config_file({str(out / 'recipe_config.py')!r})\nINIT = {init!r}\n"
                        "config = dataclasses.replace(config, roles=tuple(dataclasses.replace(r, init_from=INIT.get(r.name)) "
                        "for r in config.roles))\n")
        where = ["--config", str(conf)]
    else:
        from rundir import ckpt_dirs
        steps = ckpt_dirs(out / "rl")  # by step number, no step_N.tmp
        if not steps:
            sys.exit(f"recipes.py: {out / 'rl' / 'checkpoints'} has no checkpoint to evaluate")
        where = ["--checkpoint", str(steps[-1])]
    cmd = [sys.executable, "eval.py", *where, "--out", str(dest), *args]
    print(f"[{time.strftime('%H:%M:%S')}] test eval: {' '.join(cmd[1:])}", flush=True)
    env = stage_env()
    with open(out / "test.log", "a") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if rc:
        sys.exit(f"recipes.py: the test eval {dest} failed (exit {rc}); its output: {out / 'test.log'}")
    trajectories.write_text(made_by, json.dumps(args) + "\n")
    return dest


def baselines(a) -> dict:
    """--baselines: the team's recipe and its baseline's, the test evals, maj@N, the paired tables."""
    team, (base, test, n) = a.workflow, test_split(a.workflow)
    flags = (["--tiny"] if a.tiny else []) + ([] if a.seed is None else ["--seed", str(a.seed)])
    tout = Path(a.out).resolve() if a.out else out_dir(a, team)
    main([team, *flags, "--out", str(tout)])
    bout = tout / "baseline" if a.out else out_dir(a, base)
    main([base, *flags, "--out", str(bout)])
    report = {"team": team, "baseline": base, "test_files": test, "stages": {}}
    for stage in ("sft", "rl"):
        t_dir, b_dir = test_eval(tout, stage, test, n, a.tiny), test_eval(bout, stage, test, n, a.tiny)
        t_tok, b_tok = tokens_per_task(t_dir), tokens_per_task(b_dir)
        k = max(1, round(t_tok / b_tok)) if b_tok > 0 else 1
        m_dir = test_eval(bout, stage, test, n, a.tiny, maj_k=k)
        rows = compare_rows(tout, [str(t_dir), str(b_dir), str(m_dir)], f"test_{stage}", ("--alone",))
        names = ["team", "single", f"single maj@{k}"] + [f"{r['alone']} alone (its first turn)" for r in rows[3:]]
        arms = [{"arm": arm, "dir": r["run"], "n": r["n"], "score": r["team"], "tokens_per_task": r.get("tokens"),
                 **({"vs_team": r["paired"]} if "paired" in r else {})}
                for arm, r in zip(names, rows)]
        report["stages"][stage] = {"maj_k": k, "team_tokens": t_tok, "single_tokens": b_tok, "arms": arms}
    trajectories.write_text(tout / "baselines.json", json.dumps(report, indent=1) + "\n")
    print(baselines_table(report))
    return report


def baselines_table(report: dict) -> str:
    """The paired table of --baselines: per stage, each arm's test score and tokens per task, and the team's
    paired difference over each baseline (team - baseline) with its s.e. and the sign test's p (compare.paired), on
    the tasks the two share (said in the cell where that is not all of them)."""
    lines = [f"{report['team']} vs {report['baseline']} on {report['test_files']}",
             "| stage | arm | n | score | tokens/task | team - arm | paired s.e. | z | sign p (McNemar for 0/1) |", "|---|---|---|---|---|---|---|---|---|"]
    for stage, st in report["stages"].items():
        for x in st["arms"]:
            q = x.get("vs_team")
            cells = [stage, x["arm"], str(x["n"]), f"{x['score']:.3f}",
                     "—" if x["tokens_per_task"] is None else f"{x['tokens_per_task']:.0f}"]
            if q and not q["n"]:
                cells += ["not paired: no task in common with the team", "", "", ""]
            elif q:
                se = q["se"] if q["se"] is not None and math.isfinite(q["se"]) else None
                shared = "" if q["n"] == x["n"] == st["arms"][0]["n"] else f" (on the {q['n']} shared)"
                cells += [f"{0.0 - q['diff']:+.3f}{shared}", "—" if se is None else f"{se:.3f}",
                          "—" if not se else f"{0.0 - q['diff'] / se:+.2f}", f"{q['p']:.3g}"]
            else:
                cells += ["", "", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("N of maj@N = max(1, round(team tokens/task / single tokens/task)): " + ", ".join(
        f"{stage} {st['team_tokens']:.0f} / {st['single_tokens']:.0f} -> {st['maj_k']}" for stage, st in report["stages"].items()))
    return "\n".join(lines)


def run(a, recipe: Path, cfg, sft: dict, out: Path) -> dict:
    """Every stage not finished, in order (main holds the directory's lock). The train config is written as
    recipe_config.next.py and renamed into place only once it is known not to be another recipe's."""
    n_base = base_tasks(a.workflow, a.tiny)
    conf, new = out / "recipe_config.py", out / "recipe_config.next.py"
    write_config(new, recipe, out, a.tiny, a.seed)
    fp, code = fingerprint(out, sft, a.tiny, n_base, new)
    if old := stale(out, fp, code, legacy_fingerprint(out, sft, a.tiny, n_base, new)):
        new.unlink()
        sys.exit(f"recipes.py: {out} holds stage(s) {', '.join(old)} done with another recipe (configs/cpu/"
                 f"{a.workflow}.py, its tasks, SFT options, --tiny or the teacher's code changed since): give --out a "
                 f"new directory, or delete {out}")
    os.replace(new, conf)
    env = stage_env()
    ran = False
    for k, stage in enumerate(STAGES):
        m, why = marker(out, stage)
        if m is not None and not (stage == "compare" and ran):  # a summary of stages that ran again is made again
            continue
        if why:
            print(f"  note: {why}: stage {stage} runs again")
        cmd = plan(a.workflow, out, cfg, sft, a.tiny)[k][1]  # after the SFT: only the adapters it wrote
        if stage == "rl":
            check_sft(out)
            for r in cfg.roles:
                if r.trainable and not adapter_written(out, cfg, r):
                    print(f"  note: the SFT wrote no adapter for role {r.name} (the teacher gave it no example): "
                          "it starts from the base model")
        t0 = time.time()
        print(f"[{time.strftime('%H:%M:%S')}] {stage}: {' '.join(cmd[1:]) if cmd else 'compare'}", flush=True)
        seconds = 0.0
        if cmd is None:
            compare_stage(out, a.workflow)
        else:
            rc, seconds = run_stage(cmd, out, stage, env)
            if rc:
                sys.exit(f"recipes.py: stage {stage} failed (exit {rc}); its output: {out / f'{stage}.log'}; "
                         "run the same command again to resume")
        if (fp, code) != fingerprint(out, sft, a.tiny, base_tasks(a.workflow, a.tiny)):  # each stage imported the
            # code (and plan() read BASE_TASKS) when it started
            sys.exit(f"recipes.py: the recipe or the teacher's code changed while stage {stage} ran: it is not marked "
                     f"done; run the same command again to redo it with the code as it is now")
        mark(out, stage, seconds or time.time() - t0, fp, code)
        ran = True
        print(f"[{time.strftime('%H:%M:%S')}] {stage} done in {(time.time() - t0) / 60:.1f} min", flush=True)
    return json.loads((out / "summary.json").read_text())


if __name__ == "__main__":
    main()
