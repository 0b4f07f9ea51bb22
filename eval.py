"""Evaluate a checkpoint (or the base model) on any dataset, without touching the training run.

    python eval.py --checkpoint runs/X/checkpoints/step_000024                  # greedy, the run's val set
    python eval.py --checkpoint runs/X/checkpoints/step_000024 --n-samples 4    # + mean@4 / pass@4
    python eval.py --checkpoint ... --data data/arith_val.jsonl --limit 100 --out /tmp/ev
    python eval.py --config configs/smollm2_math_cpu.py --base                  # the "before" number
    python eval.py --config my_cfg.py      # a config's starting adapters: its roles' init_from (sft.py's output)

Greedy: one episode per task, the same numbers train.py logs as val/* at that checkpoint's step.
Sampled (--n-samples k): k episodes per task at the roles' training temperatures; per role, a
task's score in one episode is the reward of that role's last turn (its final say), the team's is
the episode's team_reward; mean@k averages every episode, pass@k counts a task when one of its k
episodes scores >= --threshold. --base switches every adapter off (the reference policy).
Writes <checkpoint>/eval/results.json (or --out/results.json) and the episodes as trajectory files
(trajectories.py) next to it; the run's metrics.jsonl is never opened.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

import train
from config import load_config_file
from rollout import RoleSpec
from rundir import checkpoint_config
from workflows import load_data


def sampled_scores(cfg, eps, threshold: float) -> dict:
    """mean@k and pass@k per role and for the team, from k episodes per task."""
    by_task = defaultdict(lambda: defaultdict(list))  # task -> who -> [score per episode]
    for e in eps:
        last = {s.role: s.reward for s in e.steps}  # each role's final say in this episode
        for role, r in last.items():
            by_task[e.task_id][role].append(r)
        by_task[e.task_id]["team"].append(float(e.metrics.get("team_reward", 0.0)))
    out = {}
    for who in [r.name for r in cfg.roles] + ["team"]:
        per_task = [v[who] for v in by_task.values() if v[who]]
        if per_task:
            k = max(len(x) for x in per_task)
            out[f"mean@{k}/{who}"] = float(np.mean([r for x in per_task for r in x]))
            out[f"pass@{k}/{who}"] = float(np.mean([max(x) >= threshold for x in per_task]))
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", help="runs/X/checkpoints/step_N (its config.json is the config)")
    p.add_argument("--config", help="a configs/*.py file (with --base, or to evaluate with another config)")
    p.add_argument("--base", action="store_true", help="adapters off: the base model (the reference policy)")
    p.add_argument("--data", help="tasks to evaluate on (default: the config's data.val_files)")
    p.add_argument("--limit", type=int, help="first N tasks only (default: the config's data.val_size)")
    p.add_argument("--n-samples", type=int, default=0, help="k sampled episodes per task for mean@k / pass@k")
    p.add_argument("--threshold", type=float, default=1.0, help="score that counts as a pass (pass@k)")
    p.add_argument("--out", help="output directory (default: <checkpoint>/eval)")
    args = p.parse_args(argv)
    if not args.checkpoint and not args.config:
        p.error("give --checkpoint, or --config (with --base: adapters off; without: the roles' init_from adapters, "
                "fresh ones being the base)")
    ckpt = Path(args.checkpoint) if args.checkpoint else None
    ckpt_cfg = checkpoint_config(ckpt) if ckpt else None  # checked as resume checks it; one line if bad
    cfg = load_config_file(args.config) if args.config else ckpt_cfg
    out = Path(args.out) if args.out else (ckpt / "eval" if ckpt else Path(cfg.trainer.output_dir) / "eval_base")
    cfg = dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, val_files=args.data or cfg.data.val_files,
                                      val_size=args.limit if args.limit else cfg.data.val_size),
        rollout=dataclasses.replace(cfg.rollout, progress=False),
        trainer=dataclasses.replace(cfg.trainer, resume=str(ckpt) if ckpt and not args.base else "none",
                                    eval_only=bool(ckpt and not args.base), logger=("console",), resume_if_changed=True))
    cfg.validate()
    _, tasks = load_data(cfg)
    run, _ = train.build(cfg, ckpt if not args.base else None)
    specs = train.role_specs(cfg, None, greedy=True)
    if args.base:
        specs = {n: RoleSpec(None, s.sampling) for n, s in specs.items()}
    ids = list(range(train.RANK, len(tasks), train.WORLD))
    mine = [tasks[i] for i in ids]
    steps, eps = train.rollout(run.engine, run.tok, cfg, mine, ids, specs, 1)
    results = {"checkpoint": str(ckpt) if ckpt else None, "base": args.base, "step": run.step, "tasks": len(tasks),
               "data": cfg.data.val_files, **train.summarize(cfg, steps, eps, "greedy")}
    train.save_trajectories(run, eps, out / "greedy.jsonl", "eval_greedy", 1.0)
    if args.n_samples:
        sspecs = train.role_specs(cfg, cfg.trainer.seed + 12345)
        if args.base:
            sspecs = {n: RoleSpec(None, s.sampling) for n, s in sspecs.items()}
        _, seps = train.rollout(run.engine, run.tok, cfg, mine, ids, sspecs, args.n_samples)
        every = [e for part in train.gather_objects([_light(e) for e in seps]) for e in part]
        results.update(sampled_scores(cfg, every, args.threshold))
        train.save_trajectories(run, seps, out / "sampled.jsonl", "eval_sampled", 1.0)
    if train.RANK == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
        print(json.dumps({k: v for k, v in results.items() if "/reward/" in k or "@" in k or k.endswith("team_reward")},
                         indent=1))
        print(f"results: {out / 'results.json'}")
    return train.finish(results)


def _light(e):
    """An episode without its env (for gathering over ranks)."""
    return dataclasses.replace(e, env=None)


if __name__ == "__main__":
    main()
