"""The update's vocabulary projection in chunks (algo.logits_chunk_tokens) against whole logits, on CPU, in one run.

    python bench/logits_chunk.py                      # Qwen2.5-0.5B's head (hidden 896, vocabulary 151,936), 2 layers
    python bench/logits_chunk.py --chunks 1024,256,0 --rows 4 --reply 128 --repeats 3
    python bench/logits_chunk.py --demo               # the CPU demo's update (configs/smollm2_math_cpu.py), 2 steps

One fused 3-adapter learner.policy_update (bench/gpu.py's update_setup: random tokens, LoRA rank 16 on every
projection) per variant, each in a fresh process so that its peak resident memory (ru_maxrss) is its own; the
variants take turns round after round and the medians are compared. "update peak" is the peak during the update
above what the process held before it (the model, the batch). Two decoder layers keep the body small, so what
the numbers show is the head: the whole (tokens x vocabulary) logits, their fp32 copy and their gradients,
against one chunk at a time recomputed in backward.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(chunk: int, rows: int, prompt: int, reply: int, micro: int, layers: int):
    sys.path[:] = [ROOT, os.path.join(ROOT, "bench")] + sys.path
    import torch

    import gpu as G
    import learner
    G.CONFIGS["head"] = dict(G.CONFIGS["qwen2.5-0.5b"], num_hidden_layers=layers)
    torch.set_num_threads(1)
    m = G.build("head", torch.float32, torch.device("cpu"), adapters=True)
    cfg, parts = G.update_setup(m, rows, prompt, reply, micro, chunk)
    ps = parts()
    m.train()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    out = learner.policy_update(m, ps, cfg, torch.device("cpu"), 0.0)
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    tokens = sum(len(s.completion_ids) for p in ps for s in p.batch.samples)
    print(json.dumps({"chunk": chunk, "seconds": seconds, "update_peak_MiB": (peak - before) / 1024,
                      "tokens": tokens, "pg_loss": out["a0"]["pg_loss"]}))


def demo_worker(chunk: int, steps: int):
    """train.py on the CPU demo's config for `steps` steps, no eval, one thread; around each step's update the
    process's peak resident memory is reset (/proc/self/clear_refs) and read back: the update's own peak."""
    sys.path[:] = [ROOT] + [x for x in sys.path if os.path.abspath(x or ".") != os.path.join(ROOT, "bench")]
    os.chdir(ROOT)
    import tempfile

    import learner
    import train
    real, rows = learner.update, []

    def status():
        return {k: int(v.split()[0]) / 1024 for k, v in (line.split(":", 1) for line in open("/proc/self/status"))
                if k in ("VmHWM", "VmRSS")}

    def update(*a, **k):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before, t = status()["VmRSS"], time.perf_counter()
        out = real(*a, **k)
        rows.append({"seconds": time.perf_counter() - t, "rss_before_MiB": before, "update_peak_MiB": status()["VmHWM"]})
        return out
    learner.update = update
    with tempfile.TemporaryDirectory() as out:
        train.main(train.cli(["--config", "configs/smollm2_math_cpu.py", "--trainer.total-steps", str(steps),
                              "--trainer.test-freq", "0", "--trainer.no-val-before-train", "--trainer.save-freq", "0",
                              "--trainer.resume", "none", "--trainer.threads", "1", "--trainer.output-dir", out,
                              "--rollout.no-progress", "--algo.logits-chunk-tokens", str(chunk)]))
    print(json.dumps({"chunk": chunk, "steps": rows}))


def demo(chunks, steps):
    got = {}
    for c in chunks:
        r = subprocess.run([sys.executable, __file__, "--demo-worker", str(c), "--steps", str(steps)],
                           env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, check=True)
        got[c] = json.loads(r.stdout.strip().splitlines()[-1])["steps"]
    print(f"the CPU demo (configs/smollm2_math_cpu.py, SmolLM2-135M fp32), {steps} steps, 1 thread, "
          f"load average {os.getloadavg()[0]:.1f}: each step's update, its peak resident memory and its time")
    print("| logits chunk | step | resident before MiB | update peak MiB | update s |")
    print("|---|---|---|---|---|")
    for c in chunks:
        for i, x in enumerate(got[c], 1):
            print(f"| {c or 'whole'} | {i} | {x['rss_before_MiB']:.0f} | {x['update_peak_MiB']:.0f} | {x['seconds']:.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", default="256,0", help="algo.logits_chunk_tokens values (0 = whole logits)")
    ap.add_argument("--rows", type=int, default=4, help="rows per adapter (3 adapters)")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--reply", type=int, default=128)
    ap.add_argument("--micro", type=int, default=4, help="rows per forward/backward")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--demo", action="store_true", help="the CPU demo's update instead (train.py, --steps steps)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--demo-worker", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker is not None:
        return worker(a.worker, a.rows, a.prompt, a.reply, a.micro, a.layers)
    if a.demo_worker is not None:
        return demo_worker(a.demo_worker, a.steps)
    chunks = [int(c) for c in a.chunks.split(",")]
    if a.demo:
        return demo(chunks, a.steps)
    got = {c: [] for c in chunks}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(a.repeats):
        for c in chunks:  # alternating: a shared machine's load hits every variant alike
            r = subprocess.run([sys.executable, __file__, "--worker", str(c), "--rows", str(a.rows), "--prompt", str(a.prompt),
                                "--reply", str(a.reply), "--micro", str(a.micro), "--layers", str(a.layers)],
                               env=env, capture_output=True, text=True, check=True)
            got[c].append(json.loads(r.stdout.strip().splitlines()[-1]))
    print(f"Qwen2.5-0.5B's head ({a.layers} layers), fp32, 3 adapters x {a.rows} rows (prompt ~{a.prompt}, reply "
          f"~{a.reply}), micro-batch {a.micro}, 1 thread, median of {a.repeats} alternating rounds, "
          f"load average {os.getloadavg()[0]:.1f}")
    base = chunks[-1]
    print("| logits chunk | update s | update peak MiB | pg_loss | s / last | peak / last |")
    print("|---|---|---|---|---|---|")
    med = {c: (statistics.median(x["seconds"] for x in got[c]), statistics.median(x["update_peak_MiB"] for x in got[c]))
           for c in chunks}
    for c in chunks:
        s, p = med[c]
        print(f"| {c or 'whole'} | {s:.2f} | {p:.0f} | {got[c][0]['pg_loss']:.6f} | {s / med[base][0]:.2f}x | "
              f"{p / max(med[base][1], 1e-9):.2f}x |")


if __name__ == "__main__":
    main()
