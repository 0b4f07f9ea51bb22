"""The TorchEngine decode loop as it was before it sampled all rows at once (commit
49e7797), kept only so that
bench/rollout.py can measure the new loop against it in one run. Not used by the library.

Per decode step it loops over rows in Python: one `exponential_` per row from that row's own
torch.Generator, a Python stop check per row, `.tolist()` of the sampled tokens, and batch
compaction as soon as any row finishes.
"""
import torch
import torch.nn.functional as F

import lora
from engines import SUPPORTED, Request, Result, SamplingParams


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



class ReferenceEngine:
    """The old TorchEngine (per-row Python on the decode hot path)."""

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
        if fsdp:
            lora.refresh_routed(self.model, force=True)  # gathered weights: copy them into the routed buffers
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

