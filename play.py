"""Play one episode of a trained team by hand and read every role's turn.

    python play.py --checkpoint runs/smollm2_math_cpu/checkpoints/step_000024 "What is 17 * 23?"
    python play.py --config configs/smollm2_math_cpu.py --base "What is 17 * 23?" --answer 391
    python play.py --checkpoint ... --sample --seed 3 "What is 17 * 23?"

Greedy unless --sample (the roles' training temperatures). --answer lets the workflow score the
episode (rewards are printed at the end); without it they mean little.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: docs/benchmarks.md "Threads"

import argparse
import dataclasses
from pathlib import Path

import session
from config import ConfigError, load_config_file
from rollout import RoleSpec
from rundir import checkpoint_config
from workflows import check_names, check_roles


def main(argv=None):
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    p.add_argument("question", help="the task's question (the workflow's task['question'])")
    p.add_argument("--checkpoint", help="runs/X/checkpoints/step_N")
    p.add_argument("--config", help="a configs/*.py file (for --base, or instead of the checkpoint's)")
    p.add_argument("--base", action="store_true", help="adapters off: the base model")
    p.add_argument("--answer", default="", help="the reference answer, so the workflow can score the episode")
    p.add_argument("--sample", action="store_true", help="sample at the roles' temperatures instead of greedy")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not args.checkpoint and not (args.config and args.base):
        p.error("give --checkpoint, or --config with --base")
    ckpt = Path(args.checkpoint) if args.checkpoint else None
    ckpt_cfg = checkpoint_config(ckpt) if ckpt else None  # checked as resume checks it; one line if bad
    try:
        cfg = load_config_file(args.config) if args.config else ckpt_cfg
        R = dataclasses.replace
        cfg = R(cfg, rollout=R(cfg.rollout, progress=False), trainer=R(
            cfg.trainer, resume=str(ckpt) if ckpt and not args.base else "none", eval_only=bool(ckpt and not args.base),
            logger=("console",)))
        cfg.validate()
        check_names(cfg)  # the workflow's own checks, as train.py makes them (an unknown env keyword: one line)
        check_roles(cfg)
    except (ConfigError, FileNotFoundError, TypeError) as e:  # --config: one line, not a traceback
        raise SystemExit(f"error: {' '.join(str(e).split())}") from None
    try:
        run, _ = session.build(cfg, ckpt if not args.base else None, train=False)
    except ConfigError as e:  # the checkpoint or an init_from adapter does not fit the config: one line
        raise SystemExit(f"error: {' '.join(str(e).split())}") from None
    specs = session.role_specs(cfg, args.seed if args.sample else None, greedy=not args.sample)
    if args.base:
        specs = {n: RoleSpec(None, s.sampling) for n, s in specs.items()}
    _, eps = session.episodes(run.engine, run.tok, cfg, [{"question": args.question, "answer": args.answer}], [0], specs, 1)
    ep = eps[0]
    for s in ep.samples:
        print(f"--- {s.role} (turn {s.turn}, {len(s.completion_ids)} tokens, {s.finish_reason})\n{s.text}\n")
    print("rewards: " + ", ".join(f"{s.role} {s.reward:.2f}" for s in ep.samples)
          + (" | truncated" if ep.truncated else "") + (f" | env error: {ep.error}" if ep.error else ""))
    return ep


if __name__ == "__main__":
    main()
