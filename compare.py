"""Compare runs on their validation episodes: the arm table, paired statistics and the plot.

    python compare.py runs/a_single runs/b_team runs/c_sft_team [--step N] [--plot compare.png] [--judge-plot judge.png]
    python compare.py runs/a_single runs/a_single/checkpoints/step_000024/eval_maj runs/c_team --step 24

Each run's validation episodes (runs/X/trajectories/val_step_*.jsonl, written at every eval) are
REPLAYED through that run's own workflow (the config.json of its newest checkpoint): the env reads
the recorded replies again, so every number is the env's own code, also for metrics added after
the run was made (a replayed turn reward that differs from the recorded one is an error). Printed per
run, at eval step N (default: each run's last):
    team    mean team reward (the final answer's correctness for the math workflows) ± its binomial
            s.d. sqrt(p (1 - p) / n), n = validation episodes
    the workflow's own aggregate (math team: evaluator balanced accuracy, precision, recall, refine
            fix rate and break rate; video team: accuracy by question type, agreement rate, ...) and,
            for the math teams, the initial accuracy and the summed refinement counts: fixed / broken
    train   wall seconds of the training steps up to N (metrics.jsonl's time/step; evals excluded)
    gens, tokens per task: model turns and generated tokens (every role's) per task, so arms compare at their
            budgets (a maj@k arm: its k samples' together)
An arm may also be an eval.py output directory (results.json + greedy.jsonl, or majority.jsonl for
--maj-k: each task's majority-vote answer), e.g. a single agent given the team's number of generations.
An arm RUN@N is that run at its eval of step N whatever --step: `compare.py runs/X@0 runs/X` pairs a run's
end with its own start (recipes.py: RL against the SFT it started from); an eval.py folder holds one step,
so EVAL@N names it or is one line.
--alone: the first arm's own members run alone, each one more arm, where the first arm is an eval.py folder whose
env logs `<role>_alone` per episode (envs/reason_code.py: a role's round-1 answer, whose prompt is the task alone,
so its score as a one-turn agent with the same adapter): a team that beats every other arm may still lose to one
of its members.
Paired statistics, for the first arm against every other on the tasks both answered (matched by the
whole task record: question, answer, and for video tasks the video, its clips and the choices; a task
a val set holds twice pairs its first copy with the other arm's first copy, and so on). Arms whose task
sets differ are paired on the tasks they share, and a note under the table says how many of each
arm's that is; arms that share no task get a note and no row:
    diff    mean of d_i = y_i - x_i (the other arm minus the first), per task score
    s.e.    the paired standard error sd(d) / sqrt(n) (sample sd, n - 1)
    b / c   the tasks the other arm scores below / above the first (d_i < 0 / d_i > 0); with 0/1 scores, the
            discordant tasks: the first arm right and the other wrong / the other way round
    p       the exact sign test on them, 2 * P(Binomial(b + c, 1/2) <= min(b, c)), capped at 1: McNemar's exact
            test where scores are 0/1, and a test of the same differences as `diff` where they are not (an F1, a
            fraction of tests passed)
The plot: validation team reward against step and against training wall time, one line per run.
The judge plot (--judge-plot): per run that logged one, the judge's balanced accuracy and false-positive
rate against step, on train batches and val, on the team's verdicts and on the probes (metrics.jsonl).
A run killed before its first checkpoint is read through the config.json train.py writes at start
(and a torn last line of its metrics.jsonl is left out). Anything else that is not a run or eval
directory of this shape (a file missing, garbage, a step that does not match its file) ends the
program with one line naming the file, line and field (SystemExit), never a traceback.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import types
from pathlib import Path

import trajectories
from config import ConfigError, from_dict
from envs import play_replies
from workflows import workflow


def fail(msg: str):
    raise SystemExit(f"error: {msg}")


def read_text(path: Path) -> str:
    """A regular file's UTF-8 text (trajectories.read_bytes: no FIFO, device or oversized file), or one line."""
    try:
        return trajectories.read_bytes(path).decode("utf-8")
    except trajectories.TrajectoryError as e:
        fail(str(e))
    except UnicodeDecodeError as e:
        fail(f"{path}: not UTF-8 text (byte {e.start + 1})")


