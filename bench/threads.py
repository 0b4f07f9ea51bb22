"""Torch threads on a small CPU machine: 1 vs 2 threads (and OpenMP's passive wait policy), on an idle
machine and under load, for the smoke run and one step of the CPU demo.

    python bench/threads.py                       # the smoke run, the machine as it is
    python bench/threads.py --load 2              # ... with 2 busy single-thread matmul processes beside it
    python bench/threads.py --what demo --rounds 1

Each setting runs train.py in a fresh process (settings alternate round by round, so all see the
same machine); printed: wall seconds (median over rounds), CPU seconds, the load average seen, and
wall time as a ratio to 1 thread. The question it answers: which default is never much slower on an
idle machine and never collapses when other jobs share the cores (PyTorch's spinning OpenMP threads
were seen 10-30x slower when the cores were oversubscribed).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {  # name -> environment
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "2 threads": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"},
    "2 threads passive": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
    "auto (trainer.threads=0)": {},
}
WHAT = {
    "smoke": ["--config", "configs/tiny_math_3agent.py"],
    "demo": ["--config", "configs/smollm2_math_cpu.py", "--trainer.total-steps", "1", "--trainer.no-val-before-train",
             "--trainer.test-freq", "0", "--trainer.save-freq", "0"],
}
BUSY = ("import torch, time\ntorch.set_num_threads(1)\na = torch.randn(512, 512)\n"
        "t = time.time()\nwhile time.time() - t < 36000:\n    a = (a @ a).tanh()\n")


def run_once(env_extra: dict, args: list[str], out: str) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env.update(env_extra)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "train.py", *args, "--trainer.output-dir", out, "--trainer.resume", "none",
                        "--rollout.no-progress"], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise SystemExit(f"train.py failed under {env_extra}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--what", choices=sorted(WHAT), default="smoke")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load", type=int, default=0, help="busy single-thread processes to start beside the runs")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names of SETTINGS")
    a = ap.parse_args(argv)
    names = [n for n in a.settings.split(",") if n]
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(a.load)]
    try:
        time.sleep(5 if busy else 0)
        res = {n: [] for n in names}
        loads = []
        with tempfile.TemporaryDirectory() as tmp:
            for k in range(a.rounds):
                for n in names:
                    loads.append(os.getloadavg()[0])
                    res[n].append(run_once(SETTINGS[n], WHAT[a.what], str(Path(tmp) / f"{k}_{len(loads)}")))
    finally:
        for p in busy:
            p.kill()
    print(f"{a.what}: {os.cpu_count()} cores, {a.load} busy processes beside, load average seen "
          f"{min(loads):.1f}-{max(loads):.1f}, median of {a.rounds} round(s)")
    base = statistics.median(w for w, _ in res[names[0]])
    print("| setting | wall s | CPU s | wall / " + names[0] + " |\n|---|---|---|---|")
    for n in names:
        w, c = statistics.median(x for x, _ in res[n]), statistics.median(x for _, x in res[n])
        print(f"| {n} | {w:.1f} | {c:.1f} | {w / base:.2f} |")


if __name__ == "__main__":
    main()
