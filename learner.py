"""The learner: from a step's turns to each adapter's update. Everything between the rollout and
the optimizer lives here, on top of the math in ppo.py:

  AdapterBatch        one adapter's turns as right-padded tensors (mask = 1 on tokens it generated)
  score            old / reference logprobs under an adapter (None = the base), in micro-batches
  forward_logprobs a micro-batch's token logprobs and entropies through the vocabulary projection in chunks
                   of tokens (algo.logits_chunk_tokens; ppo.head_logprobs): never the whole logits
  advantages       token rewards (outcome on the last token, minus the KL when it is in the reward)
                   -> ppo.ADVANTAGES[the adapter's estimator]
  informative, mixed_label_groups, dapo_batch
                   which groups train: DAPO's filter and trim, and env-labelled uniform groups
  prepare_adapter  score -> advantages -> (critic.py's value model) for one adapter: its AdapterUpdate
  policy_update    ppo_epochs x mini-batches x micro-batches over one or more AdapterUpdates (fused: one
                   forward/backward per micro-batch for every adapter's rows), each adapter's own
                   grad clip and AdamW step
  update           all of it for one training step: what train.py calls
  adapter_divergence  how far the role adapters moved apart (a val metric)
  check_names      the estimator and loss names against ppo's dicts, and algo.estimator_kwargs against the
                   stateful estimators in use, before a model loads

Distributed: every forward is in lockstep (collectives.lockstep_chunks) and every normaliser a global
sum, so 2 ranks compute the same update as 1.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import lora
import ppo
from collectives import (
    all_sum,
    average_grads,
    backward,
    clip_grad,
    gather_objects,
    lockstep_chunks,
    print0,
    rank,
    to_device,
)
from config import Config, ConfigError
from engines import SUPPORTED
from idle import moves
from rollout import Sample


def check_names(cfg: Config):
    """Estimator and loss names are ppo's (ADVANTAGES, LOSSES): a new estimator is one function and
    one dict entry there, nothing here. Checked before any model loads; the error names the field."""
    for where, name in [("algo.adv_estimator", cfg.algo.adv_estimator)] + [
            (f"roles[{i}].adv_estimator", r.adv_estimator) for i, r in enumerate(cfg.roles) if r.adv_estimator]:
        if name not in ppo.ADVANTAGES:
            raise ConfigError(f"config field {where}: unknown estimator {name!r}; known: {sorted(ppo.ADVANTAGES)}")
    check_estimator_kwargs(cfg)
    if cfg.algo.policy_loss not in ppo.LOSSES:
        raise ConfigError(f"config field algo.policy_loss: unknown loss {cfg.algo.policy_loss!r}; known: "
                          f"{sorted(ppo.LOSSES)}")
    if grouped := cfg.estimators & set(ppo.GROUPED):
        if cfg.rollout.num_chains < 2:
            raise ConfigError(f"config field rollout.num_chains: {sorted(grouped)} need groups: num_chains >= 2")
    elif cfg.algo.dynamic_sampling:
        raise ConfigError("config field algo.dynamic_sampling: DAPO's filter drops groups whose advantages are zero "
                          f"by construction, which only happens under estimators that centre per group {ppo.GROUPED}; "
                          f"under {sorted(cfg.estimators)} a flat group still carries signal and nothing would be filtered")


def check_estimator_kwargs(cfg: Config):
    """algo.estimator_kwargs builds each stateful estimator in use (ppo.StatefulEstimator): a key none of them takes,
    a value its constructor refuses, or settings with no stateful estimator in use is one line naming the field."""
    kw = dict(cfg.algo.estimator_kwargs)
    stateful = sorted(e for e in cfg.estimators if isinstance(ppo.ADVANTAGES.get(e), type))
    if kw and not stateful:
        raise ConfigError(f"config field algo.estimator_kwargs: {sorted(kw)} set, but no estimator in use takes settings "
                          f"(in use: {sorted(cfg.estimators)}; with settings: "
                          f"{sorted(n for n, f in ppo.ADVANTAGES.items() if isinstance(f, type))})")
    for name in stateful:
        cls = ppo.ADVANTAGES[name]
        if unknown := sorted(set(kw) - set(cls.settings())):
            raise ConfigError(f"config field algo.estimator_kwargs: {name} takes no setting {', '.join(map(repr, unknown))} "
                              f"(its settings: {', '.join(cls.settings()) or 'none'})")
        try:
            cls(**kw)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"config field algo.estimator_kwargs.{e}" if isinstance(e, ValueError) else
                              f"config field algo.estimator_kwargs: {name}: {e}") from None


# --------------------------------------------------------------------------------------------
# turning Samples into padded tensors; everything lives in "target space": column t predicts token t+1


class AdapterBatch:
    """All turns of one adapter in this step, right-padded. A dummy turn (Sample.dummy) has mask 0."""

    def __init__(self, samples: list[Sample], temps: list[float], pad_id: int, norm_len: int):
        self.samples, self.norm_len, self.pad_id = samples, norm_len, pad_id  # norm_len: Dr. GRPO's constant
        L = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
        N = len(samples)
        self.ids = torch.full((N, L), pad_id, dtype=torch.long)
        self.attn = torch.zeros(N, L, dtype=torch.long)
        self.mask = torch.zeros(N, L - 1)  # 1 on targets the role generated
        self.sample_logp = torch.zeros(N, L - 1)
        self.scores = torch.tensor([s.reward for s in samples])  # (N,)
        # host bookkeeping as plain ints, so the update's micro-batch loop reads no tensor back to the host
        self.last = [0] * N  # target column of each row's last token
        self.first = [0] * N  # target column of each row's first generated token
        for i, s in enumerate(samples):
            P, C = len(s.prompt_ids), len(s.completion_ids)
            if (s.logprobs and len(s.logprobs) != C) or P == 0:
                raise ValueError(f"step of episode {s.episode_id} turn {s.turn} ({s.role}): {P} prompt tokens, "
                                 f"{C} completion tokens but {len(s.logprobs)} logprobs")
            self.ids[i, :P + C] = torch.tensor(s.prompt_ids + s.completion_ids)
            self.attn[i, :P + C] = 1
            m = torch.tensor(s.loss_mask or [1] * C, dtype=torch.float)  # 0 on tool output
            self.mask[i, P - 1:P + C - 1] = m * float(not s.dummy)
            if s.logprobs:
                self.sample_logp[i, P - 1:P + C - 1] = torch.tensor(s.logprobs)
            self.last[i], self.first[i] = P + C - 2, P - 1
        self.temps = torch.tensor(temps)
        self.rows_len = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]  # real tokens of each row
        self.row_turns = [1] * N  # turns each row holds (Packed: more), what micro-batches count

    def micro(self, rows, L: int | None = None):
        """(ids, attn, number of target columns) for a list of row indices, trimmed (or padded) to L,
        by default their own length."""
        n = max(self.rows_len[r] for r in rows)
        L = n if L is None else L
        ids, attn = self.ids[rows, :n], self.attn[rows, :n]
        if L > n:
            ids, attn = F.pad(ids, (0, L - n), value=self.pad_id), F.pad(attn, (0, L - n))
        return ids, attn, L - 1


class Packed:
    """An AdapterBatch's turns (all, or `turns`) that extend one another, one row per conversation
    (algo.pack_turns).

    Turn i extends row r when i's prompt starts with the tokens of r's latest turn (its prompt + reply)
    and both belong to the same episode and sample at the same temperature. The row then holds i's
    tokens, which begin with every earlier turn of the row, so each turn keeps its own target columns
    (the same indices: a prefix is a prefix) and per-token tensors move between the two layouts by
    copying a turn's completion columns (pack / unpack). `source` is the AdapterBatch packed, `batch` the packed one; its
    row_turns count each row's turns."""

    def __init__(self, source: AdapterBatch, turns: list[int] | None = None):
        self.turns = list(range(len(source.samples))) if turns is None else list(turns)
        full = {i: source.samples[i].prompt_ids + source.samples[i].completion_ids for i in self.turns}
        self.source, self.row, tails, open_rows = source, {}, [], defaultdict(list)
        for i in sorted(self.turns, key=lambda i: len(full[i])):  # a turn is longer than what it extends
            s, j = source.samples[i], None
            if not s.dummy:
                fits = [r for r in open_rows[s.episode_id] if float(source.temps[tails[r]]) == float(source.temps[i])
                        and len(full[tails[r]]) <= len(s.prompt_ids) and full[i][:len(full[tails[r]])] == full[tails[r]]]
                j = max(fits, key=lambda r: len(full[tails[r]]), default=None)
            if j is None:
                j = len(tails)
                tails.append(i)
                if not s.dummy:
                    open_rows[s.episode_id].append(j)
            tails[j], self.row[i] = i, j
        b = self.batch = AdapterBatch.__new__(AdapterBatch)
        b.samples, b.norm_len, b.pad_id = [source.samples[t] for t in tails], source.norm_len, source.pad_id
        b.ids, b.attn, b.temps = source.ids[tails], source.attn[tails], source.temps[tails]
        b.rows_len, b.scores, b.last = [source.rows_len[t] for t in tails], source.scores[tails], [source.last[t] for t in tails]
        members = defaultdict(list)  # row -> its turns
        for i in self.turns:
            members[self.row[i]].append(i)
        b.first = [min(source.first[i] for i in members[j]) for j in range(len(tails))]
        b.row_turns = [len(members[j]) for j in range(len(tails))]
        b.mask, b.sample_logp = self.pack(source.mask), self.pack(source.sample_logp)

    def pack(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """(turns, T) -> (rows, T): each turn's completion columns into its row."""
        if t is None:
            return None
        out = t.new_zeros(len(self.batch.samples), t.shape[1])
        for i in self.turns:
            a, b = self.source.first[i], self.source.last[i]
            out[self.row[i], a:b + 1] = t[i, a:b + 1]
        return out

    def unpack(self, t: torch.Tensor) -> torch.Tensor:
        """(rows, T) -> (turns, T), every turn of the batch packed: each turn reads its own completion
        columns of its row, zero elsewhere."""
        cols = torch.arange(t.shape[1])[None, :]
        rows = torch.tensor([self.row[i] for i in range(len(self.source.samples))])
        first, last = torch.tensor(self.source.first)[:, None], torch.tensor(self.source.last)[:, None]
        return t[rows] * ((cols >= first) & (cols <= last))


def _micro_ids(pieces: list[tuple[AdapterBatch, list[int]]], device):
    """One micro-batch's ids (b, L) on the device, its first generated column `start`, L and the rows' temperatures."""
    L = max(batch.rows_len[r] for batch, rows in pieces for r in rows)
    ids = torch.cat([batch.micro(rows, L)[0] for batch, rows in pieces])
    start = min(batch.first[r] for batch, rows in pieces for r in rows)
    temps = to_device(torch.cat([batch.temps[rows] for batch, rows in pieces]), device)
    return to_device(ids, device), start, L, temps


def forward_logits(model, pieces: list[tuple[AdapterBatch, list[int]]], device):
    """ONE forward over rows of one or more AdapterBatches, padded together; each row wears the adapter
    already set (lora.set_adapter / set_row_adapters). Logits are computed only from the first
    generated column on (`logits_to_keep`: prompt columns never reach the vocabulary projection).
    Returns (logits (b, T - start, V) / temperature, targets (b, T - start), start, T): column j is
    target column start + j of the batch."""
    ids, start, L, temps = _micro_ids(pieces, device)
    # no attention mask: rows are right-padded and attention is causal, so no real token sees a pad, and
    # positions count from 0 as the mask would make them; with a mask, transformers asks the device
    # whether any row is padded (a host sync in every micro-batch of the update)
    logits = model(input_ids=ids, logits_to_keep=L - start).logits[:, :-1]
    return logits.float() / temps[:, None, None], ids[:, start + 1:], start, L - 1


def head_weight(model, cfg: Config):
    """The vocabulary projection's weight when the update may apply it in chunks (algo.logits_chunk_tokens > 0,
    no full-vocabulary KL in the loss, a plain lm_head without bias, a Llama-family model), else None. Under
    FSDP2 gathered whole, once per call: a collective every rank joins, outside the micro-batch loops."""
    a = cfg.algo
    full_kl = a.kl_coef > 0 and not a.kl_in_reward and a.kl_kind == "full"
    return None if not a.logits_chunk_tokens or full_kl else chunkable_head(model)


def chunkable_head(model):
    """lm_head's weight (gathered whole under FSDP2, detached) where the logits are exactly lm_head(norm(h)) with
    nothing after it: a plain lm_head without bias on a Llama-family model; else None (Gemma2's softcap, Granite's
    and Cohere's logit scales, Phi's final_layernorm and head bias would be missed)."""
    head = model.lm_head
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    if getattr(model.config, "model_type", None) not in SUPPORTED or not hasattr(model.get_decoder(), "norm"):
        return None
    W = head.weight
    return (W.full_tensor() if hasattr(W, "full_tensor") else W).detach()


def final_hidden(model, **inputs):
    """The final norm's output (b, L, d), what lm_head would project, from one forward that projects one column."""
    got = []
    hook = model.get_decoder().norm.register_forward_hook(lambda mod, args, out: got.append(out))
    try:
        model(**inputs, logits_to_keep=1)
    finally:
        hook.remove()
    return got[-1]


def forward_logprobs(model, pieces: list[tuple[AdapterBatch, list[int]]], device, W, chunk_tokens: int):
    """forward_logits' forward, the logits never made whole: each token's logprob of its target and its entropy,
    (b, T - start) fp32 each, with targets, start and T. The final norm's output is taken by a hook (the model
    projects one column) and goes through W chunk_tokens tokens at a time (ppo.head_logprobs)."""
    ids, start, L, temps = _micro_ids(pieces, device)
    h, targets = final_hidden(model, input_ids=ids)[:, start:L - 1], ids[:, start + 1:]  # no attention mask: as forward_logits
    logp, ent = ppo.head_logprobs(h, W, targets, temps, chunk_tokens)
    return logp, ent, targets, start, L - 1


@torch.no_grad()
def score(model, batch: AdapterBatch, adapter, cfg, device, full_kl_to_ref=False, ref=None):
    """Logprobs of every row under `adapter` (None = the base), in micro-batches.
    full_kl_to_ref: instead, the exact KL(adapter || ref) over the vocabulary per token (ref None = the base)."""
    out = torch.zeros_like(batch.sample_logp)
    order = by_length(batch, range(len(batch.samples)))
    W = None if full_kl_to_ref else head_weight(model, cfg)
    for rows, w in lockstep_chunks(order, cfg.algo.micro_batch_size, weights=[batch.row_turns[i] for i in order],
                                   lengths=[batch.rows_len[i] for i in order], max_tokens=cfg.algo.micro_batch_tokens):
        lora.set_adapter(model, adapter)
        if W is not None:
            val, _, _, start, T = forward_logprobs(model, [(batch, rows)], device, W, cfg.algo.logits_chunk_tokens)
        else:
            logits, tgt, start, T = forward_logits(model, [(batch, rows)], device)
            if full_kl_to_ref:
                lora.set_adapter(model, ref)
                val = ppo.full_kl(logits, forward_logits(model, [(batch, rows)], device)[0])
            else:
                val = ppo.token_logprobs(logits, tgt)
        if w:
            out[rows, start:T] = val.cpu()
    return out


@torch.no_grad()
def adapter_divergence(model, batch: AdapterBatch, adapters: list, device, micro_batch_size: int = 4,
                       chunk_tokens: int = 256) -> dict[str, float]:
    """How far the adapters have moved apart: for every pair (a, b) of `adapters` (None = the base),
    the symmetrised KL 1/2 [KL(pi_a || pi_b) + KL(pi_b || pi_a)] of their next-token distributions on
    the same prompts and replies (batch), averaged over the generated tokens. {"a~b": kl}, over ranks.
    Memory: each adapter keeps only the final hidden states of the generated tokens; the vocabulary
    projection runs chunk_tokens tokens at a time, so the peak is adapters x chunk_tokens x vocabulary
    whatever the number of tokens (full (rows, tokens, vocabulary) log-softmaxes, one per adapter,
    were ~34 GB at a 152k vocabulary)."""
    W = model.lm_head.weight
    W = W.full_tensor() if hasattr(W, "full_tensor") else W  # FSDP: gathered once, every rank joins
    sums = {(a, b): 0.0 for i, a in enumerate(adapters) for b in adapters[i + 1:]}
    if not sums:  # one adapter (eval.py --base: the base alone): no pair, nothing to run
        return {}
    n_tok = 0.0
    for rows, w in lockstep_chunks(by_length(batch, range(len(batch.samples))), micro_batch_size):
        ids, attn, T = batch.micro(rows)
        sel = window(batch.mask, rows, 0, T).bool().to(device)  # (b, T): target columns the role generated
        temp = batch.temps[rows].to(device)[:, None].expand(-1, T)[sel]  # (n,)
        hidden = {}
        for a in adapters:
            lora.set_adapter(model, a)
            out = model(input_ids=ids.to(device), attention_mask=attn.to(device), output_hidden_states=True,
                        logits_to_keep=1)
            hidden[a] = out.hidden_states[-1][:, :-1][sel]  # (n, d) after the final norm
        for c in range(0, int(sel.sum()), chunk_tokens):
            logp = {a: F.log_softmax(F.linear(h[c:c + chunk_tokens], W).float() / temp[c:c + chunk_tokens, None], -1)
                    for a, h in hidden.items()}  # (chunk, V) each
            for a, b in sums:
                p, q = logp[a], logp[b]
                sums[(a, b)] += w * float((0.5 * ((p.exp() * (p - q)).sum(-1) + (q.exp() * (q - p)).sum(-1))).sum())
        n_tok += w * float(sel.sum())
    lora.set_adapter(model, None)
    keys = list(sums)
    tot = all_sum([sums[k] for k in keys] + [n_tok])
    return {f"{a or 'base'}~{b or 'base'}": v / max(tot[-1], 1.0) for (a, b), v in zip(keys, tot[:-1])}


def window(t: torch.Tensor, rows, start: int, T: int) -> torch.Tensor:
    """Target columns start..T-1 of `rows` of a per-batch tensor (N, T_own), zero past its own width
    (rows padded together with a longer batch's)."""
    x = t[rows, start:T]
    return F.pad(x, (0, T - start - x.shape[1])) if x.shape[1] < T - start else x


def by_length(batch: AdapterBatch, rows) -> list[int]:
    """Rows longest first: consecutive micro-batches then hold rows of similar length (less padding)."""
    return sorted(rows, key=lambda i: -batch.rows_len[i])


# --------------------------------------------------------------------------------------------
# ALGO LOGIC: rewards -> advantages -> the clipped policy update (the math itself is in ppo.py)


def advantages(cfg: Config, batch: AdapterBatch, kl_tok, values, kl_coef, estimator: str | None = None, state=None):
    """Token rewards (outcome score on the last token, minus the KL when it is in the reward) ->
    the chosen estimator's (advantages, returns); `estimator`: this adapter's (default algo's);
    `state`: this adapter's instance when the estimator is a ppo.StatefulEstimator."""
    a = cfg.algo
    token_rewards = torch.zeros_like(batch.mask)  # (N, T)
    token_rewards[torch.arange(len(batch.samples)), batch.last] = batch.scores
    if kl_tok is not None and a.kl_in_reward:
        token_rewards = token_rewards - kl_coef * kl_tok * batch.mask
    gids = [group_key(cfg, s) if not s.dummy else ("dummy", i) for i, s in enumerate(batch.samples)]
    baseline = torch.tensor([float(s.baseline or 0.0) for s in batch.samples])  # ReMax's greedy reward
    fn = state or ppo.ADVANTAGES[estimator or a.adv_estimator]
    fn = fn(**a.estimator_kwargs) if isinstance(fn, type) else fn  # a StatefulEstimator outside a run: a fresh state
    return fn(token_rewards, batch.mask, group_ids=gids, values=values, baseline=baseline, gamma=a.gamma, lam=a.lam,
              norm_by_std=a.norm_by_std, all_sum=all_sum)


@dataclass(eq=False)  # compared and hashed by identity: a dict key in the update
class AdapterUpdate:
    """One adapter's share of a step, ready for the policy update."""
    adapter: str
    batch: AdapterBatch
    adv: torch.Tensor  # (N, T) advantages
    old_logp: torch.Tensor  # (N, T) logprobs of the policy that sampled (or recomputed)
    ref_logp: torch.Tensor | None  # (N, T) under the reference, when KL is in the loss
    opt: torch.optim.Optimizer
    sched: object
    gen: torch.Generator  # its mini-batch permutations
    pack: bool = False  # algo.pack_turns: each mini-batch's turns that extend one another share a row
    ref: str | None = None  # the KL's reference adapter (algo.kl_ref init), None = the base

    def packed(self, turns: list[int]) -> tuple[AdapterUpdate, list[int]]:
        """This update restricted to a mini-batch's `turns`, packed (Packed): the view and its rows."""
        pk = Packed(self.batch, turns)
        view = dataclasses.replace(self, batch=pk.batch, adv=pk.pack(self.adv), old_logp=pk.pack(self.old_logp),
                                   ref_logp=pk.pack(self.ref_logp), pack=False)
        return view, list(range(len(pk.batch.samples)))


@dataclass
class UpdateStats:
    """One adapter's bookkeeping over a policy update: token-weighted sums (reduced over ranks at the
    end), the max ratio of each mini-batch, the gradient norm of each optimizer step. The sums and ratio
    maxima stay tensors on the device until reduce_stats reads them back, once per update."""
    lr: float
    sums: dict = field(default_factory=lambda: defaultdict(float))
    ratio_max: list = field(default_factory=list)
    grad_norms: list = field(default_factory=list)
    skipped: int = 0


def adapter_loss(part: AdapterUpdate, rows, logp, entropy, logits, start, T, weight, on_policy, denom, cfg, kl_coef,
                 ref_logits, device):
    """One adapter's loss on its rows of a micro-batch: the clipped policy term, minus the entropy bonus,
    plus the KL term when the KL is in the loss. logp, entropy: each token's (b, T - start); logits: the
    whole logits, only for kl_kind full (else None). Returns (loss, its token-weighted sums, the max ratio), the
    sums and the ratio as detached device tensors: nothing here waits for the device.
    on_policy: this forward IS the policy that sampled (first mini-batch of the first epoch): ratio 1."""
    a = cfg.algo
    (clip_low, clip_high), agg, norm_len = a.clip, a.agg, part.batch.norm_len
    mask = to_device(window(part.batch.mask, rows, start, T), device) * weight
    old_logp = logp.detach() if on_policy else to_device(window(part.old_logp, rows, start, T), device)
    advantages = to_device(window(part.adv, rows, start, T), device)
    pg_loss, pg_stats = ppo.LOSSES[a.policy_loss](logp, old_logp, advantages, mask, clip_low, clip_high, a.dual_clip,
                                                  agg, denom, norm_len)
    entropy = (entropy if a.entropy_coef > 0 else entropy.detach()) * mask  # a metric always
    loss = pg_loss - a.entropy_coef * ppo.agg_loss(entropy, mask, agg, denom, norm_len)
    n = mask.sum()
    sums = {"pg_loss": pg_loss.detach(), "tokens": n, "entropy": (entropy.detach() * mask).sum(),
            "clipfrac": pg_stats["clipfrac"] * n, "approx_kl": pg_stats["approx_kl"] * n}
    if a.kl_coef > 0 and not a.kl_in_reward:
        kl = (ppo.full_kl(logits, ref_logits) if a.kl_kind == "full"
              else ppo.kl_penalty(logp, to_device(window(part.ref_logp, rows, start, T), device), a.kl_kind))
        kl_loss = ppo.agg_loss(kl, mask, agg, denom, norm_len)
        loss = loss + kl_coef * kl_loss
        sums["kl_loss"] = kl_loss.detach()
    return loss, sums, torch.where(n > 0, pg_stats["ratio_max"], 0.0)


def step_or_skip(part: AdapterUpdate, params, nonfinite: bool, stats: UpdateStats, grad_clip: float):
    """Clip and step one adapter's optimizer, or skip the step (grads dropped, weights untouched) when
    its loss or gradient is not finite; `nonfinite` is agreed over ranks, so every rank skips together."""
    average_grads(params)  # trainer.strategy replicate: the one reduction of the step (FSDP reduced in backward)
    norm = clip_grad(params, grad_clip)
    if nonfinite or not math.isfinite(norm):
        stats.skipped += 1
    else:
        stats.lr = part.opt.param_groups[0]["lr"]  # the rate this optimizer step used
        part.opt.step()
        stats.grad_norms.append(norm)
    part.opt.zero_grad(set_to_none=True)


def reduce_stats(stats: UpdateStats, n_steps: int) -> dict:
    """The update's metrics over every rank: token means, the mean loss stepped on, ratio maxima."""
    keys = sorted(stats.sums)
    local = torch.stack([stats.sums[k].double() for k in keys]).tolist() if keys else []  # device tensors: one read
    tot = dict(zip(keys, all_sum(local)))
    rmax = np.max(gather_objects(torch.stack(stats.ratio_max).tolist()), axis=0)  # (epochs x mini-batches,) max over ranks
    out = {k: tot[k] / max(tot["tokens"], 1.0) for k in ("entropy", "clipfrac", "approx_kl")}
    out.update({k: tot[k] / n_steps for k in ("pg_loss", "kl_loss") if k in tot})  # mean over mini-batches
    out.update(ratio_max=float(rmax.max()), ratio_max_first=float(rmax[0]), skipped=stats.skipped, lr=stats.lr)
    if stats.grad_norms:
        out["grad_norm"] = float(np.mean(stats.grad_norms))
    return out


def policy_update(model, parts: list[AdapterUpdate], cfg, device, kl_coef) -> dict[str, dict]:
    """ppo_epochs x mini-batches x micro-batches for one or more adapters at once. Each part keeps its
    own permutation, mini-batches, loss denominators, grad clip and optimizer step; only the forward
    and backward of a micro-batch are shared, each row wearing its own adapter. The adapters are
    disjoint and the base is frozen, so a part's gradient is what it would get alone (one part =
    the sequential reference, algo.fused_update=False). A non-finite loss or gradient skips that
    optimizer step and is counted in `skipped`; when fused, a non-finite row can poison the other
    parts of its micro-batch (NaN * 0), which then skip too."""
    a = cfg.algo
    model.train()  # policy adapters have no dropout, so this forward is the network old_logp came from
    lora.set_adapter(model, parts[0].adapter if len(parts) == 1 else None)
    params = {p.adapter: lora.adapter_parameters(model, p.adapter) for p in parts}
    W = head_weight(model, cfg)  # None: whole logits
    n_rows = {p.adapter: len(p.batch.samples) for p in parts}
    n_mb = {p.adapter: max(1, math.ceil(n / a.mini_batch_size)) for p, n in zip(parts, all_sum([float(n_rows[p.adapter]) for p in parts]))}
    stats = {p.adapter: UpdateStats(lr=p.opt.param_groups[0]["lr"]) for p in parts}
    for epoch in range(a.ppo_epochs):
        perm = {p.adapter: torch.randperm(n_rows[p.adapter], generator=p.gen).tolist() for p in parts}
        for k in range(max(n_mb.values())):
            mb = {p: perm[p.adapter][k * n_rows[p.adapter] // n_mb[p.adapter]:(k + 1) * n_rows[p.adapter] // n_mb[p.adapter]]
                  for p in parts if k < n_mb[p.adapter]}  # this mini-batch's rows (turns) of each part
            mb = dict(p.packed(rows) if p.pack and rows else (p, rows) for p, rows in mb.items())  # the same turns
            counts = [p.batch.mask[rows].sum() if a.agg == "token-mean" else (p.batch.mask[rows].sum(1) > 0).sum()
                      for p, rows in mb.items()]
            denom = {p: max(c, 1.0) for p, c in zip(mb, all_sum([float(c) for c in counts]))}  # global
            rows = sorted(((p, r) for p in mb for r in mb[p]), key=lambda x: -x[0].batch.rows_len[x[1]])
            # device tensors, read back once per mini-batch (below): the micro-batch loop never waits for the device
            nonfinite, mb_ratio_max = dict.fromkeys(mb, False), {p: [] for p in mb}
            for chunk, weight in lockstep_chunks(rows, a.micro_batch_size, dummy=(next(iter(mb)), 0),
                                                 weights=[p.batch.row_turns[r] for p, r in rows],
                                                 lengths=[p.batch.rows_len[r] for p, r in rows], max_tokens=a.micro_batch_tokens):
                pieces = [(p, [r for q, r in chunk if q is p]) for p in mb if any(q is p for q, _ in chunk)]
                if len(parts) > 1:
                    lora.set_row_adapters(model, [p.adapter for p, rs in pieces for _ in rs])
                if W is not None:
                    logits, ref_logits = None, None
                    logp, ent, targets, start, T = forward_logprobs(model, [(p.batch, rs) for p, rs in pieces], device,
                                                                    W, a.logits_chunk_tokens)
                else:
                    logits, targets, start, T = forward_logits(model, [(p.batch, rs) for p, rs in pieces], device)
                    logp = ppo.token_logprobs(logits, targets)  # (b, T - start)
                    ent = ppo.entropy(logits if a.entropy_coef > 0 else logits.detach(), 1.0)
                    ref_logits = reference_logits(model, pieces, parts, device) if a.kl_coef > 0 and not a.kl_in_reward \
                        and a.kl_kind == "full" else None
                loss, off = 0.0, 0
                for p, rs in pieces:  # each adapter's own loss on its own rows
                    sl = slice(off, off + len(rs))
                    off += len(rs)
                    part_loss, sums, ratio_max = adapter_loss(p, rs, logp[sl], ent[sl], None if logits is None else logits[sl],
                                                              start, T, weight, epoch == 0 and k == 0, denom[p], cfg,
                                                              kl_coef, None if ref_logits is None else ref_logits[sl], device)
                    nonfinite[p] = ~torch.isfinite(part_loss.detach()) | nonfinite[p]
                    for key, v in sums.items():
                        stats[p.adapter].sums[key] = stats[p.adapter].sums[key] + v  # not +=: v may share the loss's storage
                    mb_ratio_max[p].append(ratio_max)
                    loss = loss + part_loss
                backward(loss)
            flags = torch.stack([torch.as_tensor(nonfinite[p], device=device) for p in mb]).double().tolist()  # one read back
            for p, flag in zip(mb, all_sum(flags)):
                stats[p.adapter].ratio_max.append(torch.stack(mb_ratio_max[p]).max() if mb_ratio_max[p]
                                                  else torch.zeros((), device=device))
                step_or_skip(p, params[p.adapter], bool(flag), stats[p.adapter], a.grad_clip)
    lora.set_adapter(model, None)
    return {x: reduce_stats(st, a.ppo_epochs * n_mb[x]) for x, st in stats.items()}


@torch.no_grad()
def reference_logits(model, pieces, parts, device):
    """The reference policy's logits on a micro-batch (each row under its part's `ref`: the base, or its
    adapter's start), for the full-vocabulary KL; then the rows wear their adapters again."""
    refs = [p.ref for p, rs in pieces for _ in rs]
    if len(set(refs)) == 1:
        lora.set_adapter(model, refs[0])
    else:
        lora.set_row_adapters(model, refs)
    ref = forward_logits(model, [(p.batch, rs) for p, rs in pieces], device)[0]
    if len(parts) > 1:
        lora.set_row_adapters(model, [p.adapter for p, rs in pieces for _ in rs])
    else:
        lora.set_adapter(model, parts[0].adapter)
    return ref


# --------------------------------------------------------------------------------------------
# one adapter's share of a step: score -> advantages -> (critic); then the policy update


def old_and_ref_logp(run, adapter: str, batch: AdapterBatch, sb: AdapterBatch, unpack, ref: str | None, out: dict):
    """-> (old logprobs, reference logprobs, per-token KL), each (N, T) over `batch`'s turns: the old ones the
    engine's (old_from_sampling) or recomputed, then their gap to the engine's is a metric; the reference's and
    the KL only with a KL term (None otherwise). The forwards read `sb` (the packed batch, else `batch`) and
    `unpack` brings their rows back to the turns. Metrics go into `out`."""
    cfg, a, model, device = run.cfg, run.cfg.algo, run.model, run.device
    model.eval()
    old_logp = batch.sample_logp if run.old_from_sampling else unpack(score(model, sb, adapter, cfg, device))
    if not run.old_from_sampling:
        gap, n = all_sum([float((old_logp - batch.sample_logp).abs().mul(batch.mask).sum()), float(batch.mask.sum())])
        out["logprob_gap"] = gap / max(n, 1.0)  # engine vs trainer, mean |delta logp| per token
    ref_logp = kl_tok = None
    if a.kl_coef > 0:
        if a.kl_kind == "full":
            kl_tok = unpack(score(model, sb, adapter, cfg, device, full_kl_to_ref=True, ref=ref))
        else:
            ref_logp = unpack(score(model, sb, ref, cfg, device))
            kl_tok = ppo.kl_penalty(old_logp, ref_logp, a.kl_kind)
        kl_sum, n = all_sum([float((kl_tok * batch.mask).sum()), float(batch.mask.sum())])
        out["kl"] = kl_sum / max(n, 1.0)  # token mean, this adapter's
        seq_mean, n_seq = ppo.sequence_mean_kl(kl_tok, batch.mask)
        out["kl_seq_sum"], out["kl_seqs"] = seq_mean * n_seq, float(n_seq)  # for the controller; summed over ranks
    return old_logp, ref_logp, kl_tok


def weighted_advantages(run, adapter: str, roles: list, batch: AdapterBatch, adv, old_logp, step: int, out: dict):
    """The advantages (N, T) scaled by the options that weigh turns: each role on its own scale
    (norm_adv_by_role), each label the same total weight (balance_labels), the rollout importance weights
    (engine != trainer). Metrics go into `out`."""
    cfg, a, samples = run.cfg, run.cfg.algo, batch.samples
    if a.norm_adv_by_role:  # each role's advantages on its own scale (its roles numbered as in the config)
        index = torch.tensor([[r.name for r in roles].index(s.role) for s in samples])
        adv = ppo.group_whiten(adv, batch.mask, index, len(roles), all_sum)
    if roles[0].balance_labels:  # each label (e.g. right / wrong solutions judged) weighs the same in total
        w, bm = label_weights(samples)
        adv = adv * w[:, None]
        out.update(bm)
        if not bm and ("unlabelled", adapter) not in run.warned:  # an option with no effect says so, once
            run.warned.add(("unlabelled", adapter))
            print0(f"[step {step}] WARNING: roles.balance_labels is on for adapter {adapter!r} but the env labelled "
                   "none of its turns (env.turn_labels; the math team labels only with evaluator_mixed_groups_only): "
                   "nothing is balanced")
    if a.rollout_is_on(cfg.rollout.engine) and not run.old_from_sampling:  # engine != trainer: reweight
        w, im = ppo.rollout_is_weights(old_logp, batch.sample_logp, batch.mask, a.rollout_is_cap)
        adv = adv * w
        n = all_sum(float(batch.mask.sum()))
        out.update({k: all_sum(v * float(batch.mask.sum())) / max(n, 1.0) for k, v in im.items()})  # token means over ranks
    return adv


def prepare_adapter(run, adapter: str, samples: list[Sample], step: int, step_seed: int) -> tuple[AdapterUpdate | None, dict]:
    """Everything one adapter does in a step before its policy update; returns its AdapterUpdate (None when
    it is not updated: frozen, the critic warming up, or no signal) and its metrics (keys without the name)."""
    cfg, a, model = run.cfg, run.cfg.algo, run.model
    roles = [r for r in cfg.roles if cfg.adapter_of(r) == adapter]
    if not samples:  # another rank has turns of this adapter: a zero-weight dummy keeps collectives in step
        pad = run.tok.pad_token_id
        samples = [Sample(-1, -1, roles[0].name, 0, [pad], [pad], [0.0], dummy=True)]
    temp = {r.name: r.temperature for r in roles}
    batch = AdapterBatch(samples, [temp[s.role] for s in samples], run.tok.pad_token_id, max(r.max_tokens for r in roles))
    out = {}
    pk = Packed(batch) if a.packs_turns else None
    if pk is not None and len(pk.batch.samples) == len(samples):
        pk = None  # no turn extends another
    sb = pk.batch if pk else batch  # what the forwards read
    unpack = pk.unpack if pk else (lambda t: t)
    if a.packs_turns:  # rows the update's forwards read: the turns, fewer where turns were packed
        out["update_rows"] = all_sum(float(len(sb.samples)))
    ref = run.refs.get(adapter)  # None: the base (algo.kl_ref)
    old_logp, ref_logp, kl_tok = old_and_ref_logp(run, adapter, batch, sb, unpack, ref, out)
    estimator = cfg.estimator_of(roles[0])  # roles sharing an adapter share it (validate)
    critic = run.critic if estimator == "gae" else None
    values = critic.values(model, batch) if critic else None
    adv, returns = advantages(cfg, batch, kl_tok, values, run.kl_ctrl.value, estimator, run.estimator_state.get(adapter))
    adv = weighted_advantages(run, adapter, roles, batch, adv, old_logp, step, out)
    for s, a_mean in zip(samples, (adv * batch.mask).sum(1) / batch.mask.sum(1).clamp(min=1)):
        s.advantage = float(a_mean)  # for the trajectory files: what the update uses, weights included
        for part in s.parts:  # a merged step's turns (rollout.merge_turns): the episode's records are those
            part.advantage = s.advantage
    if critic:
        out.update(critic.update(model, batch, returns, values))
    lora.set_adapter(model, None)
    if adapter not in run.opts or (critic and step <= a.critic_warmup_steps) or not cfg.trains_at(roles[0], step):
        return None, out
    out["no_signal"] = 0.0
    if a.entropy_coef == 0 and not (a.kl_coef > 0 and not a.kl_in_reward):  # no loss term beside the policy's
        # one optimizer step over every row at ratio 1 (the loop's first mini-batch): copies' gradients meet in it
        one_step = a.ppo_epochs == 1 and all_sum(float(len(samples))) <= a.mini_batch_size
        if not all_sum(float(moves(batch, adv, copies_cancel=one_step))):
            # no signal: every advantage 0 (each group's rewards agree), or they cancel over token-identical turns.
            # The gradient is 0, but AdamW would still move the adapter along its momentum, replaying a past step's
            # update on a step that told it nothing: like a role with no turns, it skips the step (its LR schedule too)
            out["no_signal"] = 1.0
            return None, out
    gen = torch.Generator().manual_seed(step_seed + zlib.crc32(adapter.encode()) % 1000)  # str hash() is salted
    return AdapterUpdate(adapter, batch, adv, old_logp, ref_logp, run.opts[adapter], run.scheds[adapter], gen,
                         pack=pk is not None, ref=ref), out


def update(run, samples: list[Sample], step: int, step_seed: int) -> dict:
    """One training step's learning on the kept turns: per adapter, score -> advantages -> (critic);
    then the policy update, every adapter at once (algo.fused_update) or one after another; the LR
    schedule; the adaptive KL controller. Returns the step's train/* metrics."""
    cfg, a, metrics = run.cfg, run.cfg.algo, {}
    by_adapter = defaultdict(list)
    for s in samples:
        by_adapter[cfg.adapter_of(next(r for r in cfg.roles if r.name == s.role))].append(s)
    busy = [x for x, n in zip(cfg.adapters, all_sum([float(len(by_adapter[x])) for x in cfg.adapters])) if n]
    bar = tqdm(total=2 * len(busy), desc=f"step {step} update", leave=False,
               disable=not (cfg.rollout.progress and rank() == 0))
    parts = []
    for adapter in busy:
        part, um = prepare_adapter(run, adapter, by_adapter[adapter], step, step_seed)
        metrics.update({f"train/{k}/{adapter}": v for k, v in um.items()})
        parts += [part] if part else []
        bar.update(1 if part else 2)
    for group in ([parts] if a.fused_update and parts else [[p] for p in parts]):
        for adapter, um in policy_update(run.model, group, cfg, run.device, run.kl_ctrl.value).items():
            metrics.update({f"train/{k}/{adapter}": v for k, v in um.items()})
        bar.update(len(group))
    bar.close()
    for p in parts:  # the LR schedule counts the training steps that updated the adapter (verl's), not optimizer steps
        p.sched.step()
    for o in run.opts.values():  # a fused backward also leaves (zero, or NaN beside a NaN row) gradients on adapters
        o.zero_grad(set_to_none=True)  # that did not step: cleared, so none carries into a later step or a checkpoint
    seq = [(metrics.pop(k), metrics.pop(k.replace("kl_seq_sum", "kl_seqs"))) for k in list(metrics)
           if k.startswith("train/kl_seq_sum/")]
    if seq:  # verl's current_kl: the mean over every sequence of the step of its token-mean KL
        tot, n_seq = all_sum([sum(x for x, _ in seq), sum(n for _, n in seq)])
        metrics["train/kl"] = tot / max(n_seq, 1.0)
        if a.kl_in_reward:  # the controller moves the in-reward coefficient (config: adaptive needs it)
            run.kl_ctrl.update(metrics["train/kl"], int(n_seq))
    metrics["train/kl_coef"] = run.kl_ctrl.value
    return metrics


# --------------------------------------------------------------------------------------------
# which groups train


def group_key(cfg: Config, s: Sample):
    """The group a turn's advantage is centred in (GRPO, RLOO, REINFORCE++ baseline) and DAPO filters: its task
    and role, and with algo.group_by_turn its place (`Sample.key`: the env's Prompt.key, else the role's turn
    count; a merged turn keeps its first turn's; a step built without one, its index in the episode)."""
    if not cfg.algo.group_by_turn:
        return s.task_id, s.role, 0
    return s.task_id, s.role, s.turn if s.key is None else s.key


def informative(cfg: Config, samples: list[Sample]) -> list[Sample]:
    """DAPO's filter: drop the groups whose advantages are zero by construction, i.e. groups of more
    than one turn whose rewards all agree, for the roles whose estimator centres per group (grpo,
    rloo, reinforce++_baseline). A group of one stays (its grpo/rloo advantage is its reward, as
    in verl), and so does every turn of a role whose estimator does not centre per group (remax,
    reinforce++, gae: there a flat group still has advantages)."""
    est = {r.name: cfg.estimator_of(r) for r in cfg.roles}
    groups = defaultdict(list)
    for s in samples:
        groups[group_key(cfg, s)].append(s.reward)
    flat = {k for k, r in groups.items()
            if est.get(k[1], cfg.algo.adv_estimator) in ppo.GROUPED and len(r) > 1 and max(r) == min(r)}
    return [s for s in samples if group_key(cfg, s) not in flat]


def label_weights(samples: list[Sample]) -> tuple[torch.Tensor, dict]:
    """Per turn, the weight that gives each label (env.turn_labels) equal total weight over the step's
    turns on every rank: n_labelled / (n_labels * n_of_its_label); unlabelled turns weigh 1. With
    labels right x9 / wrong x1 a judge rewarded +1 / -1 that approves everything gets 9 * 10/18 * (+1)
    + 1 * 10/2 * (-1) = 0: no net push. Also the per-label counts and mean rewards, as metrics."""
    mine = defaultdict(lambda: [0.0, 0.0])  # label -> [turns, reward sum]
    for s in samples:
        if s.label is not None:
            mine[str(s.label).lower()][0] += 1
            mine[str(s.label).lower()][1] += s.reward
    keys = sorted({k for d in gather_objects(sorted(mine)) for k in d})
    tot = all_sum([mine[k][i] for k in keys for i in (0, 1)])
    count, reward = {k: tot[2 * j] for j, k in enumerate(keys)}, {k: tot[2 * j + 1] for j, k in enumerate(keys)}
    n = sum(count.values())
    w = torch.tensor([n / (len(keys) * count[str(s.label).lower()]) if s.label is not None else 1.0 for s in samples])
    metrics = {f"labelled_{k}": count[k] for k in keys} | {f"reward_{k}": reward[k] / max(count[k], 1.0) for k in keys}
    return w, metrics


def mixed_label_groups(cfg: Config, samples: list[Sample]) -> list[Sample]:
    """Leave out the groups of several labelled turns whose labels all agree (env.turn_labels: e.g. a
    judge's verdicts on solutions that were all right, where it can only learn the task's difficulty),
    for the roles whose estimator centres per group (ppo.GROUPED), like DAPO's filter: under the
    others (remax, reinforce++, gae, ema_baseline) such a group still carries advantage and stays."""
    est = {r.name: cfg.estimator_of(r) for r in cfg.roles}
    labels = defaultdict(set)
    for s in samples:
        if s.label is not None:
            labels[group_key(cfg, s)].add(s.label)
    n = defaultdict(int)
    for s in samples:
        n[group_key(cfg, s)] += 1
    uniform = {k for k, v in labels.items() if len(v) == 1 and n[k] > 1 and est.get(k[1]) in ppo.GROUPED}
    return [s for s in samples if group_key(cfg, s) not in uniform]


def dapo_batch(cfg: Config, samples: list[Sample]) -> list[Sample]:
    """The filter, then DAPO's trim: the informative groups of the first data.batch_size tasks (in
    stream order, over all ranks) that kept any, so refill rounds never grow the batch."""
    kept = informative(cfg, samples)
    tasks = sorted({t for part in gather_objects(sorted({s.task_id for s in kept})) for t in part})
    first = set(tasks[:cfg.data.batch_size])
    return [s for s in kept if s.task_id in first]


def select(cfg: Config, samples: list[Sample]) -> tuple[list[Sample], dict]:
    """The turns that train this step (DAPO's filter and trim when on, then the env-labelled uniform
    groups out) and what was left out, as train/* metrics: overall, and per trainable role the share of its
    turns each filter left out (train/dropped_by_dapo/<role>, train/dropped_by_labels/<role>; what
    idle_roles reads to say why a role learns nothing)."""
    kept, metrics = (dapo_batch(cfg, samples) if cfg.algo.dynamic_sampling else samples), {}
    after_dapo = kept
    n_lab, before = all_sum([float(sum(s.label is not None for s in kept)), float(len(kept))])
    if n_lab:  # the env labelled turns (on some rank: every rank takes this branch): uniform groups leave
        kept = mixed_label_groups(cfg, kept)
        metrics["train/labelled_turns_dropped"] = (before - all_sum(float(len(kept)))) / max(n_lab, 1.0)
    if cfg.algo.dynamic_sampling:
        n_kept, n_all = all_sum([float(len(kept)), float(len(samples))])
        metrics.update({"train/kept_frac": n_kept / max(n_all, 1.0),
                        "train/kept_tasks": float(len({t for p in gather_objects({s.task_id for s in kept}) for t in p}))})
    roles = [r.name for r in cfg.roles if r.trainable]
    counts = all_sum([float(sum(s.role == r for s in x)) for r in roles for x in (samples, after_dapo, kept)])
    for j, r in enumerate(roles):
        n, n_dapo, n_kept = counts[3 * j:3 * j + 3]
        metrics[f"train/turns/{r}"] = n
        if n and cfg.algo.dynamic_sampling:
            metrics[f"train/dropped_by_dapo/{r}"] = (n - n_dapo) / n
        if n_dapo and n_lab:
            metrics[f"train/dropped_by_labels/{r}"] = (n_dapo - n_kept) / n_dapo
    return kept, metrics


def mix_team_reward(cfg: Config, episodes) -> None:
    """roles[i].team_reward_weight (alpha): each turn of such a role trains on alpha * its episode's team reward
    (metrics()["team_reward"]; 0 where the env gave none or failed) + (1 - alpha) * its own reward, in place;
    its own stays in Sample.info["own_reward"] (what train/reward/<role> logs)."""
    alpha = {r.name: r.team_reward_weight for r in cfg.roles if r.team_reward_weight}
    for ep in episodes:
        team = float(ep.metrics.get("team_reward", 0.0))
        for s in ep.samples:
            if s.role in alpha:
                s.info["own_reward"] = s.reward
                s.reward = alpha[s.role] * team + (1 - alpha[s.role]) * s.reward
