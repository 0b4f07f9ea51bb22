"""Evaluate a checkpoint (or the base model) on any dataset, without touching the training run.

    python eval.py --checkpoint runs/X/checkpoints/step_000024                  # greedy, the run's val set
    python eval.py --checkpoint runs/X/checkpoints/step_000024 --n-samples 4    # + mean@4 / pass@4
    python eval.py --checkpoint ... --data data/arith_val.jsonl --limit 100 --out /tmp/ev
    python eval.py --config configs/smollm2_math_cpu.py --base                  # the "before" number
    python eval.py --config my_cfg.py      # a config's starting adapters: its roles' init_from (sft.py's output)
    python eval.py --checkpoint runs/a_single/checkpoints/step_000024 --maj-k 3   # majority vote of 3 samples

Greedy: one episode per task, the same numbers train.py logs as val/* at that checkpoint's step.
Sampled (--n-samples k): k episodes per task at the roles' training temperatures; per role, a
task's score in one episode is the reward of that role's last turn (its final say), the team's is
the episode's team_reward; mean@k averages every episode, pass@k counts a task when one of its k
episodes scores >= --threshold. A role that takes no turn in some episodes (a refiner called only when the
tests fail) gets mean@acted / pass@acted instead, over the episodes where it acted (a task where it never
did left out), and acted/<role>, the share of the k episodes of every task in which it took a turn.
--maj-k k: majority vote over the final answers (env.final_answer(), normalised) of k sampled episodes per
task, ties to the answer seen first, no-answer samples not voting; a task counts when the voted answer is
right (a single agent given the generations a team spends). Written per task to majority.jsonl; compare.py
reads it as an arm.
--base switches every adapter off (the reference policy).
Writes <checkpoint>/eval/results.json (or --out/results.json) and the episodes as trajectory files
(trajectories.py) next to it; the run's metrics.jsonl is never opened. An eval replaces the files of an
earlier one in its folder (none of them stays: compare.py read a stale majority.jsonl), results.json
last. An --out inside a checkpoint's own files (its root, adapters/, tokenizer/, ...) is refused
(rundir.check_out): a results.json among the adapters makes the checkpoint unusable; a new folder in
it (eval/, eval_maj/) is fine, and checkpoint rotation keeps it.
A bad argument (a count below its minimum, a non-finite threshold, a missing config or data file, a
bad checkpoint) ends the program with one line before any model loads, never a traceback.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: docs/benchmarks.md "Threads"

import argparse
import dataclasses
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

import collectives
import session
import trajectories
from config import ConfigError, load_config_file
from data.math_data import DataError
from rollout import RoleSpec
from rundir import check_out, checkpoint_config
from workflows import check_names, check_roles, load_data

def fail(msg: str):
    raise SystemExit(f"error: {msg}")


def sampled_scores(cfg, eps, threshold: float) -> dict:
    """mean@k and pass@k per role and for the team, from k episodes per task."""
    by_task = defaultdict(lambda: defaultdict(list))  # task -> who -> [score per episode]
    for e in eps:
        last = {s.role: s.reward for s in e.samples}  # each role's final say in this episode
        for role, r in last.items():
            by_task[e.task_id][role].append(r)
        by_task[e.task_id]["team"].append(float(e.metrics.get("team_reward", 0.0)))
    out, k = {}, max((len(v["team"]) for v in by_task.values()), default=0)
    for who in [r.name for r in cfg.roles] + ["team"]:
        per_task = [v[who] for v in by_task.values() if v[who]]
        if per_task:
            acted = sum(map(len, per_task)) / (k * len(by_task))  # of the k episodes of every task
            tag = k if acted == 1 else "acted"  # a role that spoke in only some: over those, and named so
            out[f"mean@{tag}/{who}"] = float(np.mean([r for x in per_task for r in x]))
            out[f"pass@{tag}/{who}"] = float(np.mean([max(x) >= threshold for x in per_task]))
            if who != "team":
                out[f"acted/{who}"] = acted
    return out


def majority_vote(samples: list[tuple[str | None, float]]) -> tuple[str | None, float, dict]:
    """[(final answer or None, that episode's score)] -> (voted answer, its score, votes per answer).
    Answers are compared by rewards.math.answer_key; a tie goes to the answer seen first; samples
    without an answer do not vote; no answer at all scores 0."""
    from rewards.math import answer_key
    votes, score, first = {}, {}, {}
    for i, (ans, sc) in enumerate(samples):
        if ans is None:
            continue
        key = answer_key(ans)
        votes[key] = votes.get(key, 0) + 1
        score.setdefault(key, sc)
        first.setdefault(key, i)
    if not votes:
        return None, 0.0, {}
    best = max(votes, key=lambda k: (votes[k], -first[k]))
    return best, float(score[best]), votes


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--checkpoint", help="runs/X/checkpoints/step_N (its config.json is the config)")
    p.add_argument("--config", help="a configs/*.py file (with --base, or to evaluate with another config)")
    p.add_argument("--base", action="store_true", help="adapters off: the base model (the reference policy)")
    p.add_argument("--data", help="tasks to evaluate on (default: the config's data.val_files)")
    p.add_argument("--limit", type=int, help="first N tasks only (default: the config's data.val_size)")
    p.add_argument("--n-samples", type=int, default=0, help="k sampled episodes per task for mean@k / pass@k")
    p.add_argument("--threshold", type=float, default=1.0, help="score that counts as a pass (pass@k)")
    p.add_argument("--maj-k", type=int, default=0, help="majority vote over k sampled episodes' final answers")
    p.add_argument("--out", help="output directory (default: <checkpoint>/eval)")
    args = p.parse_args(argv)
    if not args.checkpoint and not args.config:
        p.error("give --checkpoint, or --config (with --base: adapters off; without: the roles' init_from adapters, "
                "fresh ones being the base)")
    for flag, v, lo in (("--n-samples", args.n_samples, 0), ("--maj-k", args.maj_k, 0), ("--limit", args.limit, 1)):
        if v is not None and v < lo:
            fail(f"{flag} must be an integer >= {lo}, got {v}")
    if not math.isfinite(args.threshold):
        fail(f"--threshold must be a finite number, got {args.threshold}")
    if args.out:
        check_out(Path(args.out))  # before the checkpoint is even read
    ckpt = Path(args.checkpoint) if args.checkpoint else None
    ckpt_cfg = checkpoint_config(ckpt) if ckpt else None  # checked as resume checks it; one line if bad
    try:
        cfg = load_config_file(args.config) if args.config else ckpt_cfg
        out = Path(args.out) if args.out else (ckpt / "eval" if ckpt else Path(cfg.trainer.output_dir) / "eval_base")
        check_out(out, "--out" if args.out else "the default output folder")
        cfg = dataclasses.replace(
            cfg, data=dataclasses.replace(cfg.data, val_files=args.data or cfg.data.val_files,
                                          val_size=args.limit if args.limit else cfg.data.val_size),
            trainer=dataclasses.replace(cfg.trainer, resume=str(ckpt) if ckpt and not args.base else "none",
                                        eval_only=bool(ckpt and not args.base), logger=("console",), resume_if_changed=True))
        cfg.validate()
        check_names(cfg)  # the workflow's own checks, as train.py makes them (an unknown env keyword: one line)
        check_roles(cfg)
        _, tasks = load_data(cfg)
    except (ConfigError, DataError, FileNotFoundError, TypeError) as e:  # --config, --data: one line, not a traceback
        msg = " ".join(str(e).split())
        fail(msg.replace("config field data.val_files:", "--data:") if args.data else msg)
    try:
        run, _ = session.build(cfg, ckpt if not args.base else None, train=False)
    except ConfigError as e:  # the checkpoint or an init_from adapter does not fit the config: one line
        fail(" ".join(str(e).split()))
    specs = session.role_specs(cfg, None, greedy=True)
    if args.base:
        specs = {n: RoleSpec(None, s.sampling) for n, s in specs.items()}
    ids = list(range(collectives.rank(), len(tasks), collectives.world()))
    mine = [tasks[i] for i in ids]
    samples, eps = session.episodes(run.engine, run.tok, cfg, mine, ids, specs, 1)
    results = {"checkpoint": str(ckpt) if ckpt else None, "base": args.base, "step": run.step, "tasks": len(tasks),
               "data": cfg.data.val_files, **session.eval_metrics(run, samples, eps, "greedy")}
    if collectives.rank() == 0:  # this eval replaces an earlier one in `out`: none of its files may stay (compare.py
        for f in ("results.json", "majority.jsonl", "sampled.jsonl"):  # scored an arm by a stale majority.jsonl);
            (out / f).unlink(missing_ok=True)  # results.json, written last, says the eval finished
    session.save_trajectories(run, eps, out / "greedy.jsonl", "eval_greedy", 1.0)
    k = max(args.n_samples, args.maj_k)
    if k:
        sspecs = session.role_specs(cfg, cfg.trainer.seed + 12345)
        if args.base:
            sspecs = {n: RoleSpec(None, s.sampling) for n, s in sspecs.items()}
        _, seps = session.episodes(run.engine, run.tok, cfg, mine, ids, sspecs, k)
        every = [e for part in collectives.gather_objects([_light(e) for e in seps]) for e in part]
        if args.n_samples:
            results.update(sampled_scores(cfg, [e for e in every if e.episode_id % k < args.n_samples], args.threshold))
        if args.maj_k:
            if any(not hasattr(e.env, "final_answer") for e in seps):
                p.error(f"--maj-k needs a workflow whose env has final_answer(); {cfg.data.env!r} has none")
            rows = majority_rows(tasks, seps, k, args.maj_k)
            results.update({f"maj@{args.maj_k}/team": float(np.mean([r["correct"] for r in rows])) if rows else 0.0,
                            "maj_k": args.maj_k, "generations_per_task": float(np.mean([r["generations"] for r in rows])),
                            "tokens_per_task": float(np.mean([r["tokens"] for r in rows]))})
            if collectives.rank() == 0:
                out.mkdir(parents=True, exist_ok=True)
                trajectories.write(out / "majority.jsonl", rows)
        session.save_trajectories(run, seps, out / "sampled.jsonl", "eval_sampled", 1.0)
    if collectives.rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        trajectories.write_text(out / "results.json", json.dumps(results, indent=1))
        print(json.dumps({k: v for k, v in results.items() if "/reward/" in k or "@" in k or k.endswith("team_reward")},
                         indent=1))
        print(f"results: {out / 'results.json'}")
    return session.finish(results)


def majority_rows(tasks, eps, k: int, maj_k: int) -> list[dict]:
    """One row per task (over every rank): the majority vote of its first maj_k sampled episodes."""
    mine = [(e.task_id, e.episode_id % k, e.env.final_answer(), float(e.metrics.get("team_reward", 0.0)), len(e.samples),
             sum(len(s.completion_ids) for s in e.samples)) for e in eps]
    by_task = defaultdict(list)
    for t, c, ans, sc, n, tok in sorted(x for part in collectives.gather_objects(mine) for x in part):
        if c < maj_k:
            by_task[t].append((ans, sc, n, tok))
    rows = []
    for t, samples in sorted(by_task.items()):
        voted, correct, votes = majority_vote([(a, sc) for a, sc, _, _ in samples])
        rows.append({"task_id": t, "task": tasks[t], "votes": votes, "voted": voted, "correct": correct,
                     "generations": sum(x[2] for x in samples), "tokens": sum(x[3] for x in samples)})
    return rows


def _light(e):
    """An episode without its env (for gathering over ranks)."""
    return dataclasses.replace(e, env=None)


if __name__ == "__main__":
    main()
