"""From Steps to gradients: padded tensors per adapter, forward passes over them in FSDP lockstep,
and GAE's critic. train.py's update loop is built from these.

Lockstep: under FSDP every forward and backward is a collective, so every rank must run the same
number of micro-batches; a rank with fewer rows runs zero-weight dummies (`lockstep_chunks`), and
losses are global sums, so gradients are scaled back up after FSDP averages them (`backward`).
In one process all of this is a no-op.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

import lora
import ppo
from rollout import Step


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def all_sum(x: float | list) -> float | list:
    if world() == 1:
        return x
    t = torch.tensor(x, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def gather_objects(obj) -> list:
    if world() == 1:
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def lockstep_chunks(rows: list, size: int, dummy=0) -> list[tuple[list, float]]:
    """Micro-batches of `rows` as (rows, weight); every rank gets as many as the busiest rank, the
    extra ones are ([dummy], weight 0)."""
    chunks = [(rows[i:i + size], 1.0) for i in range(0, len(rows), size)]
    n = int(max(gather_objects(len(chunks))))
    return chunks + [([dummy], 0.0)] * (n - len(chunks))


def backward(loss):
    (loss * world()).backward()  # FSDP averages gradients over ranks; our losses are global sums


def clip_grad(params, max_norm) -> float:
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


# --------------------------------------------------------------------------------------------
# turning Steps into padded tensors; everything lives in "target space": column t predicts token t+1


class RoleBatch:
    """All turns of one adapter in this step, right-padded. A dummy step (info dummy) has mask 0."""

    def __init__(self, steps: list[Step], temps: list[float], pad_id: int, norm_len: int):
        self.steps, self.norm_len, self.pad_id = steps, norm_len, pad_id  # norm_len: Dr. GRPO's constant
        L = max(len(s.prompt_ids) + len(s.completion_ids) for s in steps)
        N = len(steps)
        self.ids = torch.full((N, L), pad_id, dtype=torch.long)
        self.attn = torch.zeros(N, L, dtype=torch.long)
        self.mask = torch.zeros(N, L - 1)  # 1 on targets the role generated
        self.sample_logp = torch.zeros(N, L - 1)
        self.scores = torch.tensor([s.reward for s in steps])  # (N,)
        self.last = torch.zeros(N, dtype=torch.long)  # target column of each row's last token
        self.first = torch.zeros(N, dtype=torch.long)  # target column of each row's first generated token
        for i, s in enumerate(steps):
            P, C = len(s.prompt_ids), len(s.completion_ids)
            if (s.logprobs and len(s.logprobs) != C) or P == 0:
                raise ValueError(f"step of episode {s.episode_id} turn {s.turn} ({s.role}): {P} prompt tokens, "
                                 f"{C} completion tokens but {len(s.logprobs)} logprobs")
            self.ids[i, :P + C] = torch.tensor(s.prompt_ids + s.completion_ids)
            self.attn[i, :P + C] = 1
            m = torch.tensor(s.info.get("loss_mask", [1] * C), dtype=torch.float)  # 0 on tool output
            self.mask[i, P - 1:P + C - 1] = m * float(not s.info.get("dummy", False))
            if s.logprobs:
                self.sample_logp[i, P - 1:P + C - 1] = torch.tensor(s.logprobs)
            self.last[i], self.first[i] = P + C - 2, P - 1
        self.temps = torch.tensor(temps)
        self.rows_len = self.attn.sum(1)

    def micro(self, rows, L: int | None = None):
        """(ids, attn, number of target columns) for a list of row indices, trimmed (or padded) to L,
        by default their own length."""
        n = int(self.rows_len[rows].max())
        L = n if L is None else L
        ids, attn = self.ids[rows, :n], self.attn[rows, :n]
        if L > n:
            ids, attn = F.pad(ids, (0, L - n), value=self.pad_id), F.pad(attn, (0, L - n))
        return ids, attn, L - 1


def forward_logits(model, pieces: list[tuple[RoleBatch, list[int]]], device):
    """ONE forward over rows of one or more RoleBatches, padded together; each row wears the adapter
    already set (lora.set_adapter / set_row_adapters). Logits are computed only from the first
    generated column on (`logits_to_keep`: prompt columns never reach the vocabulary projection).
    Returns (logits (b, T - start, V) / temperature, targets (b, T - start), start, T): column j is
    target column start + j of the batch."""
    L = max(int(rb.rows_len[rows].max()) for rb, rows in pieces)
    parts = [rb.micro(rows, L) for rb, rows in pieces]
    ids, attn = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    start = min(int(rb.first[rows].min()) for rb, rows in pieces)
    temps = torch.cat([rb.temps[rows] for rb, rows in pieces]).to(device)
    logits = model(input_ids=ids.to(device), attention_mask=attn.to(device), logits_to_keep=L - start).logits[:, :-1]
    return logits.float() / temps[:, None, None], ids[:, start + 1:].to(device), start, L - 1


@torch.no_grad()
def score(model, rb: RoleBatch, adapter, cfg, device, full_kl_to_ref=False):
    """Logprobs of every row under `adapter` (None = the reference policy), in micro-batches.
    full_kl_to_ref: instead, the exact KL(adapter || reference) over the vocabulary per token."""
    out = torch.zeros_like(rb.sample_logp)
    for rows, w in lockstep_chunks(by_length(rb, range(len(rb.steps))), cfg.algo.micro_batch_size):
        lora.set_adapter(model, adapter)
        logits, tgt, start, T = forward_logits(model, [(rb, rows)], device)
        if full_kl_to_ref:
            lora.set_adapter(model, None)
            val = ppo.full_kl(logits, forward_logits(model, [(rb, rows)], device)[0])
        else:
            val = ppo.token_logprobs(logits, tgt)
        if w:
            out[rows, start:T] = val.cpu()
    return out


@torch.no_grad()
def adapter_divergence(model, rb: RoleBatch, adapters: list, device, micro_batch_size: int = 4) -> dict[str, float]:
    """How far the adapters have moved apart: for every pair (a, b) of `adapters` (None = the base),
    the symmetrised KL 1/2 [KL(pi_a || pi_b) + KL(pi_b || pi_a)] of their next-token distributions on
    the same prompts and replies (rb), averaged over the generated tokens. {"a~b": kl}, over ranks."""
    sums = {(a, b): 0.0 for i, a in enumerate(adapters) for b in adapters[i + 1:]}
    n_tok = 0.0
    for rows, w in lockstep_chunks(by_length(rb, range(len(rb.steps))), micro_batch_size):
        logp = {}
        for a in adapters:
            lora.set_adapter(model, a)
            logits, _, start, T = forward_logits(model, [(rb, rows)], device)
            logp[a] = F.log_softmax(logits, -1)  # (b, T - start, V)
        m = window(rb.mask, rows, start, T).to(device) * w
        for a, b in sums:
            p, q = logp[a], logp[b]
            sym = 0.5 * ((p.exp() * (p - q)).sum(-1) + (q.exp() * (q - p)).sum(-1))  # (b, T - start)
            sums[(a, b)] += float((sym * m).sum())
        n_tok += float(m.sum())
    lora.set_adapter(model, None)
    keys = list(sums)
    tot = all_sum([sums[k] for k in keys] + [n_tok])
    return {f"{a or 'base'}~{b or 'base'}": v / max(tot[-1], 1.0) for (a, b), v in zip(keys, tot[:-1])}


def window(t: torch.Tensor, rows, start: int, T: int) -> torch.Tensor:
    """Target columns start..T-1 of `rows` of a per-batch tensor (N, T_own), zero past its own width
    (rows padded together with a longer batch's)."""
    x = t[rows, start:T]
    return F.pad(x, (0, T - start - x.shape[1])) if x.shape[1] < T - start else x


def by_length(rb: RoleBatch, rows) -> list[int]:
    """Rows longest first: consecutive micro-batches then hold rows of similar length (less padding)."""
    return sorted(rows, key=lambda i: -int(rb.rows_len[i]))


class Critic:
    """GAE's value model: a linear head on the shared base wearing its own 'critic' adapter, with
    its own optimizer (built after sharding: make_optimizer)."""

    def __init__(self, model, cfg, device):
        L = cfg.lora  # the critic is a regression: the one adapter that uses lora.dropout
        lora.add_lora(model, ["critic"], L.rank, L.alpha, L.dropout, L.targets, seed=cfg.trainer.seed + 1)
        self.head = torch.nn.Linear(model.config.hidden_size, 1).to(device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.cfg, self.device, self.opt = cfg, device, None

    def make_optimizer(self, model):  # after sharding: the adapter's parameters become DTensors
        self.params = lora.adapter_parameters(model, "critic") + list(self.head.parameters())
        self.opt = torch.optim.AdamW(self.params, lr=self.cfg.algo.critic_lr)

    def forward(self, model, rb: RoleBatch, rows):
        ids, attn, T = rb.micro(rows)
        lora.set_adapter(model, "critic")
        out = model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device), output_hidden_states=True,
                    logits_to_keep=1)
        return self.head(out.hidden_states[-1][:, :-1].float()).squeeze(-1), T  # (b, T)

    @torch.no_grad()
    def values(self, model, rb: RoleBatch):
        model.eval()
        values = torch.zeros_like(rb.mask)
        for rows, w in lockstep_chunks(by_length(rb, range(len(rb.steps))), self.cfg.algo.micro_batch_size):
            v, T = self.forward(model, rb, rows)
            if w:
                values[rows, :T] = v.cpu()
        return values

    def update(self, model, rb: RoleBatch, returns, old_values):
        """ppo_epochs of clipped value regression on all rows (one optimizer step per epoch);
        returns the mean value loss and the explained variance of the values the advantages used."""
        a = self.cfg.algo
        model.train()  # the critic's adapter is the one that uses lora.dropout
        vf_loss = 0.0  # each chunk's share of the global token-mean loss, summed
        for _ in range(a.ppo_epochs):
            denom = max(all_sum(float(rb.mask.sum())), 1.0)
            for rows, w in lockstep_chunks(by_length(rb, range(len(rb.steps))), a.micro_batch_size):
                v, T = self.forward(model, rb, rows)
                loss, _ = ppo.value_loss(v, old_values[rows, :T].to(self.device), returns[rows, :T].to(self.device),
                                         rb.mask[rows, :T].to(self.device) * w, a.vf_clip, "token-mean", denom)
                backward(a.vf_coef * loss)
                vf_loss += loss.item()
            if world() > 1:  # the head is replicated, not sharded: average its gradients by hand
                for p in self.head.parameters():
                    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            if math.isfinite(clip_grad(self.params, a.grad_clip)):
                self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        m, d = rb.mask, returns - old_values  # explained variance over every rank's tokens
        n, sr, sr2, sd, sd2 = all_sum([float(x) for x in (m.sum(), (returns * m).sum(), (returns ** 2 * m).sum(),
                                                           (d * m).sum(), (d ** 2 * m).sum())])
        var_r, var_d = sr2 / max(n, 1) - (sr / max(n, 1)) ** 2, sd2 / max(n, 1) - (sd / max(n, 1)) ** 2
        out = {"vf_loss": all_sum(vf_loss) / a.ppo_epochs}
        if var_r > 1e-12:  # undefined when every return is equal
            out["explained_variance"] = 1 - var_d / var_r
        return out

    def state_dict(self):
        return {"head": self.head.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, d):
        self.head.load_state_dict(d["head"])
        self.opt.load_state_dict(d["opt"])
