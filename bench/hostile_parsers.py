"""Worst-case time of each reply parser over the hostile set of tests/test_hostile_text.py.

    python bench/hostile_parsers.py            # every parser x every hostile reply (>= 32 kB each)
    python bench/hostile_parsers.py --repeat 3 # best of 3 per (parser, reply), then the worst reply

Prints one row per parser: the slowest hostile reply, its time, and the median over the set.
Replies are at most ~1024 tokens (4-8 kB); the hostile replies are 32 kB and more. A parser that
backtracks shows up here as seconds (before issue 11: parse_verdict("Verdict" + 1000 spaces) took
20 s, extract_answer("The answer is" + 2000 spaces + "x$ y") 60 s, both cubic in the length).
math_reward's worker path has its own hard deadline (rewards.math.TIMEOUT_S).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from test_hostile_text import HOSTILE, PARSERS  # noqa: E402  (the same hostile set the tests use)

from rewards.math import math_reward  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="best of this many calls per (parser, reply)")
    args = ap.parse_args()
    texts = {name: gen() for name, gen in HOSTILE.items()}
    math_reward("\\boxed{2\\sqrt{2}}", "\\sqrt{8}")  # start the math-verify worker outside the timing
    print(f"{len(texts)} hostile replies, {min(map(len, texts.values())) // 1024}-"
          f"{max(map(len, texts.values())) // 1024} k characters each\n")
    print(f"{'parser':22s} {'worst':>10s} {'median':>10s}  worst reply")
    for parser, (fn, _) in PARSERS.items():
        times = {}
        for name, text in texts.items():
            best = float("inf")
            for _ in range(args.repeat):
                t = time.perf_counter()
                fn(text)
                best = min(best, time.perf_counter() - t)
            times[name] = best
        worst = max(times, key=times.get)
        print(f"{parser:22s} {times[worst] * 1e3:8.2f}ms {statistics.median(times.values()) * 1e3:8.2f}ms  {worst}")


if __name__ == "__main__":
    main()
