"""The static decode step's attention window against the whole cache, in one run (`TorchEngine(compile=True)`).

    python bench/cache_window.py                                  # SmolLM2-135M, 8 rows, 512 new tokens, 3 rounds
    python bench/cache_window.py --model tiny --new 130 --rounds 1  # seconds: the form the tests run

compile=True's step attends to a window of the KV cache that holds the columns written so far (static_step.cache_window:
64, 128, 192, 256, 384, ... columns) instead of the whole cache sized for max_new_tokens. On CPU the step runs eagerly
(the `_capture=False` hook: no CUDA graph), so this measures the step's own work, not a GPU's; the two forms alternate
round by round and the median is reported. Printed: the KV columns each form reads over the generation (from
the widths each decode step received, checked against the windows) and their ratio, tok/s of each, and the time
ratio. An untimed first call captures the windows. Every row generates exactly --new tokens (EOS ignored), seeded,
so both forms produce the same tokens (checked).
"""
import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [ROOT] + [x for x in sys.path if os.path.abspath(x or ".") != os.path.join(ROOT, "bench")]
from static_step import cache_window  # noqa: E402
from model import load_model  # noqa: E402
from rollout import Request, SamplingParams, TorchEngine  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--new", type=int, default=512, help="new tokens a row")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    m, tok = load_model(a.model, seed=0)
    m.eval()
    texts = [f"Question {i}: what is {7 * i + 3} times {i + 2}? Think step by step." for i in range(a.rows)]
    reqs = [Request(tok.encode(t), None, SamplingParams(max_new_tokens=a.new, seed=i, stop_token_ids=[]))
            for i, t in enumerate(texts)]
    P = max(len(r.prompt_ids) for r in reqs)
    L = -(-(P + a.new) // 64) * 64
    want = {"window": sum(cache_window(L, P + s) for s in range(1, a.new)), "whole": L * (a.new - 1)}
    engines = {"window": TorchEngine(m, tok, compile=True, _capture=False),
               "whole": TorchEngine(m, tok, compile=True, _capture=False, _cache_windows=False)}
    widths = {k: [] for k in engines}  # the KV columns each decode step of the last call attended to
    for k, eng in engines.items():
        step_fn = eng._step_fn

        def spy(b, step, P_, filtered, key_ok, k=k, step_fn=step_fn):
            widths[k].append(key_ok.shape[1])
            return step_fn(b, step, P_, filtered, key_ok)
        eng._step_fn = spy
        eng.generate(reqs)  # untimed: each window's capture (its warm-up steps) happens here
    times, outs, cols = {k: [] for k in engines}, {}, {}
    for _ in range(a.rounds):
        for k, eng in engines.items():
            widths[k].clear()
            t = time.perf_counter()
            outs[k] = [r.completion_ids for r in eng.generate(reqs)]
            times[k].append(time.perf_counter() - t)
            cols[k] = sum(widths[k])
    if cols != want:
        sys.exit(f"the engines read {cols} KV columns a row, not the windows' {want}")
    same = outs["window"] == outs["whole"]
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.model}, {a.rows} rows, prompt {P}, {a.new} new tokens, cache {L} columns, {a.rounds} rounds, "
          f"{torch.get_num_threads()} threads")
    for k in engines:
        print(f"  {k:6s}: {cols[k]:,} KV columns read a row (counted at the step), {a.rows * a.new / med[k]:.1f} tok/s "
              f"({med[k]:.2f} s)")
    print(f"window / whole: KV columns {cols['window'] / cols['whole']:.2f}x, time {med['window'] / med['whole']:.2f}x; "
          f"same tokens: {same}")
    if not same:
        sys.exit("the two forms generated different tokens")


if __name__ == "__main__":
    main()