def read_json(path: Path, what: str):
    try:
        return json.loads(read_text(path))
    except (ValueError, RecursionError) as e:
        fail(f"{path}: not {what} (bad JSON: {' '.join(str(e).split())[:200]})")


def read_jsonl(path: Path, torn_ok: bool = False) -> list[tuple[str, object]]:
    """(f"{path}:{line}", value) per non-blank line; a line that is not JSON is one line naming it, except,
    with torn_ok, an unfinished last line (a run killed mid-write)."""
    text, out = read_text(path), []
    lines = text.split("\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append((f"{path}:{i}", json.loads(line)))
        except (ValueError, RecursionError) as e:
            if torn_ok and i == len(lines):  # no newline after it: torn
                continue
            fail(f"{path}:{i}: not JSON ({' '.join(str(e).split())[:200]})")
    return out


def finite(x) -> bool:
    """A finite int or float (not a bool; not a 400-digit integer that overflows a float)."""
    try:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    except OverflowError:
        return False


def run_config(run: Path):
    ckpts = sorted((p / "config.json" for p in (run / "checkpoints").glob("step_*")  # finished saves only, not .tmp
                    if re.fullmatch(r"step_\d+", p.name) and os.path.lexists(p / "config.json")),
                   key=lambda c: int(c.parent.name[5:])) or [run / "config.json"]
    if not os.path.lexists(ckpts[-1]):
        fail(f"{run} has neither config.json nor checkpoints/step_*/config.json (is it a train.py run directory?)")
    try:
        cfg = from_dict(read_json(ckpts[-1], "a config"))
        cfg.validate()
        return cfg
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:  # ConfigError included
        fail(f"{ckpts[-1]} is not a config ({type(e).__name__}: {' '.join(str(e).split())[:200]})")


def task_key(task: dict) -> str:
    """A task by everything that defines it: its whole record in canonical JSON (two video tasks asking the
    same question of different videos, or with other choices, are different tasks)."""
    return json.dumps(task, sort_keys=True, default=str)


def keyed(pairs) -> dict:
    """{task key: score} from (task, score) pairs. The k-th repeat of a task is its own key (key#k), so a
    val set holding a task twice pairs copy with copy instead of one copy overwriting the other."""
    out, seen = {}, {}
    for task, score in pairs:
        k = task_key(task)
        n = seen[k] = seen.get(k, -1) + 1
        out[f"{k}#{n}" if n else k] = score
    return out


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts: 2 P(Binom(b + c, 1/2) <= min(b, c)); the exact
    sign test when b / c count the tasks scored lower / higher."""
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n)


def paired(x: dict, y: dict) -> dict:
    """Paired comparison of two arms' per-task scores (dicts task key -> score) on their common tasks; with none in
    common, n = 0 and every statistic None (a pair that shares nothing is not "no difference")."""
    keys = sorted(set(x) & set(y))
    n = len(keys)
    if not n:
        return {"n": 0, "x": None, "y": None, "diff": None, "se": None, "b": 0, "c": 0, "p": None}
    d = [y[k] - x[k] for k in keys]
    mean = sum(d) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1)) if n > 1 else float("nan")
    b, c = sum(v < 0 for v in d), sum(v > 0 for v in d)  # the sign test's counts (McNemar's with 0/1 scores)
    return {"n": n, "x": sum(x[k] for k in keys) / n, "y": sum(y[k] for k in keys) / n, "diff": mean,
            "se": sd / math.sqrt(n) if n > 1 else float("nan"), "b": b, "c": c, "p": mcnemar_exact(b, c)}


def greedy_records(d: Path) -> list[dict]:
    """An eval.py folder's greedy episodes, or one line naming the bad record."""
    try:
        return trajectories.read(d / "greedy.jsonl")
    except trajectories.TrajectoryError as e:
        fail(str(e))


def summarise_eval(d: Path) -> dict:
    """An eval.py output directory as an arm: majority.jsonl (maj@k) if there, else greedy.jsonl."""
    res = read_json(d / "results.json", "eval.py's results")
    if not isinstance(res, dict):
        fail(f"{d / 'results.json'}: not eval.py's results (a JSON {type(res).__name__}, not an object)")
    maj = d / "majority.jsonl"
    if os.path.lexists(maj):
        pairs = []
        for where, r in read_jsonl(maj):
            if not isinstance(r, dict) or not isinstance(r.get("task"), dict):
                fail(f"{where}: field 'task' is missing or not an object")
            if not finite(r.get("correct")):
                fail(f"{where}: field 'correct' must be a finite number, got {str(r.get('correct'))[:60]!r}")
            pairs.append((r["task"], float(r["correct"])))
        maj_k = res.get("maj_k") if isinstance(res.get("maj_k"), int) else "?"
        per_task, label, gens, toks = keyed(pairs), f"maj@{maj_k}", res.get("generations_per_task"), \
            res.get("tokens_per_task")
        gens, toks = (gens if finite(gens) else None), (toks if finite(toks) else None)
    else:
        recs = greedy_records(d)
        per_task = keyed((r.get("task") or {}, float((r.get("metrics") or {}).get("team_reward") or 0.0)) for r in recs)
        label, gens = "greedy", None
        toks = sum(t.get("reply_tokens") or 0 for r in recs for t in r["turns"]) / max(len(recs), 1)
    if not per_task:
        fail(f"{maj if os.path.lexists(maj) else d / 'greedy.jsonl'} holds no task")
    step = res.get("step")
    n, p = len(per_task), sum(per_task.values()) / len(per_task)
    return {"run": f"{d} ({label})", "roles": None, "step": step if isinstance(step, int) else None, "n": n, "team": p,
            "team_sd": binomial_sd(p, n), "wall": 0.0, "aggregate": {}, "per_task": per_task,
            "counts": {}, "curve": [], "generations": gens, "tokens": toks}


def alone_arms(first: dict, d: Path) -> list[dict]:
    """--alone: one arm per `<role>_alone` metric in the eval folder d's greedy episodes (the first arm's), scored
    per task by it, so it pairs with the team on the same episodes."""
    if not (d / "results.json").is_file() or os.path.lexists(d / "majority.jsonl"):
        fail(f"--alone: {d} is not an eval.py folder of greedy episodes (its members are read from greedy.jsonl)")
    recs = greedy_records(d)
    names = sorted({k for r in recs for k in (r.get("metrics") or {}) if isinstance(k, str) and k.endswith("_alone")})
    if not names:
        print(f"note: --alone: {d / 'greedy.jsonl'} logs no <role>_alone metric (its env does not say what a member "
              "scores alone)")
    out = []
    for m in names:
        pairs = []
        for k, r in enumerate(recs):
            v = (r.get("metrics") or {}).get(m)
            if not finite(v):
                fail(f"{d / 'greedy.jsonl'}: record {k + 1}: field 'metrics.{m}' must be a finite number, got {str(v)[:60]!r}")
            pairs.append((r.get("task") or {}, float(v)))
        per_task = keyed(pairs)
        p = sum(per_task.values()) / len(per_task)
        out.append({**first, "run": f"{d} ({m.removesuffix('_alone')} alone)", "alone": m.removesuffix("_alone"),
                    "n": len(per_task), "team": p, "team_sd": binomial_sd(p, len(per_task)), "per_task": per_task,
                    "tokens": None, "generations": None})
    return out


def binomial_sd(p: float, n: int) -> float:
    """sqrt(p (1 - p) / n); nan (shown as —) for a mean team reward outside [0, 1], where it means nothing."""
    return math.sqrt(p * (1 - p) / n) if 0 <= p <= 1 and n else float("nan")


def replay(records: list[tuple[str, dict]], make_env, env_name: str) -> list[dict]:
    """Each episode's metrics, recomputed by a fresh env fed the recorded replies; records are
    (file:line, record) pairs. A task the env cannot play (a crafted or foreign file) is one line."""
    out = []
    for where, r in records:
        try:
            env = make_env()
            played = play_replies(env, r["task"], [t["reply"] for t in r["turns"]])  # a set handed out at once: its replies
            got_rewards, metrics = list(env.turn_rewards()), env.metrics()
        except Exception as e:  # the env's own code on a task it was not made for: name the episode, not a traceback
            fail(f"{where}: the episode does not replay through the {env_name} workflow ({type(e).__name__}: "
                 f"{' '.join(str(e).split())[:200]})")
        if len(played) != len(r["turns"]) or len(got_rewards) != len(r["turns"]):
            fail(f"{where}: task {r.get('task_id')} replays to {len(played)} turns, recorded {len(r['turns'])}: the env "
                 "changed since the run")
        for t, got in zip(r["turns"], got_rewards):
            if t.get("reward") is not None and abs(got - t["reward"]) > 1e-6:
                fail(f"{where}: task {r.get('task_id')} turn {t.get('turn')} ({t['role']}) replays to reward {got}, "
                     f"recorded {t['reward']}: the env changed since the run")
        was, now = (r.get("metrics") or {}).get("team_reward"), metrics.get("team_reward")
        if finite(was) and finite(now) and abs(now - was) > 1e-6:
            fail(f"{where}: task {r.get('task_id')} replays to team_reward {now}, recorded {was}: the env changed "
                 "since the run")
        out.append(metrics)
    return out


def wall_times(path: Path) -> list[tuple[int, float]]:
    """(step, seconds) from metrics.jsonl's time/step rows; a torn last line (a killed run) is left out."""
    if not os.path.lexists(path):
        fail(f"{path}: no such file (the run's log; compare.py reads the training wall time from it)")
    out = []
    for where, r in read_jsonl(path, torn_ok=True):
        if not isinstance(r, dict):
            fail(f"{where}: not a metrics row (a JSON {type(r).__name__}, not an object)")
        if isinstance(r.get("step"), bool) or not isinstance(r.get("step"), int):
            fail(f"{where}: field 'step' must be an integer, got {str(r.get('step'))[:60]!r}")
        if "time/step" in r:
            if not finite(r["time/step"]) or r["time/step"] < 0:
                fail(f"{where}: field 'time/step' must be a finite number >= 0, got {str(r['time/step'])[:60]!r}")
            out.append((r["step"], float(r["time/step"])))
    return out


def summarise(run: Path, step: int | None = None) -> dict:
    if not run.is_dir():
        fail(f"{run}: " + ("no such directory" if not os.path.lexists(run) else
                           "not a directory (give a train.py run directory or an eval.py output directory)"))
    if os.path.lexists(run / "results.json"):
        return summarise_eval(run)
    cfg = run_config(run)
    try:
        make_env, module, _ = workflow(cfg)
    except (ConfigError, ImportError) as e:
        fail(f"{run}: its config's workflow cannot be built ({' '.join(str(e).split())[:200]})")
    files = {}
    for p in sorted((run / "trajectories").glob("val_step_*.jsonl")):
        m = re.fullmatch(r"val_step_(\d+)\.jsonl", p.name)
        if m is None:
            fail(f"{p}: not a val_step_<step>.jsonl name")
        if int(m.group(1)) in files:
            fail(f"{p} and {files[int(m.group(1))]} are both the eval at step {int(m.group(1))}")
        files[int(m.group(1))] = p
    if not files:
        fail(f"{run}/trajectories has no val_step_*.jsonl")
    if step is not None and step not in files:
        fail(f"{run} has no eval at step {step} (evals at {sorted(files)})")
    times = wall_times(run / "metrics.jsonl")
    curve = []
    for s in sorted(files):
        try:
            recs = trajectories.read(files[s], with_source=True)
        except trajectories.TrajectoryError as e:
            fail(str(e))
        if not recs:
            fail(f"{files[s]}: no episode (an eval writes every validation episode)")
        for where, r in recs:
            if r.get("step") is not None and r["step"] != s:
                fail(f"{where}: field 'step' is {r['step']} in the file of the eval at step {s}")
            if not isinstance(r.get("task"), dict):
                fail(f"{where}: field 'task' is missing (compare.py replays the task)")
        ms = replay(recs, make_env, cfg.data.env)
        team = [float(m.get("team_reward", 0.0)) for m in ms]
        wall = sum(t for st, t in times if 0 < st <= s)
        gens = sum(len(r["turns"]) for _, r in recs) / len(recs)
        toks = sum(t.get("reply_tokens") or 0 for _, r in recs for t in r["turns"]) / len(recs)
        curve.append({"step": s, "n": len(ms), "team": sum(team) / len(team), "wall": wall, "metrics": ms,
                      "per_task": keyed((r["task"], t) for (_, r), t in zip(recs, team)), "generations": gens,
                      "tokens": toks})
    pick = curve[-1] if step is None else next(c for c in curve if c["step"] == step)
    ms, p, n = pick["metrics"], pick["team"], pick["n"]
    agg = module.aggregate([types.SimpleNamespace(metrics=m) for m in ms]) if hasattr(module, "aggregate") else {}
    counts = {k: sum(m.get(k, 0) for m in ms) for k in ("initial_correct", "refine_fixed", "refine_broken")
              if any(k in m for m in ms)}  # the math teams' counts; other workflows report none
    return {"run": str(run), "path": str(run), "roles": len(cfg.roles), "step": pick["step"], "n": n, "team": p,
            "team_sd": binomial_sd(p, n), "wall": pick["wall"], "aggregate": agg, "counts": counts,
            "curve": [(c["step"], c["wall"], c["team"]) for c in curve], "per_task": pick["per_task"],
            "generations": pick["generations"], "tokens": pick["tokens"]}


def name(r: dict) -> str:
    return r["run"] if r["roles"] is None else Path(r["run"]).name


def table(rows: list[dict]) -> str:
    keys = sorted({k for r in rows for k in r["aggregate"]})
    head = ["run", "roles", "step", "train wall", "gens/task", "tokens/task", "team ± s.d.", "initial"] + keys + \
        ["fixed/broken"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        c = r["counts"]
        cells = [name(r), str(r["roles"] or "—"), str(r["step"]), f"{r['wall'] / 60:.0f} min",
                 f"{r['generations']:.2f}" if r.get("generations") else "—",
                 f"{r['tokens']:.0f}" if r.get("tokens") else "—",
                 f"{r['team']:.3f} ± {r['team_sd']:.3f}",
                 f"{c['initial_correct'] / r['n']:.3f}" if "initial_correct" in c else "—"]
        cells += [f"{r['aggregate'][k]:.3f}" if k in r["aggregate"] else "—" for k in keys]
        cells.append(f"{c['refine_fixed']:.0f}/{c['refine_broken']:.0f}" if (r["roles"] or 0) > 1 and "refine_fixed" in c
                     else "—")
        lines.append("| " + " | ".join(cells).replace("nan", "—") + " |")
    return "\n".join(lines)


def paired_table(rows: list[dict]) -> str:
    """The first arm against every other, on their common tasks: a note says when that is not every task
    of both, and a pair with no common task gets the note instead of a row (no statistic over n = 0)."""
    head = ["first arm", "other arm", "n", "first", "other", "diff (other - first)", "paired s.e.", "diff / s.e.",
            "b / c", "sign p (McNemar for 0/1)"]
    lines, notes, first = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)], [], rows[0]
    for r in rows[1:]:
        q = paired(first["per_task"], r["per_task"])
        sizes = f"{name(first)} has {len(first['per_task'])} tasks, {name(r)} {len(r['per_task'])}"
        if q["n"] == 0:
            notes.append(f"note: {sizes} and they share none (tasks match by their whole record): not paired")
            continue
        if q["n"] < max(len(first["per_task"]), len(r["per_task"])):
            notes.append(f"note: {sizes}: paired on the {q['n']} they share only")
        z = q["diff"] / q["se"] if q["se"] and q["se"] == q["se"] else float("nan")
        lines.append("| " + " | ".join([name(first), name(r), str(q["n"]), f"{q['x']:.3f}", f"{q['y']:.3f}",
                                         f"{q['diff']:+.3f}", f"{q['se']:.3f}".replace("nan", "—"),
                                         f"{z:+.2f}" if z == z else "—", f"{q['b']} / {q['c']}",
                                         f"{q['p']:.3g}"]) + " |")
    return "\n".join((lines if len(lines) > 2 else []) + notes)


