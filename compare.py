"""Compare runs on their validation episodes: the arm table, paired statistics and the plot.

    python compare.py runs/a_single runs/b_team runs/c_sft_team [--step N] [--plot compare.png]
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
An arm may also be an eval.py output directory (results.json + greedy.jsonl, or majority.jsonl for
--maj-k: each task's majority-vote answer), e.g. a single agent given the team's number of generations.
Paired statistics, for the first arm against every other on the tasks both answered (matched by the
task's question and answer):
    diff    mean of d_i = y_i - x_i (the other arm minus the first), per task correctness
    s.e.    the paired standard error sd(d) / sqrt(n) (sample sd, n - 1)
    b / c   discordant tasks: the first arm right and the other wrong / the other way round
    p       McNemar's exact test: 2 * P(Binomial(b + c, 1/2) <= min(b, c)), capped at 1
The plot: validation team reward against step and against training wall time, one line per run.
A run killed before its first checkpoint is read through the config.json train.py writes at start.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import types
from pathlib import Path

import trajectories
from config import from_dict
from workflows import workflow


def run_config(run: Path):
    ckpts = sorted((run / "checkpoints").glob("step_*/config.json")) or [p for p in [run / "config.json"] if p.is_file()]
    if not ckpts:
        raise SystemExit(f"compare.py: {run} has neither config.json nor checkpoints/step_*/config.json (is it a "
                         "train.py run directory?)")
    return from_dict(json.loads(ckpts[-1].read_text()))


def task_key(task: dict) -> str:
    return json.dumps([task.get("question"), str(task.get("answer"))])


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts: 2 P(Binom(b + c, 1/2) <= min(b, c))."""
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n)


def paired(x: dict, y: dict) -> dict:
    """Paired comparison of two arms' per-task scores (dicts task key -> 0/1) on their common tasks."""
    keys = sorted(set(x) & set(y))
    n = len(keys)
    d = [y[k] - x[k] for k in keys]
    mean = sum(d) / max(n, 1)
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1)) if n > 1 else float("nan")
    b = sum(1 for k in keys if x[k] >= 1 and y[k] < 1)
    c = sum(1 for k in keys if x[k] < 1 and y[k] >= 1)
    return {"n": n, "x": sum(x[k] for k in keys) / max(n, 1), "y": sum(y[k] for k in keys) / max(n, 1), "diff": mean,
            "se": sd / math.sqrt(n) if n > 1 else float("nan"), "b": b, "c": c, "p": mcnemar_exact(b, c)}


def summarise_eval(d: Path) -> dict:
    """An eval.py output directory as an arm: majority.jsonl (maj@k) if there, else greedy.jsonl."""
    res = json.loads((d / "results.json").read_text())
    maj = d / "majority.jsonl"
    if maj.is_file():
        rows = [json.loads(x) for x in maj.read_text().splitlines() if x.strip()]
        per_task = {task_key(r["task"]): float(r["correct"]) for r in rows}
        label = f"maj@{res.get('maj_k')}"
        gens = res.get("generations_per_task")
    else:
        recs = trajectories.read(d / "greedy.jsonl")
        per_task = {task_key(r["task"]): float(r["metrics"].get("team_reward", 0.0)) for r in recs}
        label, gens = "greedy", None
    n, p = len(per_task), sum(per_task.values()) / max(len(per_task), 1)
    return {"run": f"{d} ({label})", "roles": None, "step": res.get("step"), "n": n, "team": p,
            "team_sd": math.sqrt(p * (1 - p) / max(n, 1)), "wall": 0.0, "aggregate": {}, "per_task": per_task,
            "counts": {}, "curve": [],
            "generations": gens}


def replay(records: list[dict], make_env, where: str) -> list[dict]:
    """Each episode's metrics, recomputed by a fresh env fed the recorded replies."""
    out = []
    for r in records:
        env = make_env()
        env.reset(r["task"])
        for t in r["turns"]:
            env.step(t["reply"])
        for t, got in zip(r["turns"], env.turn_rewards()):
            if t["reward"] is not None and abs(got - t["reward"]) > 1e-6:
                raise ValueError(f"{where}: task {r['task_id']} turn {t['turn']} ({t['role']}) replays to reward "
                                 f"{got}, recorded {t['reward']}: the env changed since the run")
        out.append(env.metrics())
    return out


