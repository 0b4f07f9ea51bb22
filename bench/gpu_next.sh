#!/usr/bin/env bash
# gpu_next.sh: the figures that decide the next GPU work, side by side, in ONE run (<= 9.5 min on one H200).
# Based on bench/gpu_check.sh; uses only flags that exist in config.py (train.py) and bench/gpu.py, and the
# project's own Python API (TorchEngine, learner.policy_update, bench/gpu.py's build/train_bench helpers).
#
#   A. decode tok/s, Qwen2.5-1.5B shape, bf16, prompt 128, 64 new tokens: batch 1 / 64 / 256 x adapters 0 / 3
#      (3 = mixed per row) x eager loop (compile=False; not at 64) vs static step in a CUDA graph (compile=True); ms/step,
#      peak memory, % of the bench's roofline (44 B/logit, 52 before 2026-12-05; measured copy bandwidth) AND of an ideal roofline
#      (4 B/logit, bf16 adapters, 4.8 TB/s, max with 989 TFLOP/s compute).
#   F. (rollout.fuse, run after B) the static decode step compiled by torch.compile before capture, beside a
#      plain graph row measured again just before it (B changed the adapters): batch 1 / 256 x adapters 0 / 3,
#      the first call (compile + capture + prefill), rows whose seeded tokens equal the graph's, their logprob gap;
#      and other forms of the static step, each against that graph row (FUSED below).
#   P. kernel profile of one decode step (graph replays and the same static step run eagerly): kernels/step,
#      summed kernel time/step vs wall ms/step (the launch-bound share), top kernels, the attention kernel's name.
#   B. the fused 3-adapter update (bench/gpu.py's train_bench): micro-batch 8 (published: 3.44 s, 6.9% MFU) vs 32,
#      each with the chunked vocabulary projection (algo.logits_chunk_tokens 256) and with whole logits (0),
#      and 8 with gradient checkpointing (what configs/math_3agent.py turns on); MFU + peak memory; plus (part U) a
#      profile of a 3-micro-batch update: kernel-time sum vs wall (host-bound or not), launches and device->host syncs,
#      with its host-to-device copies pinned (what the learner does) and pageable, side by side.
#   C. train.py, 0.5B shape, SMALL args of gpu_check.sh, ONE step each, no eval (published: compile roll 2.2-2.7 s;
#      torchrun/FSDP eager roll 26.7 s): (1) python + --rollout.compile; (2) torchrun nproc 1 (FSDP2) + --rollout.compile;
#      (3) python + --rollout.compile --rollout.fuse; (4) torchrun nproc 1 + --rollout.compile --trainer.strategy
#      replicate (no FSDP: on one rank what is left is the process group, so (4) vs (2) is FSDP2's own per-layer
#      cost; the gradient all-reduce and the multi-GPU gain need several GPUs). TorchEngine.generate unshards every
#      FSDP module once per call, so (1) vs (2) is what is left of FSDP once decode runs in graphs. SMOKE=1 (CPU) runs python, eager decode, only.
#
#   from the repo root on a GPU machine: bash bench/gpu_next.sh, with .gpu_wheels
#   beside it (below) and a limit of ~570 s
#   bash gpu_next.sh [tokenizer dir]     run from the repo root (or REPO=<repo>); results go to $OUT (a folder that
#                                        comes back) else runs/gpu_next. Without a tokenizer dir, the `tiny`
#                                        preset's tokenizer is built on the spot (model.py; parts A/B/P need none).
# A GPU machine without network may lack tyro and math-verify (train.py stops at `import tyro`): as bench/gpu_check.sh's
# header says, on a machine with network run
#   pip download --no-deps -d .gpu_wheels tyro==1.0.17 math-verify==0.9.0 docstring_parser typeguard \
#       latex2sympy2_extended antlr4-python3-runtime==4.13.2
# put .gpu_wheels in the repo (git-ignored: echo /.gpu_wheels/ >> .git/info/exclude) and take it along
# to the GPU machine; this script installs them with `pip install --no-deps --target` and PYTHONPATH. Without them part C is
# skipped (A, B, P still run).
# Knobs: PARTS (harness parts, default ABFPU: A decode, B update, F fused decode, P profiles, U update profile),
# FORMS (part C's train.py forms, default python_compile torchrun_fsdp_compile python_compile_fuse
# torchrun_replicate_compile; also torchrun_fsdp_compile_fuse and python_eager; none = part C off), TOTAL (s, default 470: part C starts a run only with >= 45 s left and cuts its limit to what is left),
# FUSED (part F's cells, default "1x0 1x3 256x0 256x3": batch x adapters, each a graph row then a fused one; or
# "1x0:graph,graph-3mm,fused-cdt": the rows to run, in order. A form is graph or fused, plus -3mm (q, k and v as three
# matmuls, TorchEngine(_qkv_matmul=False)), -nogroup (each projection's routed LoRA alone, 21 ops a layer instead of 13,
# TorchEngine(_lora_group=False)), -whole (attention over the whole cache at every step, not the window of the columns
# written so far, TorchEngine(_cache_windows=False): with NEW=512 or more the windows matter), -sdpa / -matmul (the
# attention form forced; by default the fused step takes matmuls from static_step.ATTN_MATMUL_MIN_BATCH slots), -cdt (inductor's
# coordinate descent tuning on), -topp (top_p 0.9: the graph's sort, the fused step's threshold search; tokens compared
# with the cell's graph-topp row, speed with its graph row); with P in PARTS each fused
# row is profiled too), PROFILES (part P's, default
# "1x0:graph 256x3:graph"),
# HARNESS_LIMIT (s, parts A/P/B, default 300), STEP_LIMIT (s per train.py run, 150),
# SHAPE (train.py runs, qwen2.5-0.5b), DECODE_MODEL (qwen2.5-1.5b), NEW (new tokens a decode row, default 64; prompt
# 128), SMOKE=1 (CPU: tiny shapes, no capture, to check
# the script itself; part C runs only the eager forms there: rollout.compile is a config error without CUDA).
set -u
T0=$SECONDS
TOTAL=${TOTAL:-470}
STEP_LIMIT=${STEP_LIMIT:-150}
SHAPE=${SHAPE:-qwen2.5-0.5b}
cd "${REPO:-$PWD}" || exit 1
[ -f train.py ] && [ -f bench/gpu.py ] || { echo "run from the troupe repo root (or set REPO)"; exit 1; }
OUT=${OUT:-runs/gpu_next}
mkdir -p "$OUT"
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
SUMMARY="$OUT/summary.md"
: >"$SUMMARY"

