"""Sampling for the engines: vectorised over rows, and per row reproducible whatever else is in the batch.

`sample(logits, temp, top_k, top_p, greedy, seed, step, filtered)` draws one token per row by inverse-CDF sampling
with a counter-based uniform (`uniform(seed, step)`, splitmix64 of the row's seed and the token index): a row's token
depends only on its own logits, seed and step, never on its batch, with no host sync and no loop over rows, so it runs
inside TorchEngine's captured decode step. Temperature, top-k and top-p are applied by `_filter_logits`.
"""
from __future__ import annotations

import torch

_M64 = 2**64


def _i64(c: int) -> int:
    """An unsigned 64-bit constant as the signed int64 with the same bits."""
    return c - _M64 if c >= 2**63 else c


_GOLDEN, _MIX1, _MIX2 = _i64(0x9E3779B97F4A7C15), _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB)


def _splitmix64(z):
    """splitmix64's finaliser on int64 tensors (multiplication wraps mod 2^64; `>>` is
    arithmetic on int64, so each shift is masked down to the logical shift)."""
    z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * _MIX1
    z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * _MIX2
    return z ^ ((z >> 31) & ((1 << 33) - 1))


def uniform(seed, step):
    """Counter-based uniform in [0, 1) for every row: a hash of (row seed, step), float64 with
    53 random bits. seed (B,) int64, step int64 (0-dim or (B,)) -> (B,). Nothing but the row's
    own seed and step enters, so a row draws the same number in any batch, on any device."""
    z = _splitmix64(_splitmix64(seed) + (step + 1) * _GOLDEN)
    return ((z >> 11) & ((1 << 53) - 1)).double() * 2.0**-53


def _filter_logits(logits, temp, top_k, top_p, filtered: bool):
    """Temperature, then top-k, then top-p (nucleus), per row. (B, V) -> (B, V) with -inf outside.
    temp, top_k, top_p (B, 1); `filtered` (any row with top_k > 0 or top_p < 1) is decided on
    the host from the requests, so this never syncs. Top-p's mass is the unfiltered distribution's. A token tied
    with the last one kept is kept: bf16 logits tie often, and which of the tied a sort puts first is arbitrary.
    Eager, one sort of each row; compiled (the fused decode step), a search for the two thresholds instead
    (_filter_by_thresholds), which keeps the same tokens."""
    logits = logits / temp
    if filtered and torch.compiler.is_compiling():
        return _filter_by_thresholds(logits, top_k, top_p)
    if filtered:
        sorted_l = logits.sort(-1, descending=True).values  # (B, V)
        rank = torch.arange(logits.shape[-1], device=logits.device).expand_as(sorted_l)
        drop = (top_k > 0) & (rank >= top_k)
        probs = sorted_l.double().softmax(-1)  # float64: the same masses as the search's, not two fp32 roundings
        drop |= ((probs.cumsum(-1) - probs) >= top_p) & (top_p < 1)  # smallest prefix with mass >= top_p
        last = sorted_l.gather(-1, (~drop).sum(-1, keepdim=True) - 1)  # (B, 1) the prefix's last (smallest) logit
        logits = logits.masked_fill(logits < last, float("-inf"))  # its ties too, wherever the sort put them
    return logits


def _order_keys(x):
    """fp32 (B, V) -> int64 keys in the same order (the float's bits, negatives' magnitude bits reversed; -0.0 as
    +0.0, the tie it is)."""
    b = torch.where(x == 0, 0.0, x).contiguous().view(torch.int32).long()
    return torch.where(b < 0, -(b & 0x7FFFFFFF) - 1, b)


SEARCH_POINTS, SEARCH_PASSES = 16, 8  # 17 ** 8 > 2 ** 32 + 1: the passes narrow any key range to one key


def _filter_by_thresholds(x, top_k, top_p):
    """_filter_logits' filter without a sort: a row keeps a token when fewer than top_k tokens are above it and
    their probability mass is below top_p, i.e. when its key (_order_keys) is at least each condition's
    threshold, the smallest key t with (count above t) < top_k, resp. (mass above t) < top_p. Both thresholds are
    found exactly by SEARCH_PASSES passes, each testing SEARCH_POINTS keys spread over the interval left: one
    reduction over the row a pass ((B, V, 2 x points) broadcast; compiled, fused into one kernel). The sort's kept
    set, but where the mass above a token is within float64 rounding of top_p (both compute the probabilities
    and their sums in float64, in another order). Counts are float64 sums too, exact below 2 ** 53."""
    key = _order_keys(x)  # (B, V)
    xd = x.double()  # float64 probabilities, as the sort's
    m = xd.amax(-1, keepdim=True)
    log_z = (xd - m).exp().sum(-1, keepdim=True).log()
    p = (xd - m - log_z).exp()  # (B, V) the unfiltered probabilities
    n = SEARCH_POINTS
    j = torch.arange(1, n + 1, device=x.device).repeat(2)  # (2n,): n points for top-k's threshold, n for top-p's
    weight = torch.where(torch.arange(2 * n, device=x.device) < n, 1.0, p[:, :, None])  # (B, V, 2n): count | mass
    lo = (key.amin(-1, keepdim=True) - 1).expand(-1, 2 * n)  # (B, 2n): above lo every token, above hi none, and
    hi = key.amax(-1, keepdim=True).expand(-1, 2 * n)  # each threshold in (lo, hi]
    below = torch.cat([top_k, top_p], -1).double().repeat_interleave(n, -1)  # (B, 2n)
    for _ in range(SEARCH_PASSES):
        t = lo + ((hi - lo) * j + n) // (n + 1)  # (B, 2n) in (lo, hi], increasing within each half
        ok = (weight * (key[:, :, None] > t[:, None, :])).sum(1, dtype=torch.float64) < below  # False.. then True..
        hi = torch.where(ok, t, hi).view(-1, 2, n).amin(-1).repeat_interleave(n, -1)
        lo = torch.where(ok, lo, t).view(-1, 2, n).amax(-1).repeat_interleave(n, -1)
    keep = ((top_k <= 0) | (key >= hi[:, :1])) & ((top_p >= 1) | (key >= hi[:, n:n + 1]))
    return x.masked_fill(~keep, float("-inf"))


