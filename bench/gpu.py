"""GPU benchmark: TorchEngine's static CUDA-graph decode and the fused update, on random-init
models with the real shapes of Qwen2.5-0.5B and Qwen2.5-1.5B (config only, no weights), bf16.

    python bench/gpu.py                 # CUDA: both models, batch 1/32/256, 0 and 3 mixed adapters, one train step
    python bench/gpu.py --models qwen2.5-0.5b --batches 32 --peak-tflops 989
    python bench/gpu.py --cpu-smoke     # any machine (automatic without CUDA): a tiny config through every code
                                        # path in seconds, and the static step checked against the eager one

Decode: TorchEngine(compile=True) (the decode step captured in a CUDA graph); every row generates exactly
--new-tokens tokens after a --prompt-len token prompt. Decode tokens/s counts decode steps only: the time
of a max_new_tokens=1 call (prefill + first token) is subtracted, and the median of --repeats is taken.
With 3 adapters (LoRA rank 16 on all 7 projections) rows cycle through them in one batch (per-row routing).
HBM roofline: a decode step must read every weight once (the tied embedding/lm_head counted once, adapters
included), the KV cache of every row at its mean context (prompt + new/2), and make the sampler's passes
over the (batch x vocabulary) logits (SAMPLING_BYTES_PER_LOGIT: at a 152k vocabulary and batch 256 they
move more bytes than the 0.5B model's weights): roofline tokens/s = batch * bandwidth / bytes per step,
with the bandwidth measured here (a large device-to-device copy).
The static step actually reads the whole rounded-up cache (masked), which the percentage pays for.
Fair roofline (fair_roofline_tps): what no implementation can beat: the weights read once, each row's KV
cache at its mean context, bf16 logits written and read once (the sampler's own passes are overhead, not
required traffic), and a compute ceiling (2 x active matmul params + attention FLOPs per row over the bf16
peak); the step takes the longer of the two.
Train: one fused policy_update (train.py) over 3 adapters' rows, micro-batches of --train-micro rows;
MFU = model FLOPs / time / peak, where model FLOPs = 4 x matmul params x tokens (forward 2, backward 2:
the frozen base has no weight gradients) + the lm_head on the generated columns + causal attention
(x3 for forward + backward); the peak is bf16 dense, looked up from the device name or --peak-tflops.
Beside it, prime-rl's LoRA-aware count (prime_rl_flops, its trainer/perf.py): 4 x active matmul params
(the lm_head included, on every token) + 6 x one adapter's params per token, + 12 x layers x heads x
head_dim x length^2 per row for attention (no causal discount), padding not counted.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [ROOT] + [x for x in sys.path if os.path.abspath(x or ".") != os.path.join(ROOT, "bench")]  # not bench/lora.py
import lora  # noqa: E402
from rollout import Request, SamplingParams, Sample, TorchEngine  # noqa: E402
import learner

# the real shapes (the models' config.json on the hub); weights are random
CONFIGS = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "smoke": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
}
COMMON = dict(model_type="qwen2", rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=32768,
              hidden_act="silu", use_sliding_window=False, attention_dropout=0.0)
# bf16 dense peaks by device name, the more specific name first (an H100 PCIe card peaks at 756, not 989)
PEAK_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H200": 989.0, "H100": 989.0, "A100": 312.0,
                    "L40S": 362.0, "A10G": 70.0, "L4": 121.0}
# bytes one unfiltered sampling step moves per logit (sampling.sample, eager: the graph form): lm_head writes bf16 (2),
# .float() reads it and writes fp32 (6), / temperature (8), log_softmax (two reads, one write: 12), exp (8), the block
# sums (4), greedy's argmax (4). 52 before 2026-12-05, with a padded copy of the probabilities (8). The fused (compiled)
# step writes nothing of (B, V) past the lm_head (tests/test_rollout.py), so this over-counts it
SAMPLING_BYTES_PER_LOGIT = 44


def peak_tflops(device_name: str) -> float | None:
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)
ADAPTERS = ["a0", "a1", "a2"]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class IdTokenizer:
    """What TorchEngine and AdapterBatch read from a tokenizer; the text is the ids (nothing here reads it)."""
    eos_token_id, pad_token_id = 0, 0

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def build(name, dtype, device, adapters: bool, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(**COMMON, **CONFIGS[name])
    with torch.device(device):
        m = Qwen2ForCausalLM(cfg).to(dtype).eval()
    if adapters:
        lora.add_lora(m, ADAPTERS, rank=16, alpha=32, targets=TARGETS, seed=seed)
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for n in ADAPTERS:  # B starts at zero: give every adapter a real (small) delta
                for p in lora.adapter_parameters(m, n):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return m


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def bandwidth(device, nbytes) -> float:
    """Bytes/s of a large device-to-device copy (read + write)."""
    x = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    y = torch.empty_like(x)
    y.copy_(x)
    sync(device)
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(4):
            y.copy_(x)
        sync(device)
        ts.append((time.perf_counter() - t) / 4)
    return 2 * nbytes / min(ts)


def weight_bytes(m) -> int:
    seen, n = set(), 0
    for p in m.parameters():  # tied embedding / lm_head: one tensor, counted once
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            n += p.numel() * p.element_size()
    return n


def active_mm_params(c) -> int:
    """Matmul weights one token passes through in a dense GQA model (prime-rl's get_active_mm_params): q, k,
    v, o, the MLP's gate, up and down, and the lm_head."""
    hd = c.hidden_size // c.num_attention_heads
    attn = c.hidden_size * hd * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    return c.num_hidden_layers * (attn + 3 * c.intermediate_size * c.hidden_size) + c.vocab_size * c.hidden_size


def prime_rl_flops(c, adapter_params: int, seq_lens) -> float:
    """prime-rl's LoRA-aware training FLOPs of rows of these lengths: per token 4 x active matmul params
    (forward 2, the input gradient through the frozen base 2) + 6 x the adapter's params; per row 12 x
    layers x heads x head_dim x length^2 (attention, forward and backward, no causal discount)."""
    hd = c.hidden_size // c.num_attention_heads
    per_token = 4 * active_mm_params(c) + 6 * adapter_params
    return float(sum(per_token * n + 12 * c.num_hidden_layers * c.num_attention_heads * hd * n * n for n in seq_lens))


def fair_roofline_tps(c, B, weight_bytes, ctx, bandwidth, peak_flops, adapter_params=0, dtype_bytes=2) -> float:
    """Decode tokens/s at the hardware's limit: a step reads the weights once (weight_bytes), each row's KV
    cache at `ctx` tokens, and writes and reads B x vocabulary logits once in bf16; it does, per row, 2 x the
    active matmul params (+ its adapter's) + 4 x layers x heads x head_dim x ctx (QK^T and AV) FLOPs. The
    step takes the longer of bytes / bandwidth and FLOPs / peak (no compute ceiling when the peak is None)."""
    hd = c.hidden_size // c.num_attention_heads
    kv = B * c.num_hidden_layers * 2 * c.num_key_value_heads * hd * ctx * dtype_bytes
    logits = B * c.vocab_size * 2 * dtype_bytes
    flops = B * (2 * (active_mm_params(c) + adapter_params) + 4 * c.num_hidden_layers * c.num_attention_heads * hd * ctx)
    t = max((weight_bytes + kv + logits) / bandwidth, flops / peak_flops if peak_flops else 0.0)
    return B / t


def kv_bytes_per_row(m, ctx) -> int:
    c = m.config
    head_dim = c.hidden_size // c.num_attention_heads
    return c.num_hidden_layers * 2 * c.num_key_value_heads * head_dim * ctx * m.lm_head.weight.element_size()


def decode_bench(m, device, B, n_adapters, prompt_len, new_tokens, repeats, capture):
    tok = IdTokenizer()
    eng = TorchEngine(m, tok, max_batch_size=B, compile=True, _capture=capture)
    g = torch.Generator().manual_seed(B)
    V = m.config.vocab_size
    prompts = [torch.randint(1, V, (prompt_len,), generator=g).tolist() for _ in range(B)]
    names = [ADAPTERS[i % 3] if n_adapters else None for i in range(B)]

    def run(n):
        reqs = [Request(p, a, SamplingParams(max_new_tokens=n, temperature=1.0, stop_token_ids=[], seed=i))
                for i, (p, a) in enumerate(zip(prompts, names))]
        sync(device)
        t = time.perf_counter()
        out = eng.generate(reqs)
        sync(device)
        assert all(len(r.completion_ids) == n for r in out)
        return time.perf_counter() - t

    run(new_tokens)  # capture (the graph for this shape) and warm up
    run(1)
    t_full = statistics.median([run(new_tokens) for _ in range(repeats)])
    t_first = statistics.median([run(1) for _ in range(repeats)])
    dt = max(t_full - t_first, 1e-9) / (new_tokens - 1)  # seconds per decode step
    return B / dt, dt


def static_equals_eager(device, capture) -> bool:
    """The static step (graph replay on CUDA) against the eager loop, fp32 smoke model, mixed adapters,
    ragged lengths, greedy and sampled: the same tokens."""
    m = build("smoke", torch.float32, device, adapters=True, seed=3)
    tok = IdTokenizer()
    g = torch.Generator().manual_seed(0)
    reqs = [Request(torch.randint(1, 512, (5 + 3 * i,), generator=g).tolist(), [None, *ADAPTERS][i % 4],
                    SamplingParams(max_new_tokens=6 + 5 * i, greedy=i % 2 == 0, seed=i, stop_token_ids=[7]))
            for i in range(6)]
    a = TorchEngine(m, tok, compile=True, _capture=capture, sync_every=4).generate(reqs)
    b = TorchEngine(m, tok).generate(reqs)
    return [r.completion_ids for r in a] == [r.completion_ids for r in b]


def update_setup(m, rows_per_adapter, prompt_len, reply_len, micro, chunk=256):
    """A fused 3-adapter update on random tokens -> (config, parts()): each call of parts() makes a fresh batch of
    rows_per_adapter rows per adapter (prompt ~prompt_len, reply ~reply_len) for learner.policy_update.
    chunk: algo.logits_chunk_tokens (0 = whole logits)."""
    from learner import AdapterBatch
    from config import AlgoConfig, Config, LoRAConfig, RoleConfig
    roles = tuple(RoleConfig(n, max_tokens=reply_len) for n in ADAPTERS)
    cfg = Config(roles=roles, lora=LoRAConfig(rank=16, alpha=32, dropout=0.0, targets=TARGETS),
                 algo=AlgoConfig(adv_estimator="grpo", mini_batch_size=rows_per_adapter, micro_batch_size=micro,
                                 ppo_epochs=1, fused_update=True, logits_chunk_tokens=chunk))
    g = torch.Generator().manual_seed(0)
    V = m.config.vocab_size
    opts = {n: torch.optim.AdamW(lora.adapter_parameters(m, n), lr=1e-5) for n in ADAPTERS}

    def parts():
        out = []
        for k, n in enumerate(ADAPTERS):
            samples = []
            for i in range(rows_per_adapter):
                P, C = prompt_len - (i * 7) % (prompt_len // 4), reply_len - (i * 13) % (reply_len // 2)
                ids = torch.randint(1, V, (P + C,), generator=g).tolist()
                samples.append(Sample(i, i // 4, n, 0, ids[:P], ids[P:], [-2.0] * C, reward=float(i % 2)))
            rb = AdapterBatch(samples, [1.0] * len(samples), 0, reply_len)
            adv = torch.randn(rb.mask.shape, generator=g) * rb.mask  # (N, T)
            out.append(learner.AdapterUpdate(n, rb, adv, rb.sample_logp.clone(), None, opts[n],
                                  torch.optim.lr_scheduler.LambdaLR(opts[n], lambda s: 1.0),
                                  torch.Generator().manual_seed(k)))
        return out
    return cfg, parts


def train_bench(m, device, rows_per_adapter, prompt_len, reply_len, micro, repeats, chunk=256):
    """Seconds per fused policy_update (3 adapters) and its model FLOPs (the chunked head's recomputation in
    backward not counted: the same model FLOPs either way)."""
    cfg, parts = update_setup(m, rows_per_adapter, prompt_len, reply_len, micro, chunk)
    m.train()
    ps = parts()
    learner.policy_update(m, ps, cfg, device, 0.0)  # warm-up
    ts = []
    for _ in range(repeats):
        ps = parts()
        sync(device)
        t = time.perf_counter()
        learner.policy_update(m, ps, cfg, device, 0.0)
        sync(device)
        ts.append(time.perf_counter() - t)
    m.eval()
    # model FLOPs of the rows actually trained (padding not counted)
    c = m.config
    hd = c.hidden_size // c.num_attention_heads
    body = sum(mod.weight.numel() for name, mod in m.named_modules()
               if isinstance(mod, torch.nn.Linear) and ".layers." in name)  # base linears (LoRA's inner ones too)
    flops = 0.0
    for p in ps:
        for s in p.batch.samples:
            T, C = len(s.prompt_ids) + len(s.completion_ids), len(s.completion_ids)
            flops += 4 * body * T + 4 * c.vocab_size * c.hidden_size * C
            flops += 3 * 2 * c.num_hidden_layers * c.num_attention_heads * hd * T * T  # causal QK^T + AV, fwd + bwd
    one = sum(p.numel() for p in lora.adapter_parameters(m, ADAPTERS[0]))  # each token wears one adapter
    prime = prime_rl_flops(c, one, [len(s.prompt_ids) + len(s.completion_ids) for p in ps for s in p.batch.samples])
    return statistics.median(ts), flops, prime


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-1.5b")
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-rows", type=int, default=32, help="rows per adapter in the train step")
    ap.add_argument("--train-prompt", type=int, default=256)
    ap.add_argument("--train-reply", type=int, default=256)
    ap.add_argument("--train-micro", type=int, default=8)
    ap.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak (default: from the device name)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny config on CPU: every code path, in seconds")
    a = ap.parse_args(argv)
    smoke = a.cpu_smoke or not torch.cuda.is_available()
    if smoke:
        if not a.cpu_smoke:
            print("no CUDA device: running the CPU smoke test (--cpu-smoke); the GPU figures need a GPU")
        device, capture, dtype = torch.device("cpu"), False, torch.bfloat16
        models, batches = ["smoke"], [1, 4]
        a.prompt_len, a.new_tokens, a.repeats = 8, 6, 1
        a.train_rows, a.train_prompt, a.train_reply, a.train_micro = 4, 12, 8, 4
        bw_bytes = 64 << 20
    else:
        device, capture, dtype = torch.device("cuda"), True, torch.bfloat16
        models, batches = a.models.split(","), [int(b) for b in a.batches.split(",")]
        bw_bytes = 2 << 30
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    peak = a.peak_tflops or peak_tflops(name)
    bw = bandwidth(device, bw_bytes)
    print(f"device {name}, torch {torch.__version__}, measured copy bandwidth {bw / 1e9:.0f} GB/s, bf16 peak "
          f"{f'{peak:.0f} TFLOP/s' if peak else 'unknown (--peak-tflops)'}")
    eq = static_equals_eager(device, capture)
    print(f"static decode step ({'CUDA graph' if capture else 'eager, no capture'}) == eager loop: {eq}")
    if smoke and not eq:
        raise SystemExit("static step differs from the eager loop")
    rows = []
    for mname in models:
        m = build(mname, dtype, device, adapters=True)
        wb = weight_bytes(m)
        lora_b = sum(p.numel() * p.element_size() for n in ADAPTERS for p in lora.adapter_parameters(m, n))
        one = sum(p.numel() for p in lora.adapter_parameters(m, ADAPTERS[0]))
        for B in batches:
            for n_ad in (0, 3):
                tps, dt = decode_bench(m, device, B, n_ad, a.prompt_len, a.new_tokens, a.repeats, capture)
                step_bytes = ((wb if n_ad else wb - lora_b) + B * kv_bytes_per_row(m, a.prompt_len + a.new_tokens // 2)
                              + B * m.config.vocab_size * SAMPLING_BYTES_PER_LOGIT)
                roof = B * bw / step_bytes
                ctx = a.prompt_len + a.new_tokens // 2
                fair_bytes = wb - lora_b + (lora_b // 2 if n_ad else 0)  # the adapters read once, in bf16
                fair = fair_roofline_tps(m.config, B, fair_bytes, ctx, bw, peak * 1e12 if peak else None, one if n_ad else 0)
                rows.append((mname, B, n_ad, tps, dt * 1e3, roof, 100 * tps / roof, fair, 100 * tps / fair))
                print(f"  {mname} B={B} adapters={n_ad}: {tps:.0f} tok/s", flush=True)
        t, flops, prime = train_bench(m, device, a.train_rows, a.train_prompt, a.train_reply, a.train_micro, a.repeats)
        tf, ptf = flops / t / 1e12, prime / t / 1e12
        mfu = f"{100 * tf / peak:.1f}%" if peak else "n/a"
        pmfu = f"{100 * ptf / peak:.1f}%" if peak else "n/a"
        rows.append((mname, "train", t, tf, mfu, pmfu))
        print(f"  {mname} fused update: {t:.3f} s", flush=True)
        del m
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"\ndecode (prompt {a.prompt_len}, {a.new_tokens} new tokens, bf16, "
          f"{'CUDA graph' if capture else 'static step, no capture'}):")
    print("| model | batch | adapters | decode tok/s | ms/step | HBM roofline tok/s | % of roofline | fair roofline tok/s "
          "| % of fair |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r[1] != "train":
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.0f} | {r[4]:.2f} | {r[5]:.0f} | {r[6]:.1f}% | {r[7]:.0f} | {r[8]:.1f}% |")
    print(f"\nfused update, 3 adapters x {a.train_rows} rows (prompt ~{a.train_prompt}, reply ~{a.train_reply}), "
          f"micro-batch {a.train_micro}:")
    print("| model | step s | model TFLOP/s | MFU | MFU, prime-rl's LoRA count |")
    print("|---|---|---|---|---|")
    for r in rows:
        if r[1] == "train":
            print(f"| {r[0]} | {r[2]:.3f} | {r[3]:.2f} | {r[4]} | {r[5]} |")
    return rows


if __name__ == "__main__":
    main()
