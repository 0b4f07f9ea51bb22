"""Training-step time of a workflow before and after the multi-turn savings (the prefix cache
and packed turns), in one run.

    python bench/step_time.py --config configs/math_tool.py                # SmolLM2-135M, one step each
    python bench/step_time.py --config configs/tiny_research.py --repeats 3

before: no prefix cache in the TorchEngine (--rollout.prefix-cache-tokens 0) and every turn its own row
        in the update (--algo.no-pack-turns): each turn prefills and trains on its whole history.
after:  the defaults: a turn whose prompt extends an earlier turn's prompt + reply under the same
        adapter prefills only its new tokens (engines.TorchEngine's prefix cache), and turns that extend
        one another share one row in the update (algo.pack_turns).
Each variant is a fresh `train.py` process running --steps training steps from the same seed (no val,
no checkpoint), the variants taking turns (before, after, before, ...) so a shared machine's load hits
both alike; medians over --repeats. Printed per variant: the step's rollout, update (time/train) and
total seconds, the prompt tokens the engine prefilled (perf/prefill_tokens), the rows the update read
(train/update_rows, summed over adapters; "-" where every turn is a row), then the ratios before/after.
Sampling is seeded and the cache is exact, so both variants play the same episodes (the rewards
printed must agree; a different reward means the two did not see the same step).
Any other train.py option passes through after `--`, e.g. `-- --data.batch-size 2`; --before-extra /
--after-extra add options to one variant only, e.g. the prompt layout before transcripts:
    python bench/step_time.py --config configs/math_tool.py --before-extra "--data.env-kwargs.layout message"
--before-root DIR runs the before variant from another checkout at its own defaults (no cache/packing flags
added), e.g. the landed code against this one:
    git worktree add /tmp/base <commit> && python bench/step_time.py --config configs/math_tool.py \
        --before-root /tmp/base --after-extra "--data.env-kwargs.layout per_role"
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE = ["--rollout.prefix-cache-tokens", "0", "--algo.no-pack-turns"]


def one(config: str, steps: int, extra: list[str], flags: list[str], threads: int, root: Path = ROOT) -> dict:
    """One fresh train.py process of `root` (this checkout, or --before-root's) with `flags` + `extra`."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, str(root / "train.py"), "--config", str((ROOT / config).resolve()) if not
               Path(config).is_absolute() else config, "--trainer.total-steps", str(steps),
               "--trainer.output-dir", out, "--trainer.resume", "none", "--trainer.no-val-before-train",
               "--trainer.test-freq", "0", "--trainer.save-freq", "0", "--rollout.no-progress", *flags, *extra]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
        rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [x for x in rows if "time/step" in x]
    tot = lambda k: sum(x.get(k, 0.0) for x in rows)  # noqa: E731
    return {"rollout": tot("time/rollout"), "update": tot("time/train"), "step": tot("time/step"),
            "prefill": tot("perf/prefill_tokens"), "reward": tot("train/team_reward") / max(len(rows), 1),
            "rows": sum(v for x in rows for k, v in x.items() if k.startswith("train/update_rows/")) or None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--before-extra", default="", help="train.py options for the before variant only (one string)")
    ap.add_argument("--after-extra", default="", help="train.py options for the after variant only (one string)")
    ap.add_argument("--before-root", type=Path, default=None,
                    help="run the before variant from this checkout at its defaults (no cache/packing flags)")
    ap.add_argument("extra", nargs="*", help="train.py options, after --")
    a = ap.parse_args()
    runs = {"before": [], "after": []}
    for rep in range(a.repeats):
        for name in ("before", "after"):
            own = shlex.split(a.before_extra if name == "before" else a.after_extra)
            flags = BEFORE if name == "before" and a.before_root is None else []
            root = a.before_root.resolve() if name == "before" and a.before_root else ROOT
            runs[name].append(one(a.config, a.steps, a.extra + own, flags, a.threads, root))
            print(f"repeat {rep + 1} {name}: " + " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                          for k, v in runs[name][-1].items()), flush=True)
    med = {n: {k: statistics.median(r[k] for r in rs) if rs[0][k] is not None else None for k in rs[0]}
           for n, rs in runs.items()}
    print(f"\n{a.config}, {a.steps} step(s), {a.threads} thread(s), median of {a.repeats}")
    print(f"{'':8}{'rollout s':>11}{'update s':>10}{'step s':>9}{'prefilled':>11}{'rows':>7}{'reward':>8}")
    for n, m in med.items():
        print(f"{n:8}{m['rollout']:11.1f}{m['update']:10.1f}{m['step']:9.1f}{m['prefill']:11.0f}"
              f"{m['rows'] if m['rows'] else '-':>7}{m['reward']:8.3f}")
    b, f = med["before"], med["after"]
    print(f"before/after: rollout {b['rollout'] / f['rollout']:.2f}x  update {b['update'] / f['update']:.2f}x  "
          f"step {b['step'] / f['step']:.2f}x  prefilled tokens {b['prefill'] / max(f['prefill'], 1):.2f}x")


if __name__ == "__main__":
    main()