BLOCK = 1024  # the vocabulary block of the two-level inverse CDF


def sample(logits, temp, top_k, top_p, greedy, seed, step, filtered: bool):
    """One token per row -> (tokens (B,), logprobs (B,)), with no host sync and no loop over rows.

    logits (B, V) fp32; temp/top_k/top_p (B, 1) (greedy rows: 1 / 0 / 1); greedy (B,) bool;
    seed (B,) int64; step: the index of the token being sampled (int64 tensor).
    Inverse-CDF sampling: the row's uniform u = uniform(seed, step) picks the first token whose
    cumulative probability exceeds u * total, so a row's token depends only on its own logits,
    seed and step. Two levels, so the (B, V) probabilities are read about once (a 150k vocabulary
    at batch 256 is ~150 MB per step): float64 cumulative sums over blocks of BLOCK tokens pick
    the block, then over that block's tokens. A token is picked with its probability to ~1e-12
    whatever the vocabulary size, and a token with probability 0 (filtered) never is. Compiled (the
    fused decode step), nothing of (B, V) is written where no row filters: the logits are read by
    reductions and gathers (test_the_compiled_sampler_writes_nothing_the_size_of_the_logits).
    Logprobs are under the distribution actually sampled from (temperature, top-k, top-p
    applied); greedy rows report the plain model logprob (temperature 1) instead of 0.
    """
    x = _filter_logits(logits, temp, top_k, top_p, filtered)  # (B, V), -inf outside the kept tokens
    B, V = x.shape
    if torch.compiler.is_compiling():  # the fused step: the logits are read by reductions and gathers, nothing of
        m = x.amax(-1, keepdim=True)  # (B, V) is written (a log_softmax would be, or probs read twice)
        log_z = (x - m).exp().sum(-1, keepdim=True).log()  # (B, 1)

        def logp_at(cols):  # (B, n) columns -> their logprobs
            return x.gather(-1, cols) - m - log_z

        def probs_of(a, b):  # the probabilities of columns a:b
            return (x[:, a:b] - m - log_z).exp()
    else:  # eager: one fused kernel writes the logprobs once
        logp = x.log_softmax(-1)

        def logp_at(cols):
            return logp.gather(-1, cols)

        def probs_of(a, b):
            return logp[:, a:b].exp()
    nf = V // BLOCK  # whole blocks, then one shorter block: views, no padded copy
    mass = [probs_of(0, nf * BLOCK).view(B, nf, BLOCK).sum(-1, dtype=torch.float64)] if nf else []
    if nf * BLOCK < V:
        mass.append(probs_of(nf * BLOCK, V).sum(-1, keepdim=True, dtype=torch.float64))
    bcdf = (torch.cat(mass, -1) if len(mass) > 1 else mass[0]).cumsum(-1)  # (B, nb)
    total = bcdf[:, -1]  # (B,) ~1
    u = torch.minimum(uniform(seed, step) * total, total.nextafter(torch.zeros_like(total)))  # (B,) in [0, total)
    blk = torch.searchsorted(bcdf, u[:, None], right=True)  # (B, 1) first block with cdf > u: its mass is > 0
    u = u[:, None] - torch.where(blk > 0, bcdf.gather(-1, (blk - 1).clamp(min=0)), 0.0)  # (B, 1) mass into the block
    col = blk * BLOCK + torch.arange(BLOCK, device=x.device)  # (B, BLOCK) the block's columns, the last one's past V
    cdf = torch.where(col < V, logp_at(col.clamp(max=V - 1)).exp(), 0.0).double().cumsum(-1)  # (B, BLOCK)
    j = torch.searchsorted(cdf, u, right=True)  # (B, 1) first token with cdf > u ...
    j = torch.minimum(j, (cdf < cdf[:, -1:]).sum(-1, keepdim=True))  # ... never past the block's last token with p > 0
    tok = torch.where(greedy, logits.argmax(-1), (blk * BLOCK + j).squeeze(-1))  # (B,)
    return tok, logp_at(tok[:, None]).squeeze(-1)