def plot(rows: list[dict], out: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in (r for r in rows if r["curve"]):
        steps, walls, team = zip(*r["curve"])
        for ax, x in zip(axes, (steps, [w / 60 for w in walls])):
            ax.plot(x, team, marker="o", label=Path(r["run"]).name)
    for ax, xl in zip(axes, ("step", "training wall time (min)")):
        ax.set(xlabel=xl, ylabel="val team reward", ylim=(-0.05, 1.05))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


JUDGE_KEYS = ("evaluator_balanced_acc", "evaluator_fpr", "probe_balanced_acc", "probe_fpr", "evaluator_check_acc")


def judge_curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    """The judge's curves as train.py logged them (metrics.jsonl): {"<split>/<key>": [(step, value)]} for
    split train (the step's own batch) and val, key in JUDGE_KEYS (evaluator_*: the team's verdicts;
    probe_*: the probes of envs/math_3agent.py probes=True, right first solutions and their near misses;
    evaluator_check_acc: the evaluator_prompt="blind" judge's own result, before it saw the solution).
    A step logged twice (a resumed run) keeps its last value; a torn last line is left out."""
    path = run / "metrics.jsonl"
    if not os.path.lexists(path):
        return {}
    got: dict[str, dict[int, float]] = {}
    for where, row in read_jsonl(path, torn_ok=True):
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            fail(f"{where}: not a metrics row (a JSON object with an integer 'step')")
        for split in ("train", "val"):
            for k in JUDGE_KEYS:
                if finite(v := row.get(f"{split}/{k}")):
                    got.setdefault(f"{split}/{k}", {})[row["step"]] = float(v)
    return {k: sorted(v.items()) for k, v in got.items()}


def judge_plot(runs: list[Path], out: str) -> list[Path]:
    """One row of panels per run that logged a judge: balanced accuracy and false-positive rate against
    step, train and val, the team's verdicts and the probes, with the judge's
    pre-registered targets dashed (balanced accuracy 0.75, FPR 0.3: docs/experiments.md).
    Returns the runs drawn. (The math team logs evaluator_* at every step, 0.0 on a step it judged nothing.)"""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curves = {r: c for r in runs if (c := judge_curves(r))}
    if not curves:
        fail(f"--judge-plot: no run logged a judge ({', '.join(JUDGE_KEYS)} in metrics.jsonl)")
    fig, axes = plt.subplots(len(curves), 2, figsize=(11, 3.2 * len(curves)), squeeze=False)
    for row, (run, c) in zip(axes, curves.items()):
        for ax, metric, target in zip(row, ("balanced_acc", "fpr"), (0.75, 0.3)):
            for who, label in (("evaluator", "verdicts"), ("probe", "probes"),
                               ("evaluator_check", "blind check (accuracy)")):
                for split, style in (("train", ":"), ("val", "-")):
                    key = f"{split}/{who}_{'acc' if who == 'evaluator_check' else metric}"
                    if (pts := c.get(key)) and (who != "evaluator_check" or metric == "balanced_acc"):
                        ax.plot(*zip(*pts), style, marker="o" if split == "val" else None, ms=4,
                                label=f"{split} {label}")
            ax.axhline(target, color="grey", ls="--", lw=0.8)
            ax.set(xlabel="step", ylabel=f"judge {metric.replace('_', ' ')}", ylim=(-0.05, 1.05),
                   title=f"{run.parent.name}/{run.name}: judge "
                         f"{'balanced accuracy' if metric == 'balanced_acc' else 'false-positive rate'}")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return list(curves)


def arm(r: str) -> tuple[Path, int | None]:
    """An arm argument: (its directory, the eval step it names or None). RUN@N, when no path of that name
    exists, is RUN at its eval of step N."""
    m = re.fullmatch(r"(.+)@(\d+)", r)
    if not m or os.path.lexists(r):
        return Path(r), None
    if len(m.group(2)) > 18:  # int() refuses past 4300 digits; no run has 10**18 steps
        fail(f"{m.group(1)[:200]}@{m.group(2)[:20]}... ({len(m.group(2))} digits): not a step")
    return Path(m.group(1)), int(m.group(2))


def output_path(out: str, runs: list[str], flag: str) -> Path:
    """An output file that will not clobber a run: its folder exists, and it is not a directory nor an
    existing file inside an arm (metrics.jsonl, a trajectory file, results.json...)."""
    path = Path(out)
    if path.is_dir() or not path.parent.is_dir():
        fail(f"{flag} {out}: " + ("is a directory" if path.is_dir() else f"no directory {path.parent}"))
    if os.path.lexists(path) and any(path.resolve().is_relative_to(arm(r)[0].resolve()) for r in runs):
        fail(f"{flag} {out}: refusing to overwrite a file inside a compared run (write it elsewhere)")
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="train.py run directories (RUN@N: that run's eval at step N) or eval.py "
                    "output directories")
    ap.add_argument("--step", type=int, default=None, help="the eval step to tabulate (default: each run's last)")
    ap.add_argument("--alone", action="store_true", help="add the first arm's members run alone (an eval.py folder "
                    "whose env logs <role>_alone), each paired with it")
    ap.add_argument("--plot", default=None, help="write the validation curves to this PNG")
    ap.add_argument("--json", default=None, help="also write the rows (curves included) to this JSON file")
    ap.add_argument("--judge-plot", default=None, help="write each run's judge curves (balanced accuracy and FPR "
                    "against step: train, val, probes) to this PNG")
    a = ap.parse_args(argv)
    outs = {flag: output_path(v, a.runs, flag) for flag, v in (("--plot", a.plot), ("--json", a.json),
                                                               ("--judge-plot", a.judge_plot)) if v}
    rows = []
    for r in a.runs:  # RUN@N: that run at its eval of step N (a run against its own start: RUN@0 RUN)
        d, step = arm(r)
        rows.append(summarise(d, a.step) if step is None else {**summarise(d, step), "run": r})
        if step is not None and rows[-1]["step"] != step:  # an eval.py folder holds one step (--step N: each run's)
            fail(f"{d} is eval.py's output of step {rows[-1]['step']}, not step {step}")
    if a.alone:
        rows += alone_arms(rows[0], arm(a.runs[0])[0])
    for r in rows[1:]:  # the first arm against each other (in --json; the printed table below)
        r["paired"] = paired(rows[0]["per_task"], r["per_task"])
    print(table(rows))
    if len(rows) > 1:
        print()
        print(paired_table(rows))
    for flag, path in outs.items():
        try:
            if flag == "--plot":
                plot(rows, str(path))
                print(f"plot: {path}")
            elif flag == "--judge-plot":
                runs = [Path(r["path"]) for r in rows if r["roles"] is not None]
                drawn = judge_plot(list(dict.fromkeys(runs)), str(path))
                print(f"judge plot: {path} ({', '.join(p.name for p in drawn)})")
            else:
                tmp = path.with_name(path.name + ".tmp")  # whole or not at all
                tmp.write_text(json.dumps([{k: v for k, v in r.items()} for r in rows], indent=1))
                os.replace(tmp, path)
        except (OSError, ValueError) as e:  # a full disk, a format matplotlib does not know
            fail(f"{flag} {path}: could not write it ({' '.join(str(e).split())[:200]})")
    return rows


if __name__ == "__main__":
    main()