def summarise(run: Path, step: int | None = None) -> dict:
    if (run / "results.json").is_file():
        return summarise_eval(run)
    cfg = run_config(run)
    make_env, module, _ = workflow(cfg)
    files = {int(re.search(r"(\d+)", p.stem.rsplit("_", 1)[-1]).group(1)): p
             for p in (run / "trajectories").glob("val_step_*.jsonl")}
    if not files:
        raise SystemExit(f"compare.py: {run}/trajectories has no val_step_*.jsonl")
    times = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    curve = []
    for s in sorted(files):
        recs = trajectories.read(files[s])
        ms = replay(recs, make_env, str(files[s]))
        team = [m.get("team_reward", 0.0) for m in ms]
        wall = sum(r.get("time/step", 0.0) for r in times if 0 < r["step"] <= s)
        gens = sum(len(r["turns"]) for r in recs) / max(len(recs), 1)
        curve.append({"step": s, "n": len(ms), "team": sum(team) / len(team), "wall": wall, "metrics": ms,
                      "per_task": {task_key(r["task"]): t for r, t in zip(recs, team)}, "generations": gens})
    pick = curve[-1] if step is None else next((c for c in curve if c["step"] == step), None)
    if pick is None:
        raise SystemExit(f"compare.py: {run} has no eval at step {step} (evals at {sorted(files)})")
    ms, p, n = pick["metrics"], pick["team"], pick["n"]
    agg = module.aggregate([types.SimpleNamespace(metrics=m) for m in ms]) if hasattr(module, "aggregate") else {}
    counts = {k: sum(m.get(k, 0) for m in ms) for k in ("initial_correct", "refine_fixed", "refine_broken")
              if any(k in m for m in ms)}  # the math teams' counts; other workflows report none
    return {"run": str(run), "roles": len(cfg.roles), "step": pick["step"], "n": n, "team": p,
            "team_sd": math.sqrt(p * (1 - p) / n), "wall": pick["wall"], "aggregate": agg, "counts": counts,
            "curve": [(c["step"], c["wall"], c["team"]) for c in curve], "per_task": pick["per_task"],
            "generations": pick["generations"]}


def name(r: dict) -> str:
    return r["run"] if r["roles"] is None else Path(r["run"]).name


def table(rows: list[dict]) -> str:
    keys = sorted({k for r in rows for k in r["aggregate"]})
    head = ["run", "roles", "step", "train wall", "gens/task", "team ± s.d.", "initial"] + keys + ["fixed/broken"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        c = r["counts"]
        cells = [name(r), str(r["roles"] or "—"), str(r["step"]), f"{r['wall'] / 60:.0f} min",
                 f"{r['generations']:.2f}" if r.get("generations") else "—",
                 f"{r['team']:.3f} ± {r['team_sd']:.3f}",
                 f"{c['initial_correct'] / r['n']:.3f}" if "initial_correct" in c else "—"]
        cells += [f"{r['aggregate'][k]:.3f}" if k in r["aggregate"] else "—" for k in keys]
        cells.append(f"{c['refine_fixed']:.0f}/{c['refine_broken']:.0f}" if (r["roles"] or 0) > 1 and "refine_fixed" in c
                     else "—")
        lines.append("| " + " | ".join(cells).replace("nan", "—") + " |")
    return "\n".join(lines)


def paired_table(rows: list[dict]) -> str:
    """The first arm against every other, on their common tasks."""
    head = ["first arm", "other arm", "n", "first", "other", "diff (other - first)", "paired s.e.", "diff / s.e.",
            "b / c", "McNemar p"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows[1:]:
        q = paired(rows[0]["per_task"], r["per_task"])
        z = q["diff"] / q["se"] if q["se"] and q["se"] == q["se"] else float("nan")
        lines.append("| " + " | ".join([name(rows[0]), name(r), str(q["n"]), f"{q['x']:.3f}", f"{q['y']:.3f}",
                                         f"{q['diff']:+.3f}", f"{q['se']:.3f}", f"{z:+.2f}", f"{q['b']} / {q['c']}",
                                         f"{q['p']:.3g}"]) + " |")
    return "\n".join(lines)


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


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="train.py run directories")
    ap.add_argument("--step", type=int, default=None, help="the eval step to tabulate (default: each run's last)")
    ap.add_argument("--plot", default=None, help="write the validation curves to this PNG")
    ap.add_argument("--json", default=None, help="also write the rows (curves included) to this JSON file")
    a = ap.parse_args(argv)
    rows = [summarise(Path(r), a.step) for r in a.runs]
    print(table(rows))
    if len(rows) > 1:
        print()
        print(paired_table(rows))
    if a.plot:
        plot(rows, a.plot)
        print(f"plot: {a.plot}")
    if a.json:
        Path(a.json).write_text(json.dumps([{k: v for k, v in r.items()} for r in rows], indent=1))
    return rows


if __name__ == "__main__":
    main()
