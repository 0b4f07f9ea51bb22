"""Inference engines behind one small interface (the episode driver, rollout.py, calls them).

Engines share one tiny interface, `generate(requests) -> results`:
  Request(prompt_ids, adapter, sampling)       adapter = the role's LoRA name, None = base model
  Result(completion_ids, logprobs, finish_reason, stop_reason, text)

TorchEngine: the embedded default, pure PyTorch, CPU or CUDA, and it shares the trainer's model
object, so a weight update is visible at the next call with nothing to copy. It runs its own
decode loop over the HF modules (gpt-fast style) instead of `model.generate`:
  - left-padded prompts, per-row position ids, one preallocated KV cache per layer (B, Hkv, L, D);
  - rows with different adapters in ONE forward (lora.set_row_adapters);
  - per-row stopping (EOS / stop ids / stop strings / length); finished rows are dropped from
    the batch (cache compaction) once they are 1/8 of it, so they stop costing compute;
  - no Python loop over rows on the hot path: per-row state lives in device tensors (_Rows),
    sampling (sampling.py) is vectorised (inverse CDF with a counter-based uniform keyed by (row seed, token
    index): a row's sample depends only on its own logits and seed, never on its batch), stop ids
    are checked on device, and the host syncs every `sync_every` steps (decoding text only for
    rows that have stop strings);
  - logits only for the last position, sampling in fp32 (the CDF in fp64);
  - a prefix cache (PrefixCache, prefix_kv.py): a finished row's KV is kept, and a later request under the same
    adapter whose prompt extends it (a ReAct step, a role's next round) prefills only the new tokens.
compile=True (CUDA): a static-shape decode step captured in CUDA graphs (static_step.py, see TorchEngine).
Supported architectures: the Llama family (llama, qwen2, qwen3, mistral: RMSNorm + RoPE + GQA
decoder layers). Sliding-window attention is not applied (Qwen2.5 ships it disabled).

VLLMEngine, the same interface over vLLM, lives in vllm_engine.py.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import lora
from prefix_kv import PrefixCache
from sampling import sample
from static_step import StaticDecode, cache_window

# --------------------------------------------------------------------------------------------
# the interface


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    greedy: bool = False
    stop_token_ids: list[int] | None = None  # None = the tokenizer's EOS
    stop: list[str] = field(default_factory=list)  # stop strings; the completing token is kept
    seed: int | None = None

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and self.temperature <= 0:
            raise ValueError(f"SamplingParams.temperature must be > 0 (or greedy=True), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Request:
    prompt_ids: list[int]
    adapter: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class Result:
    completion_ids: list[int]
    logprobs: list[float]  # of each sampled token under the distribution it was sampled from
    finish_reason: str  # "stop" | "length"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    text: str = ""


# torch.compile's inductor options for the fused decode step (TorchEngine(fuse=True), rollout.fuse), read when an
# engine is built. emulate_precision_casts: inductor rounds where the eager bf16 ops round (the forward is bit for bit
# the plain step's on CPU below static_step.ATTN_MATMUL_MIN_BATCH slots; from there the two attend in other forms).
# Not coordinate_descent_tuning (gpt-fast's setting, under which inductor writes batch 1's matmuls as its own fused
# reductions): on an H200 at batch 1 it cut the kernels of a step 413 -> 328 at the same kernel time (2.04 ms), ran
# 424 against 445 tok/s and compiled in 76 s against 37 (docs/benchmarks.md).
FUSE_OPTIONS = {"emulate_precision_casts": True}


# --------------------------------------------------------------------------------------------
# TorchEngine

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


@dataclass
class _Rows:
    """The device state of one batch, one entry per batch slot (dim 0 of every tensor)."""
    tok: torch.Tensor  # (B,) the last sampled token (the next forward's input)
    pad: torch.Tensor  # (B,) left padding of each prompt
    key_ok: torch.Tensor  # (B, L) real (non-pad) cache columns (static path: L + 1, the last never attended)
    kv: list  # per layer (K, V), each (B, Hkv, L, D) (static path: L + 1 columns, the last never attended)
    temp: torch.Tensor  # (B, 1)
    top_k: torch.Tensor  # (B, 1)
    top_p: torch.Tensor  # (B, 1)
    greedy: torch.Tensor  # (B,)
    seed: torch.Tensor  # (B,) int64
    stop_ids: torch.Tensor  # (B, S) stop token ids, -1 = none
    out_tok: torch.Tensor  # (B, N) sampled tokens
    out_lp: torch.Tensor  # (B, N) their logprobs
    end: torch.Tensor  # (B,) completion length: max_new_tokens until a stop id is sampled
    by_id: torch.Tensor  # (B,) bool: `end` came from a stop id

    def select(self, k, filled: int):
        """Keep slots k (a device index tensor): finished rows leave the batch and the cache. Only
        the cache columns written so far, [0, filled), are copied (the rest are written before they
        are read); index_select, not k-indexing: measured ~2x faster on CPU for the same copy."""
        def rows(x):
            return x.index_select(0, k)

        def cache(x):
            out = x.new_empty((len(k),) + x.shape[1:])
            torch.index_select(x[:, :, :filled], 0, k, out=out[:, :, :filled])
            return out
        return _Rows(**{f.name: ([(cache(K), cache(V)) for K, V in self.kv] if f.name == "kv" else rows(getattr(self, f.name)))
                        for f in dataclasses.fields(self)})


class TorchEngine(StaticDecode):
    """Batched generation with a preallocated KV cache on the trainer's own model object.

    Two decode paths, one result (tested token for token and logprob for logprob):
    - eager (default): finished rows leave the batch and the cache (compaction) at a host sync
      where they are >= 1/8 of the batch (compacting at every finished row copied the cache more
      often than running the finished rows on cost), and attention reads only the cache columns
      written so far;
    - static, compile=True (CUDA only): fixed shapes, gpt-fast style. The batch is padded to a
      power-of-two number of slots (dummy rows finish at once), the cache length is rounded up to
      a multiple of 64, rows keep their slots (no compaction: finished rows run on, their tokens
      are dropped), attention reads a window of the cache that holds the columns written so far
      (cache_window: 64, 128, 192, 256, 384, ... columns, never the whole cache sized for
      max_new_tokens unless the generation got there; `_cache_windows=False` reads the whole cache, for
      benchmarks) under a mask, and the decode step (forward +
      sampling + stop-id checks, all on device) is captured once per shape and window in a CUDA graph and
      replayed. On another device compile=True is an error, not a silent fallback. (`_capture`
      is a test hook: False runs the same static step eagerly, so CPU tests can compare paths.)
      The step multiplies by the q, k and v base weights as one concatenated matrix (_refresh_qkv;
      `_qkv_matmul=False` keeps three, for benchmarks): on an H200, 1.07x the graph's tok/s at batch
      1 and 1.05x at batch 256 (docs/benchmarks.md), for a copy of those weights. Routed adapters on
      projections that share an input run as one group (_refresh_lora_groups; `_lora_group=False` runs
      them one projection at a time, for benchmarks): 13 LoRA ops a layer instead of 21 with all seven
      projections adapted. The fused step attends with two batched matmuls and a softmax from
      ATTN_MATMUL_MIN_BATCH slots, SDPA below.
      fuse=True (with compile=True) compiles that step with torch.compile first (fullgraph; inductor
      fuses the elementwise work between the matmuls; one compilation per kind of batch, when it
      first appears: batch 1, 2-63 or 64+ slots (the attention form), routing on/off, top-k/top-p or
      not; ~40-85 s each on an H200),
      then captures it: 1.4-2.1x the plain graph's tok/s there. Same logprobs as the plain step to
      rounding: on CPU the forward is bit for bit below ATTN_MATMUL_MIN_BATCH slots (tested, bf16 base;
      from there the fused step attends with matmuls, the plain one with SDPA), and the sampler's sums run in
      another order, so a top-p row can keep another set at its boundary and draw another token (1
      of 4 SmolLM2 rows, at token 9); on an H200 (random weights of Qwen2.5-1.5B's shape) within
      0.008 on rows whose tokens agree, so seeded rows sample the same tokens until a near tie (a
      third of 256 rows identical over 64 tokens on random weights' flat distributions).
    sync_every: the host looks at the batch (finished rows, stop strings, compaction) every this
    many decode steps; a row that finished in between runs on until then and its extra tokens are
    dropped, so results do not depend on it. None = 8 on CUDA (each sync stalls the GPU), 1 on CPU
    (there a sync costs nothing and late compaction would cost compute).
    prefix_cache_tokens (eager path only; 0 = off): a finished row's KV is kept (PrefixCache, an LRU
    of at most this many tokens), and a later request under the same adapter whose prompt extends a
    kept sequence restores that KV and prefills only the rest. Rows are prefilled in groups of similar
    uncached suffix (_prefill_groups), each group in one forward over the window of its longest suffix (a row
    with a shorter one recomputes the few cached tokens inside it), so ragged prefixes and misses share
    a batch. Same tokens and logprobs as without the cache (to float rounding). The cache is cleared by sync() (the trainer calls it after
    each update) and whenever a parameter's version counter or storage changed since the last call
    (an optimizer step or copy_ in place); an update through `.data` bypasses the version counter,
    so call sync() after one. `prefilled_tokens` / `cached_tokens` count prompt tokens forwarded /
    restored, over the engine's life. The static path (compile=True) does not use the cache.
    """

    def __init__(self, model, tokenizer, max_batch_size: int = 64, seed: int = 0, compile: bool = False,
                 sync_every: int | None = None, prefix_cache_tokens: int = 65536, fuse: bool = False, *,
                 _capture: bool = True, _qkv_matmul: bool = True, _lora_group: bool = True, _cache_windows: bool = True,
                 _attention: str = "auto"):
        mt = getattr(model.config, "model_type", None)
        if mt not in SUPPORTED:
            raise NotImplementedError(f"TorchEngine supports {SUPPORTED} decoder layers, not {mt!r}; use VLLMEngine")
        dev = next(model.parameters()).device
        if compile and _capture and dev.type != "cuda":
            raise ValueError(f"TorchEngine(compile=True) captures the decode step in a CUDA graph and needs the "
                             f"model on a CUDA device; it is on {dev}. Use compile=False on CPU.")
        if fuse and not compile:
            raise ValueError("TorchEngine(fuse=True) compiles the static decode step: it needs compile=True")
        if sync_every is None:
            sync_every = 8 if dev.type == "cuda" else 1
        if sync_every < 1:
            raise ValueError(f"TorchEngine: sync_every must be >= 1, got {sync_every}")
        if prefix_cache_tokens < 0:
            raise ValueError(f"TorchEngine: prefix_cache_tokens must be >= 0 (0 = off), got {prefix_cache_tokens}")
        self.model, self.tok = model, tokenizer
        self.max_batch_size, self.compile, self.sync_every = max_batch_size, compile, sync_every
        self._capture = _capture
        self._qkv_matmul = _qkv_matmul  # False: the static step's q, k, v as three matmuls (a benchmark's A/B hook)
        self._lora_group = _lora_group  # False: the static step's routed LoRA one projection at a time (A/B hook)
        self._cache_windows = _cache_windows  # False: the static step attends to the whole cache at every step (A/B hook)
        if _attention not in ("auto", "sdpa", "matmul"):
            raise ValueError(f"TorchEngine: _attention is 'auto', 'sdpa' or 'matmul', not {_attention!r}")
        self._attention = _attention  # the static step's attention form (_matmul_attention; sdpa/matmul: A/B hooks)
        # fuse: the static step's forward + sampling as ONE torch.compile graph (inductor fuses the norms, RoPE,
        # residual adds, SiLU * up, the mask and the sampler's elementwise work; fullgraph, so a break is an error,
        # not a silent eager fallback), then captured in the CUDA graph like the plain step, by an inductor
        # that rounds where the eager bf16 ops round (emulate_precision_casts): on CPU the forward is bit-exact
        # below ATTN_MATMUL_MIN_BATCH slots (from there the fused step's attention is matmuls, the plain step's SDPA).
        # The first batch shape compiles with static sizes but the attention window (symbolic from the start: it
        # changes within a call); a second recompiles with the batch and cache sizes symbolic too (torch.compile's
        # automatic dynamic shapes), which every later shape reuses
        self._step_fn = self._step_body
        if fuse:
            compiled = torch.compile(self._step_body, fullgraph=True, options=dict(FUSE_OPTIONS))

            def _step_fn(b, step, P, filtered, key_ok):  # batch 1 / 2-63 / 64+, sampling filters, routing on/off
                torch._dynamo.maybe_mark_dynamic(key_ok, 1)  # specialise: up to 12 kinds, each 1-2 graphs
                with torch._dynamo.config.patch(recompile_limit=64):
                    return compiled(b, step, P, filtered, key_ok)
            self._step_fn = _step_fn
        self.fuse = fuse
        self._compact_div = 8  # compact when >= 1/this of the batch has finished
        self.gen = torch.Generator().manual_seed(seed)  # seeds rows whose request has no seed
        self._graphs = {}  # static path: shape -> (step function, static _Rows, step, P, routing mask, its graphs, ...)
        self._qkv = []  # static path: per layer [key, q+k+v base weights, biases] (_refresh_qkv)
        self._lora_groups = {}  # static path: (layer, "qkv" | "mlp") -> (A_group, B block-diagonal | None)
        self._lora_group_keys = {}  # ... -> the members' routed buffers' (data_ptr, version) at the last copy
        self.prefix = PrefixCache(prefix_cache_tokens)
        self._weights_seen = None  # (data_ptr, version) of every parameter when the cache was filled
        self.prefilled_tokens = self.cached_tokens = 0  # prompt tokens forwarded / restored from the cache
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        self._rope = apply_rotary_pos_emb

    def state_dict(self):
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, d):
        self.gen.set_state(d["gen"])

    def sync(self, *_, **__):
        """The engine runs the trainer's model object itself, so no weights to copy; the prefix cache
        was computed with the old weights and is dropped."""
        self.prefix.clear()
        return 0.0

    def release(self):
        """Free what the engine holds between rollouts (the prefix cache's KV) before the trainer's
        forward and backward need the memory; the next rollout starts with an empty cache."""
        self.prefix.clear()

    def _check_weights(self):
        """Clear the prefix cache when any parameter changed in place (its version counter moves) or
        was replaced (FSDP gathering, a reloaded model) since the last call: a cheap key of the weights."""
        seen = tuple((p.data_ptr(), p._version) for p in self.model.parameters())
        if seen != self._weights_seen:
            self.prefix.clear()
            self._weights_seen = seen

    @torch.no_grad()
    def generate(self, requests: list[Request], progress=None) -> list[Result]:
        """progress(done, total): called at every host sync with decode steps done / planned over the
        call's batches (for a progress bar; finished rows shrink a batch, so it runs ahead, never behind)."""
        # Under FSDP2 the decode loop calls submodules directly, which bypasses FSDP's forward
        # hooks: gather every shard once for the whole call (what a rollout engine does anyway).
        from torch.distributed.fsdp import FSDPModule
        fsdp = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
        for m in fsdp:
            m.unshard()
        if fsdp:
            lora.refresh_routed(self.model, force=True)  # gathered weights: copy them into the routed buffers
            for buf in self._qkv:  # and into the q/k/v buffers (FSDP's gather keeps the version counter, and can
                buf[0] = None  # hand back the same storage)
        self._check_weights()
        was_training = self.model.training
        self.model.eval()
        try:
            out, chunks = [], [requests[i:i + self.max_batch_size] for i in range(0, len(requests), self.max_batch_size)]
            plan = [max(r.sampling.max_new_tokens for r in c) for c in chunks]  # decode steps each batch may take
            for k, c in enumerate(chunks):
                tick = None if progress is None else (lambda s, k=k: progress(sum(plan[:k]) + s, sum(plan)))
                out += self._generate_batch(c, tick)
        finally:
            self.model.train(was_training)
            if lora.lora_modules(self.model):
                lora.set_adapter(self.model, None)
            for m in fsdp:
                m.reshard()
        return out

    # one forward over new tokens x (B, q) written at cache column col ---------------------------
    def _forward(self, x, pos, col, kv, key_ok):
        """col an int: prefill (q > 1) or an eager decode step; attends to the columns [0, col+q).
        col a 0-dim tensor (static path): one token per row written at column col with index_copy_,
        attending to the window of the cache key_ok spans (b.key_ok[:, :W]) under the mask key_ok & (column <= col)."""
        m = self.model.model
        if torch.compiler.is_compiling():  # the fused step: the lookup without the module's hooks (gradient
            h = F.embedding(x, m.embed_tokens.weight)  # checkpointing's requires_grad_ hook breaks dynamo 2.11's graph)
        else:
            h = m.embed_tokens(x)  # (B, q, d)
        cos, sin = m.rotary_emb(h, pos)
        B, q = x.shape
        static = isinstance(col, torch.Tensor)
        Lc = key_ok.shape[1]
        if static:
            mask = (key_ok & (torch.arange(Lc, device=x.device) <= col))[:, None, None, :]  # (B, 1, 1, L)
        elif q == 1:
            Lc = col + 1
            mask = key_ok[:, None, None, :Lc]  # (B, 1, 1, L)
        else:
            Lc = col + q
            causal = torch.arange(Lc, device=x.device)[None, :] <= (col + torch.arange(q, device=x.device))[:, None]
            mask = causal[None, None] & key_ok[:, None, None, :Lc]  # (B, 1, q, L)
            mask[..., col:Lc] |= torch.eye(q, dtype=torch.bool, device=x.device)  # pad queries see themselves: no NaN
        matmul_attention = static and self._matmul_attention(B)
        masked_out = ~mask if matmul_attention else None  # once a step, not once a layer
        for li, layer in enumerate(m.layers):
            a = layer.self_attn
            r = h
            h = layer.input_layernorm(h)
            hs = (B, q, -1, a.head_dim)
            if static and self._qkv_matmul:  # one matmul for q, k and v (the concatenated base weights) + adapters
                qs, ks, vs = (t.reshape(hs) for t in self._static_qkv(li, a, h))
            else:
                qs, ks, vs = a.q_proj(h).view(hs), a.k_proj(h).view(hs), a.v_proj(h).view(hs)
            if hasattr(a, "q_norm"):  # qwen3
                qs, ks = a.q_norm(qs), a.k_norm(ks)
            qs, ks, vs = qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2)  # (B, H, q, D)
            qs, ks = self._rope(qs, ks, cos, sin)
            K, V = kv[li]
            if static:
                K.index_copy_(2, col.view(1), ks)
                V.index_copy_(2, col.view(1), vs)
            else:
                K[:, :, col:Lc] = ks
                V[:, :, col:Lc] = vs
            Hkv = K.shape[1]
            G = qs.shape[1] // Hkv
            if matmul_attention:  # two batched matmuls and an fp32 softmax (q = 1)
                # the scale on q (one rounding, the smaller tensor); the scores are rounded to the compute dtype as
                # in HF's eager attention (SDPA's kernels keep them in fp32), then softmaxed in fp32
                sc = (qs.reshape(B, Hkv, G, -1) * a.scaling) @ K[:, :, :Lc].transpose(-1, -2)  # (B, Hkv, G, Lc)
                o = sc.masked_fill(masked_out, float("-inf")).float().softmax(-1).to(V.dtype) @ V[:, :, :Lc]
            else:
                # the G query heads of a KV head attend as G*q queries of one head: no K/V repeat, and no
                # enable_gqa, which together with a mask rules out the fused SDPA kernels (math fallback)
                gmask = mask if q == 1 else mask[:, :, None].expand(-1, -1, G, -1, -1).reshape(B, 1, G * q, -1)
                o = F.scaled_dot_product_attention(qs.reshape(B, Hkv, G * q, -1), K[:, :, :Lc], V[:, :, :Lc],
                                                   attn_mask=gmask, scale=a.scaling)  # (B, Hkv, G*q, D)
            h = r + a.o_proj(o.reshape(B, -1, q, a.head_dim).transpose(1, 2).reshape(B, q, -1))
            x_ = layer.post_attention_layernorm(h)
            h = h + (self._static_mlp(li, layer.mlp, x_) if static else layer.mlp(x_))
        return self.model.lm_head(m.norm(h[:, -1])).float()  # (B, V) last position only

    def _sample_into(self, b: _Rows, logits, step, filtered):
        """Sample token `step` (0-dim int64 tensor) of every row into b.out_tok / b.out_lp and
        close the rows that drew a stop id. Device ops only (this runs inside the CUDA graph)."""
        tok, lp = sample(logits, b.temp, b.top_k, b.top_p, b.greedy, b.seed, step, filtered)  # (B,), (B,)
        b.out_tok.index_copy_(1, step.view(1), tok[:, None])
        b.out_lp.index_copy_(1, step.view(1), lp[:, None])
        hit = (tok[:, None] == b.stop_ids).any(-1) & (step < b.end)  # (B,) the first stop id only
        b.end.copy_(torch.where(hit, step + 1, b.end))
        b.by_id |= hit
        b.tok.copy_(tok)

    def _generate_batch(self, reqs: list[Request], tick=None) -> list[Result]:
        dev = self.model.device
        n_real = len(reqs)
        if min(len(r.prompt_ids) for r in reqs) == 0:
            raise ValueError("TorchEngine: empty prompt")
        static = self.compile
        if static:  # fixed batch slots (fewer graphs): one-token greedy dummy rows fill them, then are dropped
            slots = min(1 << (n_real - 1).bit_length(), max(n_real, self.max_batch_size))
            dummy = Request([reqs[0].prompt_ids[-1]], None, SamplingParams(max_new_tokens=1, greedy=True, stop_token_ids=[]))
            reqs = reqs + [dummy] * (slots - n_real)
        B = len(reqs)
        P = max(len(r.prompt_ids) for r in reqs)
        N = max(r.sampling.max_new_tokens for r in reqs)
        L = P + N if not static else -(-(P + N) // 64) * 64
        sps = [r.sampling for r in reqs]
        filtered = any(not s.greedy and (s.top_k > 0 or s.top_p < 1) for s in sps)
        ids = torch.full((B, P), self.tok.pad_token_id or 0, dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, P - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
        pad = torch.tensor([P - len(r.prompt_ids) for r in reqs])  # (B,)
        init, S = self._host_rows(sps, pad, L, static)
        self._route([r.adapter for r in reqs])
        mods = list(lora.lora_modules(self.model).values())
        if static:
            decode, b, step, P_t = self._static_step(B, L, S, filtered)
            for k, v in init.items():
                (b.key_ok[:, :L] if k == "key_ok" else getattr(b, k)).copy_(v)  # key_ok: L of the L + 1 columns
            P_t.fill_(P)
            step.zero_()
        else:
            decode, step = None, torch.zeros((), dtype=torch.long, device=dev)
            b = self._alloc(B, L, N, init)
        caching, pads = not static and self.prefix.max_tokens > 0, pad.tolist()
        logits, hits = self._prefill(reqs[:n_real], ids, pad, b, caching)
        self._sample_into(b, logits, step, filtered)  # token 0
        step += 1
        alive = list(range(B))  # request index of each batch slot (eager: compacted)
        results: list[Result | None] = [None] * B
        searched = [0] * B  # stop strings: positions already searched
        s, n_left = 1, N  # s = tokens sampled so far
        while True:
            if s % self.sync_every == 0 or s >= n_left:  # ---- host sync: which rows are done? ----
                left, done = self._finish_rows(b, alive, results, searched, sps, s)
                if caching and done:
                    self._keep(b, done, alive, reqs, results, hits, pads, P)
                if tick is not None:
                    tick(s)
                if not left:
                    break
                # compact: finished rows leave the batch once they are 1/8 of it (a copy of the cache
                # per finished row cost more than running it on, measured on ragged lengths)
                if not static and len(alive) - len(left) >= max(1, len(alive) // self._compact_div):
                    k = torch.tensor(left, device=dev)
                    b = b.select(k, P + s - 1)
                    alive = [alive[j] for j in left]
                    if mods and mods[0].row_mask is not None:  # per-row routing: keep the rows' own masks
                        mask = mods[0].row_mask[k]  # (B', 1, R)
                        for mod in mods:
                            mod.row_mask = mask
                    n_left = max(sps[i].max_new_tokens for i in alive)
            if static:  # the graph's replay (or the same step run eagerly) over the cache columns written so far
                decode(cache_window(L, P + s) if self._cache_windows else L)
            else:
                col = P + s - 1  # the cache column of the token sampled last
                logits = self._forward(b.tok[:, None], (col - b.pad)[:, None], col, b.kv, b.key_ok)
                self._sample_into(b, logits, step, filtered)
                step += 1
            s += 1
        results = results[:n_real]  # static: the dummy rows go
        for r in results:
            r.text = self.tok.decode(r.completion_ids, skip_special_tokens=True)
        return results

    def _host_rows(self, sps: list[SamplingParams], pad, L: int, static: bool) -> tuple[dict, int]:
        """Every per-row tensor of a batch, built on the host once, and S, the stop-id columns."""
        B, eos = len(sps), self.tok.eos_token_id
        stops = [list(s.stop_token_ids) if s.stop_token_ids is not None else [eos] for s in sps]
        S = max([len(x) for x in stops] + [4 if static else 1])
        seeds = [s.seed if s.seed is not None else int(torch.randint(2**62, (1,), generator=self.gen)) for s in sps]
        return dict(
            tok=torch.zeros(B, dtype=torch.long), pad=pad,
            key_ok=torch.arange(L)[None, :] >= pad[:, None],  # (B, L) real tokens (future columns fill in)
            temp=torch.tensor([[1.0 if s.greedy else s.temperature] for s in sps]),
            top_k=torch.tensor([[0 if s.greedy else s.top_k] for s in sps]),
            top_p=torch.tensor([[1.0 if s.greedy else s.top_p] for s in sps]),
            greedy=torch.tensor([s.greedy for s in sps]), seed=torch.tensor(seeds, dtype=torch.long),
            stop_ids=torch.tensor([x + [-1] * (S - len(x)) for x in stops], dtype=torch.long),
            end=torch.tensor([s.max_new_tokens for s in sps]), by_id=torch.zeros(B, dtype=torch.bool)), S

    def _finish_rows(self, b: _Rows, alive, results, searched, sps, s: int) -> tuple[list[int], list[int]]:
        """The host sync after s sampled tokens: finish the rows that hit a stop id, a stop string or
        their length (their Result into `results`); returns (the slots still open, the slots finished now)."""
        end, by_id = b.end.tolist(), b.by_id.tolist()
        reason = {}  # slot -> stop string
        open_ = [j for j, i in enumerate(alive) if results[i] is None]
        strs = [j for j in open_ if sps[alive[j]].stop]
        toks = dict(zip(strs, b.out_tok[strs, :s].tolist())) if strs else {}
        for j in strs:  # decode text only for the rows that have stop strings
            i = alive[j]
            limit = min(s, end[j] - 1 if by_id[j] else end[j])  # a stop id on the same token wins
            hit = self._find_stop_string(sps[i].stop, toks[j], searched[i], limit)
            searched[i] = limit
            if hit is not None:
                end[j], reason[j] = hit
        done = [j for j in open_ if end[j] <= s]
        if done:
            out_tok, out_lp = b.out_tok[done].tolist(), b.out_lp[done].tolist()
            for j, t, lp in zip(done, out_tok, out_lp):
                n = end[j]
                why = ("stop", reason[j]) if j in reason else ("stop", t[n - 1]) if by_id[j] else ("length", None)
                results[alive[j]] = Result(t[:n], lp[:n], *why)
        return [j for j in open_ if end[j] > s], done

    def _prefill(self, reqs, ids, pad, b: _Rows, caching: bool):
        """The prompts' forward -> (logits at each row's last prompt token (B, V), each row's cache hit
        (entry, length)). ids (B, P) are left-padded; rows past len(reqs) are the static path's dummies.
        With the prefix cache each row restores its cached KV, and rows are prefilled in groups of
        similar uncached suffix: a group's forward covers the window [P - q, P), q its longest suffix,
        so a row recomputes at most q - its own suffix cached tokens, and one miss does not make the
        whole batch prefill its full prompts. Without hits: one group, the whole prompt width."""
        B, P = ids.shape
        hits = [self.prefix.lookup(r.adapter, r.prompt_ids, len(r.prompt_ids) - 1) if caching else (None, 0) for r in reqs]
        need = [len(r.prompt_ids) - n for r, (_, n) in zip(reqs, hits)] + [1] * (B - len(reqs))  # uncached suffixes
        pads, dev = pad.tolist(), self.model.device
        pos = (torch.arange(P)[None, :] - pad[:, None]).clamp(min=0)  # (B, P)
        groups, logits = self._prefill_groups(need) if caching else [(list(range(B)), P)], None
        for rows, q in groups:
            col = P - q
            self._restore(b, [(i, *hits[i]) for i in rows if i < len(reqs)], pads, col)
            self.prefilled_tokens += sum(min(q, len(reqs[i].prompt_ids)) for i in rows if i < len(reqs))
            self.cached_tokens += sum(max(0, col - pads[i]) for i in rows if i < len(reqs))
            out = self._forward_rows(rows, B, ids[rows, col:].to(dev), pos[rows, col:].to(dev), col, b)  # (len(rows), V)
            if len(groups) == 1:
                logits = out
            else:
                logits = out.new_empty(B, out.shape[1]) if logits is None else logits  # (B, V)
                logits[torch.tensor(rows, device=dev)] = out
        return logits, hits

    @staticmethod
    def _prefill_groups(need: list[int]) -> list[tuple[list[int], int]]:
        """Rows grouped by uncached suffix -> [(rows, the group's window q)]: longest first, a row opens a
        new group when its suffix is at most half the current window (it would waste over half its
        forward on tokens it has cached). One group when every row needs about the same."""
        groups = []
        for i in sorted(range(len(need)), key=lambda i: -need[i]):
            if not groups or 2 * need[i] <= groups[-1][1]:
                groups.append(([], need[i]))
            groups[-1][0].append(i)
        return [(sorted(rows), q) for rows, q in groups]

    def _forward_rows(self, rows: list[int], B: int, x, pos, col: int, b: _Rows):
        """_forward for the batch slots `rows` only (all B: in place): their cache columns [0, P) and
        routing masks are gathered, the forward writes the window [col, P), which goes back."""
        if len(rows) == B:
            return self._forward(x, pos, col, b.kv, b.key_ok)
        P = col + x.shape[1]
        k = torch.tensor(rows, device=x.device)
        mods = list(lora.lora_modules(self.model).values())
        mask = mods[0].row_mask if mods else None
        kv = [(K[:, :, :P].index_select(0, k), V[:, :, :P].index_select(0, k)) for K, V in b.kv]  # (n, Hkv, P, D)
        for m in mods if mask is not None else ():
            m.row_mask = mask[k]  # (n, 1, R)
        try:
            out = self._forward(x, pos, col, kv, b.key_ok[k])
        finally:
            for m in mods if mask is not None else ():
                m.row_mask = mask
        for (K, V), (Kg, Vg) in zip(b.kv, kv):
            K[:, :, col:P].index_copy_(0, k, Kg[:, :, col:])
            V[:, :, col:P].index_copy_(0, k, Vg[:, :, col:])
        return out

    def _alloc(self, B, L, N, init) -> _Rows:
        m, dev = self.model, self.model.device
        shape = (B, m.config.num_key_value_heads, L, m.model.layers[0].self_attn.head_dim)
        dtype = m.lm_head.weight.dtype
        return _Rows(**{k: v.to(dev) for k, v in init.items()},
                     kv=[(torch.zeros(shape, dtype=dtype, device=dev), torch.zeros(shape, dtype=dtype, device=dev))
                         for _ in m.model.layers],
                     out_tok=torch.zeros(B, N, dtype=torch.long, device=dev),
                     out_lp=torch.zeros(B, N, dtype=torch.float32, device=dev))

    # the prefix cache (eager path) -----------------------------------------------------------
    def _restore(self, b: _Rows, hits, pad: list[int], col: int):
        """Copy cached KV left of the prefill window into the cache columns [pad, col) of each row in
        hits, (slot, entry, cached length). Those tokens are all cached: the window holds the row's
        whole uncached suffix."""
        for i, e, n in hits:
            m = col - pad[i]  # the row's tokens left of the window (<= n)
            if e is None or m <= 0:
                continue
            for li, (K, V) in enumerate(b.kv):
                K[i, :, pad[i]:col] = e.kv[li, 0, :, :m]  # (Hkv, m, D)
                V[i, :, pad[i]:col] = e.kv[li, 1, :, :m]

    def _keep(self, b: _Rows, done: list[int], alive, reqs, results, hits, pad: list[int], P: int):
        """Put the finished slots `done` into the prefix cache: prompt + completion less its last token
        (never fed), whose KV sits at the cache columns [pad, P + n - 1) of the slot."""
        for j in done:
            i = alive[j]
            comp = results[i].completion_ids[:-1]
            end = P + len(comp)
            kv = torch.stack([torch.stack((K[j, :, pad[i]:end], V[j, :, pad[i]:end])) for K, V in b.kv])  # (layers, 2, Hkv, n, D)
            self.prefix.put(reqs[i].adapter, reqs[i].prompt_ids + comp, kv, replaces=hits[i][0])

    def _find_stop_string(self, stop, toks, start, limit):
        """The first position j in [start, limit) whose token completes one of the stop strings ->
        (j + 1, the string), else None. A stop string must end inside token j: a short decoded
        tail with and without it is compared, so the completion is cut at exactly that token."""
        w = max(len(x) for x in stop) + 2
        for j in range(start, limit):
            tail = self.tok.decode(toks[max(0, j + 1 - w):j + 1])
            prev = self.tok.decode(toks[max(0, j + 1 - w):j])
            for x in stop:
                if tail.count(x) > prev.count(x):
                    return j + 1, x
        return None

    def _route(self, names):
        if not lora.lora_modules(self.model):
            if any(n is not None for n in names):
                raise KeyError(f"request asks for adapter(s) {set(names) - {None}} but the model has no LoRA")
            return
        if len(set(names)) == 1 and (not self.compile or names[0] is None):
            lora.set_adapter(self.model, names[0])  # one adapter: the cheaper single path
        else:  # the static step always routes per row (one graph for any mix of adapters)
            lora.set_row_adapters(self.model, names)
