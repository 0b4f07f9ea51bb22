"""Compare runs on their validation episodes: the README's single-agent vs team vs SFT+team table and plot.

    python compare.py runs/a_single runs/b_team runs/c_sft_team [--step N] [--plot compare.png]

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
The plot: validation team reward against step and against training wall time, one line per run.
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
    ckpts = sorted((run / "checkpoints").glob("step_*/config.json"))
    if not ckpts:
        raise SystemExit(f"compare.py: {run} has no checkpoints/step_*/config.json (is it a train.py run directory?)")
    return from_dict(json.loads(ckpts[-1].read_text()))


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
    cfg = run_config(run)
    make_env, module, _ = workflow(cfg)
    files = {int(re.search(r"(\d+)", p.stem.rsplit("_", 1)[-1]).group(1)): p
             for p in (run / "trajectories").glob("val_step_*.jsonl")}
    if not files:
        raise SystemExit(f"compare.py: {run}/trajectories has no val_step_*.jsonl")
    times = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    curve = []
    for s in sorted(files):
        ms = replay(trajectories.read(files[s]), make_env, str(files[s]))
        team = [m.get("team_reward", 0.0) for m in ms]
        wall = sum(r.get("time/step", 0.0) for r in times if 0 < r["step"] <= s)
        curve.append({"step": s, "n": len(ms), "team": sum(team) / len(team), "wall": wall, "metrics": ms})
    pick = curve[-1] if step is None else next((c for c in curve if c["step"] == step), None)
    if pick is None:
        raise SystemExit(f"compare.py: {run} has no eval at step {step} (evals at {sorted(files)})")
    ms, p, n = pick["metrics"], pick["team"], pick["n"]
    agg = module.aggregate([types.SimpleNamespace(metrics=m) for m in ms]) if hasattr(module, "aggregate") else {}
    counts = {k: sum(m.get(k, 0) for m in ms) for k in ("initial_correct", "refine_fixed", "refine_broken")
              if any(k in m for m in ms)}  # the math teams' counts; other workflows report none
    return {"run": str(run), "roles": len(cfg.roles), "step": pick["step"], "n": n, "team": p,
            "team_sd": math.sqrt(p * (1 - p) / n), "wall": pick["wall"], "aggregate": agg, "counts": counts,
            "curve": [(c["step"], c["wall"], c["team"]) for c in curve]}


def table(rows: list[dict]) -> str:
    keys = sorted({k for r in rows for k in r["aggregate"]})
    head = ["run", "roles", "step", "train wall", "team ± s.d.", "initial"] + keys + ["fixed/broken"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        c = r["counts"]
        cells = [Path(r["run"]).name, str(r["roles"]), str(r["step"]), f"{r['wall'] / 60:.0f} min",
                 f"{r['team']:.3f} ± {r['team_sd']:.3f}",
                 f"{c['initial_correct'] / r['n']:.3f}" if "initial_correct" in c else "—"]
        cells += [f"{r['aggregate'][k]:.3f}" if k in r["aggregate"] else "—" for k in keys]
        cells.append(f"{c['refine_fixed']:.0f}/{c['refine_broken']:.0f}" if r["roles"] > 1 and "refine_fixed" in c
                     else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], out: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="train.py run directories")
    ap.add_argument("--step", type=int, default=None, help="the eval step to tabulate (default: each run's last)")
    ap.add_argument("--plot", default=None, help="write the validation curves to this PNG")
    ap.add_argument("--json", default=None, help="also write the rows (curves included) to this JSON file")
    a = ap.parse_args(argv)
    rows = [summarise(Path(r), a.step) for r in a.runs]
    print(table(rows))
    if a.plot:
        plot(rows, a.plot)
        print(f"plot: {a.plot}")
    if a.json:
        Path(a.json).write_text(json.dumps([{k: v for k, v in r.items()} for r in rows], indent=1))
    return rows


if __name__ == "__main__":
    main()
