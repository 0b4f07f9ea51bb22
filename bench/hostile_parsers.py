"""Worst-case time of each reply parser and of each workflow's `step` on hostile replies (the sets of
tests/test_hostile_text.py).

    python bench/hostile_parsers.py              # parsers x the 32 kB set; parsers and steps x 1 MB shapes
    python bench/hostile_parsers.py --repeat 3   # best of 3 per (parser, reply), then the worst reply
    python bench/hostile_parsers.py --size 65536 # the marker shapes at another length

Prints one row per parser (the slowest reply, its time, the median over the set), then one row per
workflow (the slowest single `step` over episodes whose every reply is one hostile text of `--size`
characters, 1 MB by default: every marker shape plus the shapes that were once slow), then
SWE's writer step on 2000 one-line hunks against a 20k-line file, and the worst of all of it.
Replies are at most ~1024 tokens (4-8 kB) in the configs. A parser that backtracks shows up as
seconds: parse_verdict("Verdict" + 1000 spaces) once took 20 s; later, parse_tool_call("<tool_call>a" + 64k spaces + "b") 53 s and that SWE writer step 12-31 s.
Then math_reward on answers built to be slow (tests/test_math.py's HUGE and a few more): each
once cost math-verify's worker its whole deadline and a restart, 5-6.6 s (eight in a row 47 s);
rewards.math.too_big now scores them before the worker sees them (the deadline, TIMEOUT_S, is the
last resort). The table says, per answer, its time and whether it reached the worker or killed it.
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

import test_hostile_text as H  # noqa: E402  (the same hostile sets the tests use)

import rewards.math as M  # noqa: E402
from envs import prompts_of  # noqa: E402
from rewards.math import math_reward  # noqa: E402

SLOW_ANSWERS = ["10^{10^{10}}", "9^{9^{9^9}}", "(10^9)!", "9^{9^{9^{9}}}", "10^{10^{10^{10}}}!", "9**9**9", "9^9^9",
                "\\binom{10^{9}}{5 \\cdot 10^{8}}", "0.1^{10^{10}}", "(1+1)^{10^{10}}", "\\Gamma(10^9)", "(x+y+1)^{60}",
                "(x+1)^{1000}", "(2+3i)^{10^{6}}", "\\sqrt{10^{10^{10}}}", "\\frac{1}{10^{10^{10}}}", "10^{10}!",
                "1.0000001^{10^{10}}", "e^{10^{10}}", "\\exp(10^{10})", "x^{10^{10}}", "2^{2^{2^{2^{2}}}}", "100000!",
                "10^{10000}", "(1+\\sqrt{2})^{3000}", "(x+1)^{100}", "(x+1)^{200}", "(x+y+1)^{30}", "2^{2000}",
                "\\dbinom{10^9}{5 \\cdot 10^8}", "\\prod_{k=1}^{10^9} k", "1e10000000000",
                "(a+b)(c+d)(e+f)(g+h)(i+j)(k+l)(m+n)(o+p)(q+r)(s+t)", "(a+b)(c+d)(e+f)(g+h)(i+j)(k+l)",
                "(-1)^{10^{10}}", "1^{10^{10}}", "10^{10^{3}}", "2^{2^{5}}"]


def best_of(fn, text, repeat):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn(text)
        best = min(best, time.perf_counter() - t)
    return best


def parsers(texts: dict, repeat: int, label: str) -> float:
    print(f"\n{len(texts)} hostile replies, {min(map(len, texts.values())) // 1024}-"
          f"{max(map(len, texts.values())) // 1024} k characters each ({label})")
    print(f"{'parser':22s} {'worst':>10s} {'median':>10s}  worst reply")
    overall = 0.0
    for parser, (fn, _) in H.PARSERS.items():
        times = {name: best_of(fn, text, repeat) for name, text in texts.items()}
        worst = max(times, key=times.get)
        overall = max(overall, times[worst])
        print(f"{parser:22s} {times[worst] * 1e3:8.2f}ms {statistics.median(times.values()) * 1e3:8.2f}ms  {worst}",
              flush=True)
    return overall


def steps(texts: dict) -> float:
    print(f"\nworkflow steps: {len(texts)} episodes each, every reply one hostile text of "
          f"{min(map(len, texts.values())) // 1024}-{max(map(len, texts.values())) // 1024} k characters")
    print(f"{'workflow':14s} {'worst step':>11s} {'steps':>6s}  worst reply")
    overall = 0.0
    for name in H.WORKFLOWS:
        try:
            make, task, _ = H._workflow(name)
        except BaseException as e:  # noqa: BLE001 — pytest.skip when bm25s is missing
            print(f"{name:14s} skipped: {e}")
            continue
        worst, n = (0.0, ""), 0
        for text_name, text in texts.items():
            env, k = make(), 0
            handed = env.reset(task)
            while prompts_of(handed) and k < 12:  # a set of prompts handed out at once: the text for each
                said = [text] * len(prompts_of(handed))
                t = time.perf_counter()
                handed = env.step(said if isinstance(handed, list) else text)
                worst = max(worst, (time.perf_counter() - t, text_name))
                k += len(said)
            n += k
            env.turn_rewards(), env.metrics()
        overall = max(overall, worst[0])
        print(f"{name:14s} {worst[0] * 1e3:9.1f}ms {n:6d}  {worst[1]}", flush=True)
    return overall


def swe_writer() -> float:
    task = H._swe_task(big=True)
    hunks = "".join(f"@@ -{i + 1},1 +{i + 1},1 @@\n-x{i} = {i}\n+x{i} = {i + 1}\n" for i in range(0, 20_000, 10))
    env = H.SWETeamEnv(max_analyzer_calls=0)
    env.reset(task)
    env.step("calc/big.py")
    t = time.perf_counter()
    env.step("--- a/calc/big.py\n+++ b/calc/big.py\n" + hunks)
    took = time.perf_counter() - t
    print(f"\nSWE writer step, 2000 one-line hunks against a 20k-line file: {took * 1e3:.1f}ms "
          f"({env.history[-1][1][:40]!r})")
    return took


def slow_answers(repeat: int) -> float:
    print(f"\nmath_reward on {len(SLOW_ANSWERS)} answers built to be slow, or big (truth 3628800), best of {repeat}")
    print(f"{'answer':34s} {'time':>9s}  worker")
    overall, w = 0.0, M._worker
    for s in SLOW_ANSWERS:
        asked, killed = w.asked, w.killed
        took = best_of(lambda t: math_reward(t, "3628800"), f"\\boxed{{{s}}}", repeat)
        how = "killed at the deadline" if w.killed > killed else "asked" if w.asked > asked else "not asked"
        overall = max(overall, took)
        print(f"{s:34s} {took * 1e3:7.2f}ms  {how}", flush=True)
    print(f"worst: {overall * 1e3:.2f}ms (target <= 500 ms; the worker's deadline is {M.TIMEOUT_S:.0f} s)")
    return overall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="best of this many calls per (parser, reply)")
    ap.add_argument("--size", type=int, default=H.MB, help="characters of the marker shapes (default 1 MB)")
    ap.add_argument("--no-steps", action="store_true", help="parsers only")
    args = ap.parse_args()
    math_reward("\\boxed{2\\sqrt{2}}", "\\sqrt{8}")  # start the math-verify worker outside the timing
    n = args.size
    big = {}
    for k in H.MARKERS:
        big[f"{k!r} + a + spaces + b"] = k + "a" + " " * n + "b"
        big[f"{k!r} + a + newlines + b"] = k + "a" + "\n" * n + "b"
        big[f"({k!r} + a) repeated"] = H._rep(k + "a ", n)
    worst = slow_answers(args.repeat)
    worst = max(worst, parsers({name: gen() for name, gen in H.HOSTILE.items()}, args.repeat, "the test set"))
    worst = max(worst, parsers(big, args.repeat, "every marker, three shapes"))
    if not args.no_steps:
        shapes = {f"{k!r} + a + spaces + b": big[f"{k!r} + a + spaces + b"] for k in H.MARKERS}
        shapes.update({name: gen() for name, gen in H.SLOW_BEFORE.items()})
        worst = max(worst, steps(shapes), swe_writer())
    print(f"\nworst case of any parser or step above: {worst * 1e3:.1f}ms")


if __name__ == "__main__":
    main()