# --- environment and carried wheels -------------------------------------------------------------------------
{
  echo "# gpu_next $(date -u +%FT%TZ) at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  python - <<'EOF'
import torch, transformers
print("torch", torch.__version__, "| transformers", transformers.__version__, "| cuda", torch.version.cuda, "|",
      torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")
EOF
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv,noheader 2>/dev/null
} 2>&1 | tee "$OUT/env.txt"
WHEELS=${WHEELS:-.gpu_wheels}
if ! python -c "import tyro, math_verify" 2>/dev/null; then
  if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    python -m pip install -q --no-deps --no-index --target "$WORK/deps" "$WHEELS"/*.whl 2>&1 | tail -2 | tee -a "$OUT/env.txt"
    export PYTHONPATH="$WORK/deps${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
HAVE_TRAIN=1
python -c "import tyro, math_verify" 2>/dev/null || { HAVE_TRAIN=0; echo "no tyro/math-verify (carry $WHEELS): part C skipped" | tee -a "$OUT/env.txt"; }

# --- parts A, B, F, P, U: one Python process ----------------------------------------------------------------------
cat >"$WORK/harness.py" <<'EOF'
import json, os, statistics, sys, time, traceback, importlib.util
ROOT = os.getcwd()
sys.path[:] = [ROOT] + [x for x in sys.path if os.path.abspath(x or ".") != os.path.join(ROOT, "bench")]
spec = importlib.util.spec_from_file_location("gpubench", os.path.join(ROOT, "bench", "gpu.py"))
G = importlib.util.module_from_spec(spec)
spec.loader.exec_module(G)
import torch
import collectives, engines, learner, lora
from rollout import Request, SamplingParams, TorchEngine

OUT = sys.argv[1]
SMOKE = os.environ.get("SMOKE") == "1" or not torch.cuda.is_available()
dev = torch.device("cpu" if SMOKE else "cuda")
CAP = not SMOKE
MODEL = "smoke" if SMOKE else os.environ.get("DECODE_MODEL", "qwen2.5-1.5b")
BATCHES = [1, 4] if SMOKE else [1, 64, 256]
def cells(var, default):  # "1x0 256x3:graph,fused-3mm" -> [(1, 0, None), (256, 3, "graph,fused-3mm")]
    out = []
    for w in os.environ.get(var, default).split():
        bn, _, mode = w.partition(":")
        b, n = bn.split("x")
        out.append((int(b), int(n), mode or None))
    return out
# F's cells: a plain graph row, then the fused step (engines.FUSE_OPTIONS), or the forms named, all on the same
# seeded requests
FUSED = cells("FUSED", "1x0 1x3:graph,fused,fused-cdt,graph-3mm,fused-3mm,graph-nogroup,graph-whole,graph-matmul 4x3:graph,fused,graph-topp,fused-topp" if SMOKE else "1x0 1x3 256x0 256x3")
PROFILES = cells("PROFILES", "1x3:static-eager" if SMOKE else "1x0:graph 256x3:graph")  # part F profiles its fused rows
DEADLINE = float(os.environ.get("HARNESS_LIMIT", "300")) - 25  # s: leave the summary time to be written
outs = {}
PARTS = os.environ.get("PARTS", "ABFPU")  # the harness parts to run: A decode, B update, F fused, P profiles, U update profile
NEW, PROMPT, REPS = (6, 60, 1) if SMOKE else (int(os.environ.get("NEW", "64")), 128, 2)  # NEW: new tokens a row
SPEC_BW, PEAK = 4.8e12, (G.peak_tflops(torch.cuda.get_device_name()) if not SMOKE else None) or 989.0
res = {"model": MODEL, "decode": [], "profile": [], "update": [], "errors": []}

def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()

def peak_reset():
    if dev.type == "cuda":
        torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()

def peak_gb():
    return torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else 0.0

def save():
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(res, f, indent=1)

t_start = time.perf_counter()
bw = G.bandwidth(dev, (64 << 20) if SMOKE else (2 << 30))
m = G.build(MODEL, torch.bfloat16, dev, adapters=True)
c = m.config
wb = G.weight_bytes(m)
lora_b = sum(p.numel() * p.element_size() for n in G.ADAPTERS for p in lora.adapter_parameters(m, n))
body = sum(mod.weight.numel() for name, mod in m.named_modules() if isinstance(mod, torch.nn.Linear) and ".layers." in name)
res.update(copy_bw_GBs=bw / 1e9, weight_bytes=wb, adapter_bytes_fp32=lora_b, peak_tflops=PEAK)
print(f"[{time.perf_counter() - t_start:.0f}s] {MODEL}: copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)

def names_for(B, nad):
    return [None] * B if nad == 0 else ["a0"] * B if nad == 1 else [G.ADAPTERS[i % 3] for i in range(B)]

def requests(B, nad, n, prompts, top_p=1.0):
    return [Request(p, a, SamplingParams(max_new_tokens=n, temperature=1.0, top_p=top_p, stop_token_ids=[], seed=i))
            for i, (p, a) in enumerate(zip(prompts, names_for(B, nad)))]

def roofs(B, nad):
    ctx = PROMPT + NEW // 2
    kv = B * G.kv_bytes_per_row(m, ctx)
    bench_bytes = (wb if nad else wb - lora_b) + kv + B * c.vocab_size * G.SAMPLING_BYTES_PER_LOGIT
    ideal_bytes = (wb - lora_b) + (lora_b // 2 if nad else 0) + kv + B * c.vocab_size * 4
    flops = 2 * body * B + 2 * c.vocab_size * c.hidden_size * B + 4 * c.num_hidden_layers * c.hidden_size * ctx * B
    return B * bw / bench_bytes, B / max(ideal_bytes / SPEC_BW, flops / (PEAK * 1e12))

# ---- A: decode matrix ------------------------------------------------------------------------------------------
def prompts_for(B):
    g = torch.Generator().manual_seed(B)
    return [torch.randint(1, c.vocab_size, (PROMPT,), generator=g).tolist() for _ in range(B)]

def kernel_stats(fn):
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as p:
        fn(); sync()
    dev_ev = [e for e in p.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
    t = lambda e: (getattr(e, "device_time", None) or getattr(e, "cuda_time", 0) or 0)
    kern = [e for e in dev_ev if not e.name.startswith(("Memcpy", "Memset"))]
    by = {}
    for e in kern:
        by[e.name] = (by.get(e.name, (0, 0.0))[0] + 1, by.get(e.name, (0, 0.0))[1] + t(e))
    syncs = sum(1 for e in p.events() if e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"))
    launches = sum(1 for e in p.events() if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                                         "cuLaunchKernelEx", "cudaGraphLaunch"))
    return len(kern), sum(t(e) for e in kern), by, syncs, launches

def profile_engine(eng, B, nad, mode, prompts):
    """One decode step of a warmed engine under the profiler (an n-token call less a 1-token call, per step)."""
    n = 8 if not SMOKE else 4
    eng.generate(requests(B, nad, n, prompts))  # this cache size's window captured here, not in the profiled calls
    k1, t1, by1, _, l1 = kernel_stats(lambda: eng.generate(requests(B, nad, 1, prompts)))
    kn, tn, byn, sn, ln = kernel_stats(lambda: eng.generate(requests(B, nad, n, prompts)))
    steps = n - 1
    per = {k: ((v[0] - by1.get(k, (0, 0))[0]) / steps, (v[1] - by1.get(k, (0, 0))[1]) / steps) for k, v in byn.items()}
    top = sorted(per.items(), key=lambda kv: -kv[1][1])[:14]
    attn = sorted({k for k in per if any(s in k.lower() for s in ("fmha", "flash", "attention", "cudnn", "sdpa", "softmax"))})
    row = dict(batch=B, adapters=nad, mode=mode, kernels_per_step=(kn - k1) / steps,
               kernel_us_per_step=(tn - t1) / steps, launches_per_step=(ln - l1) / steps,
               attention_kernels=attn[:6], top=[(k[:90], round(v[0], 1), round(v[1], 1)) for k, v in top])
    res["profile"].append(row)
    print(f"[{time.perf_counter() - t_start:.0f}s] profile B={B} ad={nad} {mode}: {row['kernels_per_step']:.0f} kernels/step, "
          f"{row['kernel_us_per_step']:.0f} us of kernels/step, {row['launches_per_step']:.0f} launches/step; attention: {attn[:3]}",
          flush=True)

graph_tok_s = {}  # (B, adapters) -> the last graph row's tok/s

def engine_for(B, mode, **kw):
    """A TorchEngine for `mode` (FUSED's forms): graph or fused (engines.FUSE_OPTIONS), -3mm, -nogroup, -whole,
    -sdpa / -matmul, -cdt; -topp samples with top_p 0.9 (the graph's sort, the fused step's threshold search)."""
    saved = dict(engines.FUSE_OPTIONS)
    if "-cdt" in mode:
        if not mode.startswith("fused"):
            raise ValueError(f"{mode}: coordinate descent tuning is an option of the compiled (fused) step")
        engines.FUSE_OPTIONS["coordinate_descent_tuning"] = True
    try:
        return TorchEngine(m, G.IdTokenizer(), max_batch_size=B, fuse=mode.startswith("fused"), prefix_cache_tokens=0,
                           _qkv_matmul="-3mm" not in mode, _lora_group="-nogroup" not in mode,
                           _cache_windows="-whole" not in mode,
                           _attention="sdpa" if "-sdpa" in mode else "matmul" if "-matmul" in mode else "auto", **kw)
    finally:
        engines.FUSE_OPTIONS.clear(); engines.FUSE_OPTIONS.update(saved)

def decode_cell(B, nad, mode, prompts):
    try:
        peak_reset()
        eng = engine_for(B, mode, compile=(mode != "eager"), _capture=CAP)
        def run(n):
            reqs = requests(B, nad, n, prompts, 0.9 if "-topp" in mode else 1.0)
            sync(); t = time.perf_counter()
            out = eng.generate(reqs)
            sync()
            assert all(len(r.completion_ids) == n for r in out)
            if n == NEW:
                outs[(B, nad, mode)] = out
            return time.perf_counter() - t
        tc = time.perf_counter()
        run(NEW)  # compile (fused), capture (graph) and warm-up
        first_call = time.perf_counter() - tc
        run(1)
        full = statistics.median([run(NEW) for _ in range(REPS)])
        first = statistics.median([run(1) for _ in range(REPS)])
        dt = max(full - first, 1e-9) / (NEW - 1)
        rb, ri = roofs(B, nad)
        row = dict(batch=B, adapters=nad, mode=mode, tok_s=B / dt, ms_step=dt * 1e3, peak_GB=peak_gb(),
                   first_call_s=first_call,
                   pct_bench_roof=100 * (B / dt) / rb, pct_ideal_roof=100 * (B / dt) / ri,
                   bench_roof=rb, ideal_roof=ri)
        res["decode"].append(row)
        if mode == "graph":
            graph_tok_s[(B, nad)] = row["tok_s"]
        elif (B, nad) in graph_tok_s:
            row["x_graph"] = row["tok_s"] / graph_tok_s[(B, nad)]  # against the graph row measured just before it
        ref = "graph-topp" if "-topp" in mode else "graph"  # x_graph: against the unfiltered graph row all the same
        if mode == "graph-topp" and (B, nad, "graph") in outs:  # the filter took effect: other tokens than unfiltered
            row["same_tokens_rows_unfiltered"] = sum(x.completion_ids == y.completion_ids for x, y in zip(
                outs[(B, nad, "graph")], outs[(B, nad, mode)])) / B
        if mode not in (ref, "eager") and (B, nad, ref) in outs:  # seeded sampling: the plain graph's tokens?
            a, b_ = outs[(B, nad, ref)], outs[(B, nad, mode)]
            row["same_tokens_rows"] = sum(x.completion_ids == y.completion_ids for x, y in zip(a, b_)) / len(a)
            row["max_lp_diff"] = max(max([abs(u - v) for u, v in zip(x.logprobs, y.logprobs)] or [0.0])
                                     for x, y in zip(a, b_) if x.completion_ids == y.completion_ids) if row["same_tokens_rows"] else None
        if mode.startswith("fused") and "P" in PARTS:  # the fused step's profile, on this engine: no second compile
            profile_engine(eng, B, nad, mode, prompts)
        print(f"[{time.perf_counter() - t_start:.0f}s] decode B={B} adapters={nad} {mode}: {B / dt:.0f} tok/s first call {first_call:.1f}s {row.get('same_tokens_rows', '')} "
              f"{dt * 1e3:.2f} ms/step peak {peak_gb():.1f} GB", flush=True)
        del eng
    except Exception as e:  # noqa: BLE001
        res["errors"].append(f"decode B={B} ad={nad} {mode}: {type(e).__name__}: {e}")
        traceback.print_exc()
    save()

for B in BATCHES if "A" in PARTS else ():
    prompts = prompts_for(B)
    for nad in (0, 3):
        for mode in ("graph",) if B == 64 else ("eager", "graph"):
            decode_cell(B, nad, mode, prompts)

# ---- B: the fused update ---------------------------------------------------------------------------------------
ROWS, TP, TR = (4, 12, 8) if SMOKE else (32, 256, 256)
# chunk: algo.logits_chunk_tokens (0 = whole logits, the code before 2026-12-05), side by side at micro-batch 8 and 32
UPDATES = [(4, False, 4), (4, False, 0), (4, True, 4)] if SMOKE else \
    [(8, False, 256), (8, False, 0), (32, False, 256), (32, False, 0), (8, True, 256)]
for micro, ckpt, chunk in UPDATES if "B" in PARTS else ():
    if time.perf_counter() - t_start > DEADLINE * 0.5:
        res["errors"].append(f"update micro={micro} ckpt={ckpt} chunk={chunk}: skipped, harness time"); continue
    try:
        peak_reset()
        if ckpt:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        t, flops, prime = G.train_bench(m, dev, ROWS, TP, TR, micro, 1 if SMOKE else 2, chunk)
        if ckpt:
            m.gradient_checkpointing_disable()
        row = dict(micro=micro, grad_ckpt=ckpt, logits_chunk_tokens=chunk, step_s=t, tflops=flops / t / 1e12,
                   mfu_pct=100 * flops / t / 1e12 / PEAK, prime_mfu_pct=100 * prime / t / 1e12 / PEAK,
                   peak_GB=peak_gb())
        res["update"].append(row)
        print(f"[{time.perf_counter() - t_start:.0f}s] update micro={micro} ckpt={ckpt} chunk={chunk}: {t:.3f} s, "
              f"{row['tflops']:.1f} TFLOP/s, MFU {row['mfu_pct']:.1f}% (prime-rl's count {row['prime_mfu_pct']:.1f}%), "
              f"peak {row['peak_GB']:.1f} GB", flush=True)
    except Exception as e:  # noqa: BLE001
        res["errors"].append(f"update micro={micro} ckpt={ckpt} chunk={chunk}: {type(e).__name__}: {e}")
        traceback.print_exc()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    save()

# ---- F: the fused step (rollout.fuse), after the update rows so a slow compile cannot cost them ----------------
for B, nad, forms in FUSED if "F" in PARTS else ():
    # the graph again first: part B changed the adapters; graph and fused side by side. A cell's forms compare with
    # its own graph row only (none: no ratio), never with part A's, measured before B changed the adapters
    graph_tok_s.pop((B, nad), None)
    outs.pop((B, nad, "graph"), None)
    outs.pop((B, nad, "graph-topp"), None)
    for mode in (forms or "graph,fused").split(","):
        if time.perf_counter() - t_start > DEADLINE - (75 if mode.startswith("fused") else 15):
            res["errors"].append(f"decode B={B} ad={nad} {mode}: skipped, harness time"); continue
        decode_cell(B, nad, mode, prompts_for(B))

# ---- P: kernel profiles of a decode step -----------------------------------------------------------------------
for B, nad, mode in PROFILES if "P" in PARTS else ():
    if time.perf_counter() - t_start > DEADLINE - 40:
        res["errors"].append(f"profile B={B} ad={nad} {mode}: skipped, harness time"); continue
    try:
        g = torch.Generator().manual_seed(B)
        prompts = [torch.randint(1, c.vocab_size, (PROMPT,), generator=g).tolist() for _ in range(B)]
        eng = engine_for(B, mode, compile=True, _capture=(mode != "static-eager" and CAP))
        eng.generate(requests(B, nad, 8 if not SMOKE else 4, prompts))  # capture + warm-up
        profile_engine(eng, B, nad, mode, prompts)
        del eng
    except Exception as e:  # noqa: BLE001
        res["errors"].append(f"profile B={B} ad={nad} {mode}: {type(e).__name__}: {e}")
        traceback.print_exc()
    save()

# a small update (3 adapters x 8 rows, micro 8 = 3 micro-batches) under the profiler: host-bound or GPU-bound? Its
# host-to-device copies both ways in one process: pinned (collectives.to_device, what learner uses) and pageable
# (.to(device), which waits for the queued kernels): walls interleaved, 3 each, the median
def pageable(t, device):
    return t.to(device)

try:
    if "U" not in PARTS:
        raise LookupError("skipped: U not in PARTS")
    rows = 8 if not SMOKE else 4
    cfg, parts = G.update_setup(m, rows, TP, TR, rows)
    m.train()
    pinned = learner.to_device
    forms = {"pinned": pinned, "pageable": pageable}
    walls = {k: [] for k in forms}
    for rep in range(4):
        for k, fn in forms.items():
            learner.to_device = fn
            ps = parts()
            sync(); t = time.perf_counter()
            learner.policy_update(m, ps, cfg, dev, 0.0)
            sync()
            if rep:  # the first round warms up
                walls[k].append(time.perf_counter() - t)
    for k, fn in forms.items():
        learner.to_device = fn
        ps = parts()
        kn, tk, by, syncs, launches = kernel_stats(lambda: learner.policy_update(m, ps, cfg, dev, 0.0))
        wall = statistics.median(walls[k])
        row = dict(what=f"update 3 adapters x {rows} rows, micro {rows}, {k} copies", copies=k, wall_ms=wall * 1e3,
                   walls_ms=[round(w * 1e3, 1) for w in walls[k]], kernels=kn, kernel_ms=tk / 1e3,
                   gpu_busy_pct=100 * tk / 1e3 / (wall * 1e3), launches=launches, syncs=syncs,
                   top=[(k_[:90], v[0], round(v[1] / 1e3, 2)) for k_, v in sorted(by.items(), key=lambda kv: -kv[1][1])[:12]])
        res["profile"].append(row)
        print(f"[{time.perf_counter() - t_start:.0f}s] small update, {k} copies: wall {wall * 1e3:.0f} ms (unprofiled, median of "
              f"{len(walls[k])}), kernels {kn}, kernel time {tk / 1e3:.0f} ms = {row['gpu_busy_pct']:.0f}% of wall, launches "
              f"{launches}, stream/device syncs {syncs}", flush=True)
except Exception as e:  # noqa: BLE001
    res["errors"].append(f"update profile: {type(e).__name__}: {e}")
    traceback.print_exc()
finally:
    learner.to_device = collectives.to_device
    m.eval()
save()

# ---- the summary tables ------------------------------------------------------------------------------------------
L = [f"\n## A. decode, {MODEL}, bf16, prompt {PROMPT}, {NEW} new tokens (copy bandwidth {bw / 1e9:.0f} GB/s)\n",
     "| batch | adapters | eager tok/s | graph tok/s | graph/eager | graph ms/step | % bench roofline (graph) | % ideal roofline (graph) | peak GB (graph) | fused tok/s | fused/graph | fused ms/step | % ideal roofline (fused) | fused first call s | fused rows = graph's | fused peak GB |",
     "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
d = {(r["batch"], r["adapters"], r["mode"]): r for r in res["decode"]}
for B in BATCHES:
    for nad in (0, 3):
        e, gr, fu = d.get((B, nad, "eager")), d.get((B, nad, "graph")), d.get((B, nad, "fused"))
        f = lambda r, k, s: (s % r[k]) if r else "–"
        L.append(f"| {B} | {nad} | {f(e, 'tok_s', '%.0f')} | {f(gr, 'tok_s', '%.0f')} | "
                 f"{(gr['tok_s'] / e['tok_s']) if (e and gr) else float('nan'):.2f} | {f(gr, 'ms_step', '%.2f')} | "
                 f"{f(gr, 'pct_bench_roof', '%.1f%%')} | {f(gr, 'pct_ideal_roof', '%.1f%%')} | {f(gr, 'peak_GB', '%.1f')} | "
                 f"{f(fu, 'tok_s', '%.0f')} | {(fu['tok_s'] / gr['tok_s']) if (fu and gr) else float('nan'):.2f} | "
                 f"{f(fu, 'ms_step', '%.2f')} | {f(fu, 'pct_ideal_roof', '%.1f%%')} | {f(fu, 'first_call_s', '%.1f')} | "
                 f"{fu.get('same_tokens_rows', '–') if fu else '–'} (max lp diff {fu.get('max_lp_diff') if fu else '–'}) | {f(fu, 'peak_GB', '%.1f')} |")
L += ["\n## F. forms of the static step, each row against the graph row measured before it (fused: compiled with "
      "engines.FUSE_OPTIONS; -3mm: q, k, v as three matmuls; -nogroup: each projection's routed LoRA alone; "
      "-whole: attention over the whole cache; -sdpa / -matmul: the attention form forced; -cdt: coordinate descent "
      "tuning)\n",
      "| batch | adapters | mode | tok/s | x graph | ms/step | % ideal roofline | first call s | rows = graph's | max lp diff | peak GB |",
      "|---|---|---|---|---|---|---|---|---|---|---|"]
for r in res["decode"]:
    if r["mode"] not in ("graph", "eager"):
        L.append(f"| {r['batch']} | {r['adapters']} | {r['mode']} | {r['tok_s']:.0f} | {r.get('x_graph', float('nan')):.2f} | "
                 f"{r['ms_step']:.2f} | {r['pct_ideal_roof']:.1f}% | {r['first_call_s']:.1f} | {r.get('same_tokens_rows', '–')} | "
                 f"{r.get('max_lp_diff', '–')} | {r['peak_GB']:.1f} |")
L += ["\n## P. kernel profiles (per decode step; the update row: whole call)\n",
      "| what | kernels | kernel time | launches | syncs | attention kernel / top kernels |", "|---|---|---|---|---|---|"]
for r in res["profile"]:
    if "kernels_per_step" in r:
        L.append(f"| decode B={r['batch']} ad={r['adapters']} {r['mode']} | {r['kernels_per_step']:.0f} | {r['kernel_us_per_step']:.0f} us | "
                 f"{r['launches_per_step']:.0f} | – | {', '.join(r['attention_kernels'][:2])} / {'; '.join(f'{k} x{n}' for k, n, _ in r['top'][:4])} |")
    else:
        L.append(f"| {r['what']} | {r['kernels']} | {r['kernel_ms']:.0f} ms of {r['wall_ms']:.0f} ms wall ({r['gpu_busy_pct']:.0f}%) | "
                 f"{r['launches']} | {r['syncs']} | {'; '.join(f'{k} x{n}' for k, n, _ in r['top'][:4])} |")
L += [f"\n## B. fused update, 3 adapters x {ROWS} rows (prompt ~{TP}, reply ~{TR}), peak {PEAK:.0f} TFLOP/s\n",
      "| micro-batch | grad ckpt | logits chunk | step s | TFLOP/s | MFU | MFU, prime-rl's LoRA count | peak GB |",
      "|---|---|---|---|---|---|---|---|"]
for r in res["update"]:
    L.append(f"| {r['micro']} | {r['grad_ckpt']} | {r['logits_chunk_tokens'] or 'whole'} | {r['step_s']:.3f} | {r['tflops']:.1f} | "
             f"{r['mfu_pct']:.1f}% | {r['prime_mfu_pct']:.1f}% | {r['peak_GB']:.1f} |")
if res["errors"]:
    L += ["\nerrors:"] + [f"- {x}" for x in res["errors"]]
with open(os.path.join(OUT, "summary.md"), "a") as f:
    f.write("\n".join(L) + "\n")
print("\n".join(L))
EOF
echo "== harness parts ${PARTS:-ABFPU}" | tee -a "$OUT/env.txt"
timeout -k 10 "${HARNESS_LIMIT:-300}" python "$WORK/harness.py" "$OUT" >"$OUT/harness.log" 2>&1
echo "== harness exit $? at $((SECONDS - T0)) s" | tee -a "$OUT/env.txt"
grep -v "^\s*$" "$OUT/harness.log" | grep "^\[" | tail -40

# --- part C: train.py, one step each ------------------------------------------------------------------------
if [ "$HAVE_TRAIN" = 1 ] && [ "${FORMS:-}" != none ]; then
  TOK=${1:-}
  if [ -z "$TOK" ]; then
    TOK="$WORK/tiny_tokenizer"
    python -c "import sys; from model import load_model; load_model('tiny')[1].save_pretrained(sys.argv[1])" "$TOK"
  fi
  [ "${SMOKE:-0}" = 1 ] && SHAPE=smoke
  MODEL="$WORK/random_$SHAPE"
  [ -f "$MODEL/model.safetensors" ] || python bench/random_model.py "$SHAPE" --tokenizer "$TOK" --out "$MODEL" 2>&1 | tail -1
  SMALL=(--config configs/math_3agent.py --model.spec "$MODEL" --rollout.engine torch --rollout.no-progress
         --trainer.logger console --trainer.total-epochs None --trainer.total-steps 1 --trainer.no-val-before-train
         --trainer.test-freq 0 --trainer.save-freq 0
         --data.train-files data/arith_train.jsonl --data.val-files data/arith_val.jsonl
         --data.batch-size 8 --data.val-size 16 --rollout.num-chains 4 --data.max-refinement-iterations 1
         --roles.0.max-tokens 96 --roles.1.max-tokens 64 --roles.2.max-tokens 96 --algo.mini-batch-size 32)
  TR=(torchrun --nproc_per_node 1 --master_port 29573 train.py)
  echo -e "\n## C. train.py, $SHAPE shape, SMALL args, 1 step, no eval (roll = time/rollout, train = the update)\n" >>"$SUMMARY"
  echo "| form | roll s | train s | exit | wall s |" >>"$SUMMARY"
  echo "|---|---|---|---|---|" >>"$SUMMARY"
  runc() {  # name, command...
    local name=$1; shift
    local left=$((TOTAL - (SECONDS - T0)))
    if [ "$left" -lt 45 ]; then echo "| $name | skipped: ${TOTAL}s budget spent | | | |" >>"$SUMMARY"; return; fi
    local limit=$((left < STEP_LIMIT ? left : STEP_LIMIT)) t0=$SECONDS
    rm -rf "$WORK/run_$name"  # never resume an earlier run of this script
    echo "== $name (limit ${limit}s): $*" >"$OUT/c_$name.log"
    timeout -k 5 "$limit" "$@" --trainer.output-dir "$WORK/run_$name" >>"$OUT/c_$name.log" 2>&1
    local rc=$?
    local line; line=$(grep -o "roll [0-9.]*s train [0-9.]*s" "$OUT/c_$name.log" | tail -1)
    echo "| $name | $(echo "$line" | awk '{print $2}' | tr -d s) | $(echo "$line" | awk '{print $4}' | tr -d s) | $rc | $((SECONDS - t0)) |" >>"$SUMMARY"
    echo "== $name: exit $rc in $((SECONDS - t0)) s: $line"
  }
  DEFAULT_FORMS="python_compile torchrun_fsdp_compile python_compile_fuse torchrun_replicate_compile"
  [ "${SMOKE:-0}" = 1 ] && DEFAULT_FORMS="python_eager"  # rollout.compile is a config error without CUDA
  for form in ${FORMS:-$DEFAULT_FORMS}; do
    case $form in
      python_eager) runc python_eager python train.py "${SMALL[@]}" ;;
      python_compile) runc python_compile python train.py "${SMALL[@]}" --rollout.compile ;;
      torchrun_fsdp_compile) runc torchrun_fsdp_compile "${TR[@]}" "${SMALL[@]}" --rollout.compile ;;
      torchrun_replicate_compile) runc torchrun_replicate_compile "${TR[@]}" "${SMALL[@]}" --rollout.compile \
        --trainer.strategy replicate ;;
      python_compile_fuse) runc python_compile_fuse python train.py "${SMALL[@]}" --rollout.compile --rollout.fuse ;;
      torchrun_fsdp_compile_fuse) runc torchrun_fsdp_compile_fuse "${TR[@]}" "${SMALL[@]}" --rollout.compile --rollout.fuse ;;
      none) ;;
      *) echo "unknown form $form" | tee -a "$SUMMARY" ;;
    esac
  done
  for f in "$OUT"/c_*.log; do echo "### $f"; tail -n 12 "$f" | cut -c1-300; done >"$OUT/train_tails.txt"
  rm -f "$OUT"/c_*.log  # the tails are kept: at most 8 files come back from $OUT
fi
echo "== done in $((SECONDS - T0)) s" | tee -a "$OUT/env.txt"
cat "$SUMMARY"
