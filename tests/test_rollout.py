import importlib.util
import os
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from helpers import CountingEngine
from torch.utils._python_dispatch import TorchDispatchMode

import engines
import lora
import ppo
import sampling
import static_step
from rollout import Prompt, Request, RoleSpec, SamplingParams, TorchEngine, run_episodes

TEXTS = ["What is 3 + 4?", "the answer is", "Solve: 12 * 9 = ? then check the result twice", "def f"]


class _Ops(TorchDispatchMode):
    """Counts the aten ops dispatched inside it, by name (view ops too)."""
    views = True

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.views or not func.is_view:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


class _NonViewOps(_Ops):
    """_Ops without the view ops (they launch no kernel)."""
    views = False


def _randomize(m, name, seed, scale=0.2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lora.adapter_parameters(m, name):
            p.copy_(torch.randn(p.shape, generator=g) * scale)


@pytest.fixture
def setup(tiny):
    m, tok = tiny
    lora.add_lora(m, ["a", "b"], rank=4, alpha=8)
    _randomize(m, "a", 1)
    _randomize(m, "b", 2)
    return m, tok, [tok.encode(t) for t in TEXTS]


def _hf_greedy(m, tok, prompts, n, adapter):
    """HF generate on a left-padded batch, the reference."""
    lora.set_adapter(m, adapter)
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (P - len(p)) + p for p in prompts])
    am = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    out = m.generate(input_ids=ids, attention_mask=am, max_new_tokens=n, do_sample=False,
                     eos_token_id=None, pad_token_id=tok.pad_token_id)
    lora.set_adapter(m, None)
    return out[:, P:].tolist()


@pytest.mark.parametrize("adapter", [None, "a"])
def test_greedy_equals_hf_generate(setup, adapter):
    m, tok, prompts = setup
    sp = SamplingParams(max_new_tokens=24, greedy=True, stop_token_ids=[])
    res = TorchEngine(m, tok).generate([Request(p, adapter, sp) for p in prompts])
    assert [r.completion_ids for r in res] == _hf_greedy(m, tok, prompts, 24, adapter)
    assert all(r.finish_reason == "length" and len(r.completion_ids) == 24 for r in res)


def test_sampled_logprobs_equal_trainer_recompute(setup):
    m, tok, prompts = setup
    sp = SamplingParams(max_new_tokens=20, temperature=1.0, stop_token_ids=[], seed=3)
    res = TorchEngine(m, tok).generate([Request(p, "b", sp) for p in prompts])
    lora.set_adapter(m, "b")
    with torch.no_grad():
        for p, r in zip(prompts, res):
            logits = m(input_ids=torch.tensor([p + r.completion_ids])).logits[0, len(p) - 1:-1]
            lp = ppo.token_logprobs(logits, torch.tensor(r.completion_ids))
            assert (lp - torch.tensor(r.logprobs)).abs().max() < 1e-4


def test_attention_never_asks_sdpa_for_gqa_with_a_mask(setup, monkeypatch):
    """On CUDA, SDPA with enable_gqa and a mask falls back to the math kernel (materialised scores):
    prefill and decode fold a KV head's G query heads into G*q queries instead, with the same tokens
    and logprobs as the trainer (the tests above)."""
    m, tok, prompts = setup
    calls = []
    real = engines.F.scaled_dot_product_attention
    monkeypatch.setattr(engines.F, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append((a[0].shape[2], k.get("enable_gqa", False))) or real(*a, **k))
    assert m.config.num_attention_heads > m.config.num_key_value_heads  # GQA
    TorchEngine(m, tok).generate([Request(p, "a", SamplingParams(max_new_tokens=4, greedy=True)) for p in prompts])
    assert calls and not any(gqa for _, gqa in calls)
    assert max(q for q, _ in calls) > m.config.num_attention_heads // m.config.num_key_value_heads  # a prefill ran


def test_mixed_adapter_batch_equals_separate_batches(setup):
    m, tok, prompts = setup
    eng = TorchEngine(m, tok)
    sp = SamplingParams(max_new_tokens=16, greedy=True, stop_token_ids=[])
    names = ["a", "b", None, "a"]
    mixed = eng.generate([Request(p, n, sp) for p, n in zip(prompts, names)])
    for n in set(names):
        rows = [i for i, x in enumerate(names) if x == n]
        sep = eng.generate([Request(prompts[i], n, sp) for i in rows])
        assert [mixed[i].completion_ids for i in rows] == [r.completion_ids for r in sep]
    assert len({tuple(r.completion_ids) for r in mixed[:3]}) == 3  # the adapters really differ


def test_stop_token_stop_string_and_length(setup):
    m, tok, prompts = setup
    eng = TorchEngine(m, tok)
    base = eng.generate([Request(prompts[0], "a", SamplingParams(max_new_tokens=30, greedy=True, stop_token_ids=[]))])[0]
    toks = base.completion_ids
    # a stop token id: the first occurrence of the token at position k ends the row there
    k = next(i for i in range(4, 30) if toks[i] not in toks[:i])
    r = eng.generate([Request(prompts[0], "a", SamplingParams(max_new_tokens=30, greedy=True, stop_token_ids=[toks[k]]))])[0]
    assert r.completion_ids == toks[:k + 1] and r.finish_reason == "stop" and r.stop_reason == toks[k]
    # a stop string completed by token j ends the row at token j (kept)
    for j in range(3, 30):
        s = tok.decode(toks[:j + 1])[-2:]
        if s.strip() and s not in tok.decode(toks[:j]):
            break
    r = eng.generate([Request(prompts[0], "a", SamplingParams(max_new_tokens=30, greedy=True, stop_token_ids=[], stop=[s]))])[0]
    assert r.completion_ids == toks[:j + 1] and r.finish_reason == "stop" and r.stop_reason == s
    # the EOS token is a stop by default; and max_new_tokens per row in one batch
    eos_tok = tok.eos_token_id
    reqs = [Request(prompts[1], "a", SamplingParams(max_new_tokens=n, greedy=True)) for n in (1, 7, 13)]
    for n, r in zip((1, 7, 13), eng.generate(reqs)):
        assert len(r.completion_ids) <= n
        assert r.finish_reason == ("stop" if r.completion_ids[-1] == eos_tok else "length")
        assert eos_tok not in r.completion_ids[:-1]


def test_eos_ends_row_and_compaction_keeps_others_right(setup):
    """Force EOS on one row by making it a stop id the model emits early; the other rows must be
    unaffected by that row leaving the batch (cache compaction)."""
    m, tok, prompts = setup
    eng = TorchEngine(m, tok)
    free = SamplingParams(max_new_tokens=20, greedy=True, stop_token_ids=[])
    ref = eng.generate([Request(p, "a", free) for p in prompts])
    early = ref[0].completion_ids[2]
    reqs = [Request(prompts[0], "a", SamplingParams(max_new_tokens=20, greedy=True, stop_token_ids=[early]))]
    reqs += [Request(p, "a", free) for p in prompts[1:]]
    out = eng.generate(reqs)
    assert out[0].finish_reason == "stop" and len(out[0].completion_ids) <= 3
    assert [r.completion_ids for r in out[1:]] == [r.completion_ids for r in ref[1:]]


def test_seeded_sampling_is_reproducible_and_batch_independent(setup):
    m, tok, prompts = setup
    eng = TorchEngine(m, tok)
    sp = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=50, top_p=0.9, stop_token_ids=[], seed=11)
    alone = eng.generate([Request(prompts[2], "a", sp)])[0]
    again = eng.generate([Request(prompts[2], "a", sp)])[0]
    in_batch = eng.generate([Request(p, "b", SamplingParams(max_new_tokens=5, seed=i)) for i, p in enumerate(prompts[:2])]
                            + [Request(prompts[2], "a", sp)])[2]
    assert alone.completion_ids == again.completion_ids == in_batch.completion_ids
    # unseeded requests draw from the engine's seed: two engines with one seed agree
    sp2 = SamplingParams(max_new_tokens=12, stop_token_ids=[])
    r1 = TorchEngine(m, tok, seed=5).generate([Request(p, "a", sp2) for p in prompts])
    r2 = TorchEngine(m, tok, seed=5).generate([Request(p, "a", sp2) for p in prompts])
    assert [r.completion_ids for r in r1] == [r.completion_ids for r in r2]


def test_top_k_one_and_tiny_top_p_are_greedy(setup):
    m, tok, prompts = setup
    eng = TorchEngine(m, tok)
    g = eng.generate([Request(p, "a", SamplingParams(max_new_tokens=10, greedy=True, stop_token_ids=[])) for p in prompts])
    k1 = eng.generate([Request(p, "a", SamplingParams(max_new_tokens=10, top_k=1, stop_token_ids=[])) for p in prompts])
    p0 = eng.generate([Request(p, "a", SamplingParams(max_new_tokens=10, top_p=1e-6, stop_token_ids=[])) for p in prompts])
    assert [r.completion_ids for r in g] == [r.completion_ids for r in k1] == [r.completion_ids for r in p0]
    assert all(abs(x) < 1e-5 for r in k1 for x in r.logprobs)  # one allowed token: logprob 0


def test_weight_update_is_seen_without_copy(setup):
    m, tok, prompts = setup
    eng = TorchEngine(m, tok)
    sp = SamplingParams(max_new_tokens=16, greedy=True, stop_token_ids=[])
    before = eng.generate([Request(p, "a", sp) for p in prompts])
    _randomize(m, "a", 99)  # what an optimizer step does: in-place update
    after = eng.generate([Request(p, "a", sp) for p in prompts])
    assert [r.completion_ids for r in after] != [r.completion_ids for r in before]
    assert [r.completion_ids for r in after] == _hf_greedy(m, tok, prompts, 16, "a")


def test_bad_sampling_params():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)


# ------------------------------------------------------- vectorised sampling, sync, static path


def _splitmix64_py(z):
    M = 2**64 - 1
    z &= M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)


def test_uniform_is_splitmix64_of_seed_and_step():
    """The int64 tensor version (wrapping products, masked shifts) equals plain splitmix64 on
    unsigned Python ints, for seeds and steps with the top bit set too."""
    seeds = [0, 1, 11, 2**62 + 12345, 2**63 - 1]
    for step in (0, 1, 7, 1000):
        got = sampling.uniform(torch.tensor(seeds, dtype=torch.long), torch.tensor(step)).tolist()
        want = [(_splitmix64_py(_splitmix64_py(s) + (step + 1) * 0x9E3779B97F4A7C15) >> 11) * 2.0**-53 for s in seeds]
        assert got == want
    u = sampling.uniform(torch.arange(20000), torch.tensor(3))
    assert 0 <= float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.01


def _chi2(counts, probs):
    n = counts.sum()
    keep = probs > 0
    return float((((counts - n * probs) ** 2) / (n * probs))[keep].sum()), int(keep.sum()) - 1


def _draws(logits, n, **kw):
    """n samples of one row's distribution: n rows with seeds 0..n-1 at steps 0..2 (fixed: not flaky)."""
    V, B = logits.shape[-1], n // 3
    out = []

    def col(v, dt=None):
        return torch.full((B, 1), v, dtype=dt)

    for step in range(3):
        tok, lp = sampling.sample(logits.expand(B, V), col(kw.get("temp", 1.0)), col(kw.get("top_k", 0), torch.long),
                                 col(kw.get("top_p", 1.0)), torch.zeros(B, dtype=torch.bool),
                                 torch.arange(B) * 7919 + 5, torch.tensor(step), kw.get("top_k", 0) > 0 or kw.get("top_p", 1.0) < 1)
        out.append((tok, lp))
    return torch.cat([t for t, _ in out]), torch.cat([lp for _, lp in out])


@pytest.mark.parametrize("block", [1024, 3])  # one block; three blocks of 3 (padded) with zeros inside
def test_sampling_distribution_temperature_top_k_top_p(monkeypatch, block):
    monkeypatch.setattr(sampling, "BLOCK", block)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 1.5]])
    n = 30000
    cases = [dict(), dict(temp=0.7), dict(temp=1.6), dict(top_k=3), dict(top_p=0.8), dict(top_k=5, top_p=0.9, temp=1.3)]
    for kw in cases:
        filt = sampling._filter_logits(logits, torch.tensor([[kw.get("temp", 1.0)]]), torch.tensor([[kw.get("top_k", 0)]]),
                                      torch.tensor([[kw.get("top_p", 1.0)]]), True)
        probs = filt.softmax(-1)[0].double()
        tok, lp = _draws(logits, n, **kw)
        counts = torch.bincount(tok, minlength=8).double()
        assert counts[probs == 0].sum() == 0, kw  # filtered tokens are never drawn
        chi2, dof = _chi2(counts, probs)
        assert chi2 < dof + 6 * (2 * dof) ** 0.5, (kw, chi2, dof)  # ~6 sigma: a wrong sampler is far above
        assert torch.allclose(lp, probs.log()[tok].float(), atol=1e-5)  # logprob under the sampled distribution
    # the kept sets themselves: top-k keeps the k largest, top-p the smallest prefix with mass >= p
    p = logits.softmax(-1)[0]
    order = p.argsort(descending=True)
    assert set(_draws(logits, 3000, top_k=3)[0].tolist()) == set(order[:3].tolist())
    k = int((p[order].cumsum(0) < 0.8).sum()) + 1
    assert set(_draws(logits, 3000, top_p=0.8)[0].tolist()) == set(order[:k].tolist())
    # a wrong distribution fails the same check (the test has teeth)
    tok, _ = _draws(logits, n, temp=1.3)
    assert _chi2(torch.bincount(tok, minlength=8).double(), logits.softmax(-1)[0].double())[0] > 100


def test_two_level_inverse_cdf_equals_one_level(monkeypatch):
    """Blocks of 7 over a 50-token vocabulary (with filtered zeros) pick exactly the token that one
    float64 cumulative sum over the whole vocabulary picks, for 3000 fixed seeds."""
    g = torch.Generator().manual_seed(0)
    B = 3000
    logits = torch.randn(B, 50, generator=g) * 3
    args = (logits, torch.full((B, 1), 0.9), torch.full((B, 1), 20), torch.full((B, 1), 0.95),
            torch.zeros(B, dtype=torch.bool), torch.arange(B) * 31 + 1, torch.tensor(5), True)
    monkeypatch.setattr(sampling, "BLOCK", 7)
    tok, lp = sampling.sample(*args)
    logp = sampling._filter_logits(*args[:4], True).log_softmax(-1)
    cdf = logp.exp().double().cumsum(-1)
    u = sampling.uniform(args[5], args[6]) * cdf[:, -1]
    assert tok.tolist() == torch.searchsorted(cdf, u[:, None], right=True).squeeze(-1).tolist()
    assert torch.isfinite(lp).all()


@pytest.mark.parametrize("V", [5000, 3072])  # whole blocks and a shorter last one; whole blocks only
def test_the_compiled_sampler_writes_nothing_the_size_of_the_logits(V):
    """Compiled (as in the fused decode step), the unfiltered sampler reads the logits with reductions and gathers
    and allocates no buffer with a vocabulary-sized dimension (a log_softmax, its exp and a padded copy were two
    (B, V)-sized buffers); it draws the eager sampler's tokens with its logprobs, greedy rows, filtered rows too.
    Filtered, it runs no sort (the threshold search) and allocates two: the probabilities the search reads and
    the filtered logits."""
    import re

    from torch._inductor.utils import run_and_get_code
    B = 6
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(B, V, generator=g) * 4).to(torch.bfloat16)
    temp = torch.tensor([[1.0], [0.7], [1.3], [1.0], [0.9], [1.0]])
    greedy = torch.tensor([False, False, False, True, False, False])
    for filtered in (False, True):
        args = (temp, torch.tensor([[0], [0], [5], [0], [0], [0]]) if filtered else torch.zeros(B, 1, dtype=torch.long),
                torch.full((B, 1), 0.9 if filtered else 1.0), greedy, torch.arange(B) * 101 + 3, torch.tensor(7))
        torch._dynamo.reset()
        fn = torch.compile(lambda lg, *a: sampling.sample(lg.float(), *a, filtered), fullgraph=True, dynamic=False)
        (tok, lp), code = run_and_get_code(fn, logits, *args)
        etok, elp = sampling.sample(logits.float(), *args, filtered)
        assert tok.tolist() == etok.tolist() and torch.allclose(lp, elp, atol=1e-5), filtered
        code = "\n".join(code)
        assert not re.search(r"aten\.sort\b", code)  # top-k / top-p by a threshold search, not a sort
        shapes = [tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
                  for dims in re.findall(r"empty_strided_\w+\(\(([^)]*)\)", code)]
        assert len([s for s in shapes if any(d >= V for d in s)]) == (2 if filtered else 0), shapes


def test_the_threshold_search_keeps_what_the_sort_keeps():
    """The compiled step's top-k / top-p (sampling._filter_by_thresholds, run eagerly here) keeps exactly the sorted
    filter's tokens: rows of every spread with and without top-k and top-p, and a row holding the extremes of fp32
    (+-3e38, +-0, a subnormal), whose key range the passes must narrow to one key; and top-p near 1 over a real
    vocabulary, where both forms' float64 masses must agree to the token. At a tie on the boundary the
    search keeps every tied token, and so does the sort's filter (not only those it happens to put first)."""
    g = torch.Generator().manual_seed(0)
    B, V = 96, 3000
    x = torch.randn(B, V, generator=g) * torch.rand(B, 1, generator=g) * 8
    x[0, :5] = torch.tensor([3e38, -3e38, 0.0, -0.0, 1e-40])
    x[1, :3] = torch.tensor([-3e38, -3e38, 3e38])
    top_k = torch.randint(1, 60, (B, 1), generator=g)
    top_k[::3] = 0
    top_p = torch.rand(B, 1, generator=g).clamp(min=0.02)
    top_p[::4] = 1.0
    sort = sampling._filter_logits(x, torch.ones(B, 1), top_k, top_p, True)
    search = sampling._filter_by_thresholds(x, top_k, top_p)
    assert torch.equal(sort.isinf(), search.isinf()) and torch.equal(sort[~sort.isinf()], search[~sort.isinf()])
    kept = (~search.isinf()).sum(-1)
    filtering = (top_k[:, 0] > 0) | (top_p[:, 0] < 1)
    assert kept.min() >= 1 and kept[filtering].max() < V and (kept[filtering] > 60).any()  # top-p alone keeps more
    # a tie on the boundary: the two tokens of logit 1 are the 2nd and 3rd; top-k 2 keeps both, as does a top-p
    # whose prefix ends inside the tie
    # a real vocabulary of bf16-valued logits (ties everywhere) and a long tail: top-p near 1 cuts inside the tail,
    # where the mass of a token is ~1e-6 (in fp32 probabilities the two forms differed there: 3 of 8 rows at 0.999)
    V = 151936
    x = (torch.randn(8, V, generator=g) * 2.5).bfloat16().float()
    x[:, :20] += 8
    for p in (0.9999,):  # (fp32 probabilities: 6 of these 8 rows differed between the forms)
        top_p, top_k = torch.full((8, 1), p), torch.zeros(8, 1, dtype=torch.long)
        sort = sampling._filter_logits(x, torch.ones(8, 1), top_k, top_p, True)
        assert torch.equal(sort.isinf(), sampling._filter_by_thresholds(x, top_k, top_p).isinf()), p
    for row, top_p in (([3.0, 1.0, 1.0, 0.0, -1.0], 0.8), ([3.0, 0.0, -0.0, -1.0, -2.0], 0.9)):  # -0.0 ties +0.0
        for k, p in ((2, 1.0), (0, top_p)):
            for f in (sampling._filter_by_thresholds,
                      lambda x, k, p: sampling._filter_logits(x, torch.ones(1, 1), k, p, True)):
                kept = ~f(torch.tensor([row]), torch.tensor([[k]]), torch.tensor([[p]])).isinf()
                assert kept.tolist() == [[True, True, True, False, False]], (row, k, p)


def _result_tuples(res):
    return [(r.completion_ids, r.finish_reason, r.stop_reason, r.text) for r in res]


def _assert_same(a, b, atol=1e-5):
    assert _result_tuples(a) == _result_tuples(b)
    for x, y in zip(a, b):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=atol)


def _assert_same_but_boundary_flips(m, a, b, reqs, atol=1e-5, tol=1e-5):
    """`a` and `b` (seeded, unfiltered, temperature 1, no adapter) are the same tokens and logprobs, except where a row's
    draw fell within rounding of a token boundary: two forward passes that round differently (matmul attention
    against SDPA, inductor's vectorised kernels against eager ones) move the inverse CDF's boundaries by ~1e-7, and a
    uniform that lands between the two picks a neighbouring token (on an AVX-512 CPU, 1 of 64 rows x 6 tokens). There
    the row's own uniform must lie within `tol` of the reference distribution's CDF at every boundary between the two
    tokens (recomputed by a plain forward over `b`'s prefix); a token drawn anywhere else fails."""
    assert len(a) == len(b) == len(reqs)
    for r, x, y in zip(reqs, a, b):
        ca, cb = x.completion_ids, y.completion_ids
        t = next((k for k in range(min(len(ca), len(cb))) if ca[k] != cb[k]), None)
        if t is None:
            assert (ca, x.finish_reason) == (cb, y.finish_reason)
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=atol)
            continue
        assert torch.allclose(torch.tensor(x.logprobs[:t]), torch.tensor(y.logprobs[:t]), atol=atol)
        assert r.adapter is None and r.sampling.temperature == 1 and not r.sampling.top_k and r.sampling.top_p == 1
        with torch.no_grad():
            logits = m(torch.tensor([r.prompt_ids + cb[:t]])).logits[0, -1].double()  # (V,)
        cdf = logits.softmax(-1).cumsum(-1)
        u = sampling.uniform(torch.tensor([r.sampling.seed]), torch.tensor(t)).item() * cdf[-1].item()
        lo, hi = sorted((ca[t], cb[t]))
        gaps = (cdf[lo:hi] - u).abs()  # the CDF at each boundary between the two tokens
        assert gaps.max() < tol, (r.sampling.seed, t, lo, hi, gaps.max().item())


def _hard_requests(m, tok, prompts, eng=None):
    """Mixed adapters, ragged prompts and max_new_tokens, greedy and sampled (plain, top-k/top-p), a
    stop id the row emits early, a stop string, the default EOS: every stopping path in one batch."""
    eng = eng or TorchEngine(m, tok)
    free = eng.generate([Request(prompts[0], "a", SamplingParams(max_new_tokens=20, greedy=True, stop_token_ids=[]))])[0]
    stop_str = next(tok.decode(free.completion_ids[:j + 1])[-2:] for j in range(4, 20)
                    if tok.decode(free.completion_ids[:j + 1])[-2:].strip()
                    and tok.decode(free.completion_ids[:j + 1])[-2:] not in tok.decode(free.completion_ids[:j]))
    return [Request(prompts[0], "a", SamplingParams(max_new_tokens=20, greedy=True, stop_token_ids=[], stop=[stop_str])),
            Request(prompts[0], "a", SamplingParams(max_new_tokens=20, greedy=True, stop_token_ids=[free.completion_ids[5]])),
            Request(prompts[1], "b", SamplingParams(max_new_tokens=9, seed=4, stop_token_ids=[])),
            Request(prompts[2], None, SamplingParams(max_new_tokens=17, seed=5, top_k=20, top_p=0.9, stop=["e", "zz"])),
            Request(prompts[3], "b", SamplingParams(max_new_tokens=3, greedy=True)),
            Request(prompts[2], "a", SamplingParams(max_new_tokens=13, seed=6, temperature=0.7))]


def _reference_engine():
    """bench/_reference_engine.py loaded by path (bench/ on sys.path would shadow lora.py and rollout.py)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "_reference_engine.py")
    spec = importlib.util.spec_from_file_location("_reference_engine", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_stop_handling_and_greedy_tokens_match_the_old_engine(setup):
    """The old per-row loop (frozen in bench/_reference_engine.py) cuts rows exactly where this one
    does: stop ids, stop strings, EOS, lengths, per row in one ragged mixed batch. Greedy rows match
    token for token; sampled rows differ on purpose (the sampler changed), so only greedy compare."""
    ReferenceEngine = _reference_engine().ReferenceEngine
    m, tok, prompts = setup
    reqs = [r for r in _hard_requests(m, tok, prompts) if r.sampling.greedy]
    reqs.append(Request(prompts[2], "b", SamplingParams(max_new_tokens=30, greedy=True, stop=[" ", "a"])))
    new, old = TorchEngine(m, tok).generate(reqs), ReferenceEngine(m, tok).generate(reqs)
    _assert_same(new, old)
    assert {r.finish_reason for r in new} == {"stop", "length"}


@pytest.mark.parametrize("sync_every", [3, 64])
def test_sync_every_does_not_change_results(setup, sync_every):
    m, tok, prompts = setup
    reqs = _hard_requests(m, tok, prompts)
    ref = TorchEngine(m, tok, sync_every=1).generate(reqs)
    assert {r.finish_reason for r in ref} == {"stop", "length"} and any(isinstance(r.stop_reason, str) for r in ref)
    _assert_same(TorchEngine(m, tok, sync_every=sync_every).generate(reqs), ref, atol=0)


@pytest.mark.parametrize("div", [2, 10**9])
def test_compaction_schedule_does_not_change_results(setup, div):
    """Compaction copies only the cache columns written so far into new (uninitialised) memory, and
    by default waits until 1/8 of the batch has finished: compacting at every finished row (div 1),
    at half the batch (2) or never (10**9) gives the same tokens and logprobs."""
    m, tok, prompts = setup
    reqs = _hard_requests(m, tok, prompts)
    eng = TorchEngine(m, tok, prefix_cache_tokens=0)  # bit-exact compaction; the cache's own exactness: test_prefix_cache
    eng._compact_div = 1
    ref = eng.generate(reqs)
    eng._compact_div = div
    _assert_same(eng.generate(reqs), ref, atol=0)


def test_sample_does_not_depend_on_the_batch(setup):
    """One seeded row alone, then among rows with other adapters, prompt lengths, sampling settings
    and max_new_tokens (so the batch is compacted around it): same tokens, same logprobs."""
    m, tok, prompts = setup
    eng = TorchEngine(m, tok)
    for sp in (SamplingParams(max_new_tokens=16, seed=123, stop_token_ids=[]),
               SamplingParams(max_new_tokens=16, seed=2**62 + 7, temperature=1.4, top_p=0.95, stop_token_ids=[])):
        alone = eng.generate([Request(prompts[1], "b", sp)])
        others = [Request(p, n, SamplingParams(max_new_tokens=k, seed=k, top_k=k)) for p, n, k in
                  zip(prompts, ["a", None, "b", "a"], [3, 20, 7, 11])]
        batch = eng.generate(others[:2] + [Request(prompts[1], "b", sp)] + others[2:])
        _assert_same([batch[2]], alone)


@pytest.mark.parametrize("form", [{}, {"_qkv_matmul": False}, {"_attention": "matmul"}])
def test_static_path_equals_eager_path(setup, form):
    """compile=True's static decode step (fixed slots and cache length, masked attention over a window of the
    cache, no compaction, one step function) run eagerly on CPU (the test hook _capture=False)
    gives the eager path's tokens and logprobs: greedy and sampled, mixed adapters, ragged lengths,
    stop ids, stop strings; also across calls of other shapes (cached static buffers reused)."""
    m, tok, prompts = setup
    reqs = _hard_requests(m, tok, prompts)
    eager = TorchEngine(m, tok)
    static = TorchEngine(m, tok, compile=True, _capture=False, sync_every=4, **form)
    for batch in (reqs, reqs[2:5], reqs, [reqs[1]]):  # 6 rows -> 8 slots, 3 -> 4, 1 -> 1
        _assert_same(static.generate(batch), eager.generate(batch))
    sp = SamplingParams(max_new_tokens=12, greedy=True, stop_token_ids=[])
    assert ([r.completion_ids for r in static.generate([Request(p, "a", sp) for p in prompts])]
            == _hf_greedy(m, tok, prompts, 12, "a"))
    _randomize(m, "a", 7)  # an in-place update is seen by the cached static step
    assert ([r.completion_ids for r in static.generate([Request(p, "a", sp) for p in prompts])]
            == _hf_greedy(m, tok, prompts, 12, "a"))



def test_cache_window_grid():
    """64, 128, 192, 256, 384, 512, 768, 1024, ...: at most L, and past 128 columns never more than 1.5x those needed."""
    got = sorted({static_step.cache_window(4224, n) for n in range(1, 4225)})
    assert got == [64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 4224]
    assert all(n <= static_step.cache_window(4224, n) <= max(128, 1.5 * n) for n in range(1, 4225))
    assert static_step.cache_window(192, 150) == 192 and static_step.cache_window(320, 300) == 320


@torch.no_grad()
def test_a_window_capture_restores_what_its_warm_up_changed(setup):
    """A window's graph is captured mid-generation after warm-up runs of the step itself. Whatever a warm-up wrote
    that the step reads back or keeps (the last token, the step counter, the rows' ends and stop flags) is restored,
    so the replay redoes that step: on a GPU a warm-up need not draw the replay's token (other kernels, other
    rounding), and a row must not stay ended by a token it never kept. Here every token is a stop id, so the step
    ends both rows; after the capture nothing has, and the step it returns ends them."""
    m, tok, _ = setup
    V = m.config.vocab_size
    eng = TorchEngine(m, tok, compile=True, _capture=False)
    _, b, step, P = eng._static_step(2, 64, V, False)
    b.stop_ids.copy_(torch.arange(V).expand(2, V))
    b.greedy.fill_(True)
    b.tok.copy_(torch.tensor([5, 9]))
    P.fill_(3)
    state = (b.tok, step, b.end, b.by_id)
    before = [t.clone() for t in state]
    run = eng._capture_window(b, step, P, False, 64, [], warmups=2)
    assert all(torch.equal(t, v) for t, v in zip(state, before))
    run()
    assert int(step) == 2 and b.by_id.all() and b.end.tolist() == [2, 2] and not torch.equal(b.tok, before[0])


def test_the_static_step_attends_to_a_window_of_the_cache_written_so_far(setup, monkeypatch):
    """compile=True's step (run eagerly through the test hook) over a cache sized for 150 new tokens reads, at each
    decode step, the KV of the window cache_window gives for the columns written so far (64, 128, then 192, the
    whole cache), not the whole cache from the first step, and gives the eager path's tokens and logprobs and the same as
    with the whole cache read at every step (`_cache_windows=False`)."""

    m, tok, prompts = setup
    reqs = [Request(p, a, SamplingParams(max_new_tokens=150, seed=i, top_p=0.9 if i == 2 else 1.0, stop_token_ids=[]))
            for i, (p, a) in enumerate(zip(prompts, ["a", "b", None, "a"]))]
    P, N = max(len(p) for p in prompts), 150
    L = -(-(P + N) // 64) * 64
    cols = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        cols.append((q.shape[2], k.shape[2]))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    windowed = TorchEngine(m, tok, compile=True, _capture=False).generate(reqs)
    layers = m.config.num_hidden_layers
    steps = [k for q, k in cols[::layers] if q == m.config.num_attention_heads // m.config.num_key_value_heads]
    want = []  # decode steps 1 .. N-1 (0: the prefill); a window's first step follows its capture's warm-up runs: two
    for s in range(1, N):  # for the shape's first window, one for each later one
        W = static_step.cache_window(L, P + s)
        want += [W] * (1 if W in want else 3 if not want else 2)
    assert steps == want, steps
    assert steps[0] == 64 and steps[-1] == L and sum(steps) < 0.75 * L * len(steps) and len(set(steps)) == 3
    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    # the eager path reads [0, column] unmasked, the static one a masked window: other reductions, whose rounding
    # drifts over 150 tokens (2.7e-4 here, the same with the whole cache; 1e-5 over the 20 tokens of the tests above)
    _assert_same(windowed, TorchEngine(m, tok).generate(reqs), atol=1e-3)
    _assert_same(windowed, TorchEngine(m, tok, compile=True, _capture=False, _cache_windows=False).generate(reqs), atol=0)
    # the fused (compiled) step: the window is a symbolic size from the first compilation, so its three windows
    # here share one graph (the cache has a column more than the largest window, which therefore never spans it)
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    fused = TorchEngine(m, tok, compile=True, fuse=True, _capture=False)
    _assert_same(fused.generate(reqs), windowed, atol=1e-3)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"], dict(counters)
    # another batch and cache size: the one recompile with those symbolic too (as without windows), then reused
    for rows, n in ((2, 100), (3, 40), (4, 300)):
        fused.generate([Request(r.prompt_ids, r.adapter, SamplingParams(max_new_tokens=n, seed=7, stop_token_ids=[]))
                        for r in reqs[:rows]])
    assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"], dict(counters)


def test_the_fused_step_attends_with_matmuls_from_64_slots(tiny):
    """rollout.fuse's step at >= static_step.ATTN_MATMUL_MIN_BATCH (64) batch slots attends with two batched matmuls and a
    softmax instead of SDPA's kernel (on an H200 at batch 256: 630 against 949 us of attention kernels a step); below
    it, and in the plain graph step at any size, with SDPA. The fused engine's step is run uncompiled here (the same
    Python, so the same decision): at 64 rows its decode steps call no SDPA, at 32 they do, and the tokens are the
    plain step's; then compiled at 64 rows: the plain step's tokens, one graph."""
    m, tok = tiny
    assert static_step.ATTN_MATMUL_MIN_BATCH == 64
    with pytest.raises(ValueError, match="_attention"):
        TorchEngine(m, tok, compile=True, _capture=False, _attention="flash")

    prompts = [tok.encode(t) for t in TEXTS]
    fused = TorchEngine(m, tok, compile=True, fuse=True, _capture=False)
    fused._step_fn = fused._step_body  # the fused step's Python, not compiled: its ops are visible here
    plain = TorchEngine(m, tok, compile=True, _capture=False)
    L = m.config.num_hidden_layers
    for rows, fused_sdpa in ((64, 0), (32, 4 * L)):
        sdpa_ops, outs = {}, {}
        for name, eng in (("fused", fused), ("plain", plain)):
            counts = []
            eng.generate([Request(prompts[i % 4], None, SamplingParams(max_new_tokens=6, stop_token_ids=[]))
                          for i in range(rows)])  # the shape's window captured (its warm-up steps), not counted
            for n in (2, 6):
                reqs = [Request(prompts[i % 4], None, SamplingParams(max_new_tokens=n, seed=i, stop_token_ids=[]))
                        for i in range(rows)]
                with _Ops() as c:
                    outs[name] = eng.generate(reqs)
                counts.append(sum(v for k, v in c.ops.items() if "scaled_dot_product" in k))
            sdpa_ops[name] = counts[1] - counts[0]  # the decode steps' SDPA calls (the prefill's cancel out)
        assert sdpa_ops == {"fused": fused_sdpa, "plain": 4 * L}, (rows, sdpa_ops)
        _assert_same_but_boundary_flips(m, outs["fused"], outs["plain"], reqs)  # the matmul form rounds otherwise
    # and compiled, as a GPU runs it: the matmul form under torch.compile at 64 slots, one graph, no break
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    compiled = TorchEngine(m, tok, compile=True, fuse=True, _capture=False)
    reqs = [Request(prompts[i % 4], None, SamplingParams(max_new_tokens=6, seed=i, stop_token_ids=[])) for i in range(64)]
    _assert_same_but_boundary_flips(m, compiled.generate(reqs), plain.generate(reqs), reqs)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"], dict(counters)


def test_fused_static_step_equals_the_plain_one_and_compiles_as_one_graph(setup):
    """fuse=True compiles the static decode step (forward + sampling) with torch.compile, fullgraph: inductor's
    C++ kernels on CPU here, triton's on CUDA, where the CUDA graph then captures them. Same tokens as the plain
    static step on a bf16 base, on this tiny model (greedy and seeded sampling, top-k/top-p, mixed adapters,
    ragged rows, stop ids and strings; a larger model's top-p row can keep another set at its boundary, since
    the compiled sampler sums in another order: docs/benchmarks.md) and bit-identical logprobs: inductor's fused kernels round where eager bf16 ops do
    (emulate_precision_casts; without it they keep fp32 inside a kernel and sampled tokens drift); two
    compilations for any number of batch shapes (the second with symbolic sizes); the routed LoRA buffers are read in place, so an update made after the
    step was compiled is seen without a recompile; and the step really is compiled (a no-op fuse compiles no
    graph), with no graph break (fullgraph would raise)."""
    from torch._dynamo.utils import counters

    m, tok, prompts = setup
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # as math_3agent: it
    # hooks the embedding with requires_grad_, which dynamo 2.11 cannot trace (the GPU run's first failure)
    m = m.to(torch.bfloat16).eval()  # a bf16 base as on a GPU, fp32 adapters: the rounding of each op is kept
    for name in "ab":
        for p in lora.adapter_parameters(m, name):
            p.data = p.data.float()
    reqs = _hard_requests(m, tok, prompts)
    plain = TorchEngine(m, tok, compile=True, _capture=False, sync_every=4)
    fused = TorchEngine(m, tok, compile=True, fuse=True, _capture=False, sync_every=4)
    torch._dynamo.reset()
    counters.clear()
    def same(a, b):  # tokens, finish reasons and logprobs, exactly
        assert _result_tuples(a) == _result_tuples(b) and [r.logprobs for r in a] == [r.logprobs for r in b]

    out = fused.generate(reqs)  # 6 rows -> 8 slots
    again = fused.generate(reqs)  # the same shapes: the compiled step again, no recompile
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"], dict(counters)
    same(out, plain.generate(reqs))
    same(again, out)
    _randomize(m, "a", 7)  # an in-place update: routed buffers refreshed outside the compiled step
    same(fused.generate(reqs), plain.generate(reqs))
    assert counters["stats"]["unique_graphs"] == 1
    # other batch and cache sizes: one recompile with symbolic sizes, which the next shape reuses
    for batch in (reqs[2:5], reqs[3:5]):  # 4 slots, 2 slots, other prompt widths (a top-p row in each)
        same(fused.generate(batch), plain.generate(batch))
    assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"], dict(counters)
    with pytest.raises(ValueError, match="compile=True"):
        TorchEngine(m, tok, fuse=True)


def test_the_static_step_is_captured_again_when_a_buffer_it_reads_is_made_afresh(setup, monkeypatch):
    """A captured graph replays reads from the addresses it was captured with: not only the parameters', also the
    model's buffers (RoPE's inverse frequencies), the concatenated q/k/v weights' and the routed LoRA buffers' and
    groups'. Those are made afresh when their dtype or shape changes (a round trip through another dtype can bring
    the parameters back to their old addresses on a GPU, not those buffers): any of them moving captures the
    windows again. Same parameters here; a q/k/v buffer, a LoRA group, RoPE's buffer made afresh: each time the next
    call captures again. A routing-off shape reads no LoRA buffer: the routed calls that create and move them leave
    its graphs alone."""
    m, tok, prompts = setup
    eng = TorchEngine(m, tok, compile=True, _capture=False)
    captures = []
    capture = eng._capture_window
    monkeypatch.setattr(eng, "_capture_window", lambda *a, **k: captures.append(a[0].tok.shape[0]) or capture(*a, **k))
    off = [Request(prompts[i], None, SamplingParams(max_new_tokens=5, seed=i, stop_token_ids=[])) for i in range(2)]
    off_first = eng.generate(off)  # 2 slots, routing off: captured before any LoRA buffer exists
    reqs = [Request(prompts[i], "ab"[i % 2], SamplingParams(max_new_tokens=5, seed=i, stop_token_ids=[])) for i in range(3)]
    first = eng.generate(reqs)  # 4 slots, routed: creates the routed buffers and the groups
    n = captures.count(4)
    _assert_same(eng.generate(reqs), first, atol=0)
    assert n >= 1 and captures.count(4) == n  # nothing moved: replayed
    eng._qkv[0][1] = eng._qkv[0][1].double()  # a dtype change: _refresh_qkv makes the buffer afresh
    _assert_same(eng.generate(reqs), first, atol=0)
    assert captures.count(4) == 2 * n
    (li, kind), (A, B) = next(iter(eng._lora_groups.items()))
    eng._lora_groups[(li, kind)] = (A.double(), None if B is None else B.double())
    _assert_same(eng.generate(reqs), first, atol=0)
    assert captures.count(4) == 3 * n
    m.model.rotary_emb.inv_freq = m.model.rotary_emb.inv_freq.clone()  # a module buffer in new storage
    _assert_same(eng.generate(reqs), first, atol=0)
    assert captures.count(4) == 4 * n
    k = captures.count(2)
    _assert_same(eng.generate(off), off_first, atol=0)  # the routing-off shape: RoPE's buffer moved, nothing else
    assert captures.count(2) == 2 * k
    eng._lora_groups[(li, kind)] = (A.double(), None if B is None else B.double())
    eng.generate(reqs)  # a routed call moves a group again
    _assert_same(eng.generate(off), off_first, atol=0)
    assert captures.count(2) == 2 * k  # which the routing-off graphs do not read


def test_a_routing_off_step_is_not_compiled_again_after_a_routed_call(tiny):
    """The fused step compiles once per kind of batch (routing on or off among them). A role without an adapter
    (a reference, a base role) often decodes before the first routed call, which creates the LoRA groups: the
    routing-off step must not have guarded on them, or the next routing-off call compiles it again (40-85 s of
    compilation on an H200)."""
    from torch._dynamo.utils import counters
    m, tok = tiny
    lora.add_lora(m, ["a", "b"], rank=4, alpha=8)
    m.eval()
    eng = TorchEngine(m, tok, compile=True, fuse=True, _capture=False)
    prompts = [tok.encode(t) for t in ("What is 3 + 4?", "the answer is")]
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    for adapters in ([None, None], ["a", "b"], [None, None], ["a", "b"]):
        eng.generate([Request(x, a, SamplingParams(max_new_tokens=4, seed=1, stop_token_ids=[]))
                      for x, a in zip(prompts, adapters)])
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs == [1, 2, 2, 2] and eng._lora_groups, graphs


def test_routed_adapters_take_13_ops_a_layer_in_the_static_decode_step_not_21(tiny):
    """compile=True's step (run eagerly on CPU through the test hook; on CUDA the same ops are captured in the
    graph) on a bf16 base, three adapters mixed per row on all seven projections. Per layer and decode step the
    LoRA adds 13 ops to the no-adapter step: q, k and v's adapters in 3 (one x A^T over their stacked A_cat, the row
    mask, one addmm with their B_cat block-diagonal into the one q/k/v output), gate and up's in 4 (one x A^T, the
    mask, an addmm each), o's and down's in 3 each. One projection at a time (`_lora_group=False`) it is 21, three
    a projection (x A_cat^T, the mask, an addmm). None is a concatenation or a cast: the fp32 adapters are cast and
    concatenated into persistent buffers outside the step, only when they change, and the groups' buffers are
    copied from those in place (what a captured graph reads). Before that, each projection re-cast and
    re-concatenated them on every replay (9.4 ops)."""
    m, tok = tiny
    lora.add_lora(m, ["a", "b", "c"], rank=4, alpha=8)
    m = m.to(torch.bfloat16)
    for name in "abc":
        for p in lora.adapter_parameters(m, name):
            p.data = p.data.float().normal_(0, 0.05)  # fp32 master weights beside the bf16 base

    prompt = tok.encode("What is 3 + 4?")

    def per_step(eng, adapters):  # the ops of one decode step: 5 new tokens' call minus 1 token's (same prefill)
        counts = []
        for n in (1, 5):
            reqs = [Request(prompt, a, SamplingParams(max_new_tokens=n, greedy=True, stop_token_ids=[])) for a in adapters]
            eng.generate(reqs)  # warm: the step's shapes, the routed buffers
            with _NonViewOps() as c:
                out = eng.generate(reqs)
            counts.append(c.ops)
        return Counter({k: (counts[1][k] - counts[0][k]) / 4 for k in counts[1]}), [r.completion_ids for r in out]

    L = m.config.num_hidden_layers
    toks = {}
    for form, per_layer in (({}, 13), ({"_lora_group": False}, 21)):
        eng = TorchEngine(m, tok, compile=True, _capture=False, **form)
        base, _ = per_step(eng, [None] * 3)
        routed, toks[per_layer] = per_step(eng, "abc")
        extra = routed - base
        assert len({tuple(t) for t in toks[per_layer]}) > 1  # rows on different adapters
        assert sum(extra.values()) == per_layer * L, (form, extra)
        assert extra["cat"] == extra["_to_copy"] == extra["copy_"] == 0, (form, extra)
    assert toks[13] == toks[21]
    # an update is seen at the next call, copied in place into the same buffers (what a captured graph reads)
    a = m.model.layers[0].self_attn
    A_buf = a.q_proj._routed[torch.bfloat16][1]
    eng = TorchEngine(m, tok, compile=True, _capture=False)
    eng.generate([Request(prompt, x, SamplingParams(max_new_tokens=2, greedy=True)) for x in "abc"])
    group_A, group_B = eng._lora_groups[(0, "qkv")]
    before = group_A.clone()
    with torch.no_grad():
        a.k_proj.lora_A["b"].add_(0.5)
        a.v_proj.lora_B["c"].add_(0.25)
    eng.generate([Request(prompt, x, SamplingParams(max_new_tokens=2, greedy=True)) for x in "abc"])
    assert a.q_proj._routed[torch.bfloat16][1] is A_buf and eng._lora_groups[(0, "qkv")][0] is group_A
    assert not torch.equal(group_A, before)
    assert torch.equal(group_A, torch.cat([torch.cat(list(p.lora_A.values())) for p in (a.q_proj, a.k_proj, a.v_proj)]).bfloat16())
    B_want = torch.block_diag(*[torch.cat(list(p.lora_B.values()), 1) for p in (a.q_proj, a.k_proj, a.v_proj)]).bfloat16()
    assert torch.equal(group_B, B_want)


@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), ("q_proj", "v_proj", "gate_proj", "up_proj"),
                                     ("k_proj", "v_proj", "up_proj", "down_proj")])
def test_grouped_adapters_on_some_projections_equal_one_at_a_time(tiny, targets):
    """LoRA on some projections only (q and v: the common setting; k a plain Linear inside the q/k/v group, its rows
    of the block-diagonal B zero; gate without up: no MLP group): the grouped static step gives the tokens and
    logprobs of the ungrouped one and of the eager path, mixed adapters per row."""
    m, tok = tiny
    lora.add_lora(m, ["a", "b"], rank=4, alpha=8, targets=targets)
    _randomize(m, "a", 1)
    _randomize(m, "b", 2)
    prompts = [tok.encode(t) for t in TEXTS]
    reqs = [Request(p, a, SamplingParams(max_new_tokens=10, seed=i, stop_token_ids=[]))
            for i, (p, a) in enumerate(zip(prompts, ["a", "b", None, "a"]))]
    grouped = TorchEngine(m, tok, compile=True, _capture=False)
    out = grouped.generate(reqs)
    groups = {k for (_, k) in grouped._lora_groups}
    assert groups == ({"qkv"} | ({"mlp"} if {"gate_proj", "up_proj"} <= set(targets) else set())), groups
    _assert_same(out, TorchEngine(m, tok, compile=True, _capture=False, _lora_group=False).generate(reqs))
    _assert_same(out, TorchEngine(m, tok).generate(reqs))


def test_the_static_step_projects_q_k_v_in_one_matmul_and_sees_a_base_update(tiny, monkeypatch):
    """compile=True's step (run eagerly through the test hook) multiplies by the q, k and v base weights as ONE
    concatenated matrix: 5 matmuls a layer, not 7 (batch 1's GEMVs are latency-bound on a GPU). With adapters on
    q and v only (k a plain Linear), routed per row, it equals the eager path; an in-place update of a base weight
    (full-weight training) reaches the next call through the refreshed buffer, and so does a changed bias."""
    m, tok = tiny
    lora.add_lora(m, ["a", "b"], rank=4, alpha=8, targets=("q_proj", "v_proj"))
    _randomize(m, "a", 1)
    _randomize(m, "b", 2)
    prompts = [tok.encode(t) for t in TEXTS]
    eager, static = TorchEngine(m, tok), TorchEngine(m, tok, compile=True, _capture=False)
    sp = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3, stop_token_ids=[])
    reqs = [Request(p, a, sp) for p, a in zip(prompts, ["a", "b", None, "a"])]
    _assert_same(static.generate(reqs), eager.generate(reqs))

    one = [Request(prompts[0], None, SamplingParams(max_new_tokens=n, greedy=True, stop_token_ids=[])) for n in (1, 5)]
    counts = []
    for r in one:
        static.generate([r])
        with _Ops() as c:
            static.generate([r])
        counts.append(c.ops)
    step = Counter({k: (counts[1][k] - counts[0][k]) / 4 for k in counts[1]})  # per decode step
    layers = m.config.num_hidden_layers
    assert step["mm"] + step["addmm"] == 5 * layers + 1, step  # + the lm_head (linear dispatches as these)
    a = m.model.layers[0].self_attn
    with torch.no_grad():
        a.k_proj.weight.mul_(-2.0)  # a plain Linear here (no adapter on k)
        a.q_proj.base_layer.bias.add_(0.5)
    _assert_same(static.generate(reqs), eager.generate(reqs))
    W = static._qkv[0][1]
    assert torch.equal(W[a.q_proj.out_features:a.q_proj.out_features + a.k_proj.out_features], a.k_proj.weight)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen2, k without a bias"])
def test_the_static_step_equals_the_eager_path_on_other_layers(tiny, arch):
    """The static step's one q/k/v matmul on the other decoder layers it supports: llama (no biases), qwen3 (no
    biases; q_norm / k_norm after the split; a head_dim of its own) and a qwen2 whose k has no bias (the zeros the
    concatenated bias takes there): tokens and logprobs equal the eager path's, adapters routed per row."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    base, tok = tiny
    kw = dict(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, eos_token_id=tok.eos_token_id,
              pad_token_id=tok.pad_token_id, bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    if arch == "llama":
        m = LlamaForCausalLM(LlamaConfig(**kw))
    elif arch == "qwen3":
        m = Qwen3ForCausalLM(Qwen3Config(head_dim=48, **kw))
    else:
        m = base
        for layer in m.model.layers:
            layer.self_attn.k_proj.bias = None
    m = m.eval()
    torch.nn.init.normal_(m.lm_head.weight, std=0.1)
    lora.add_lora(m, ["a", "b"], rank=4, alpha=8)
    _randomize(m, "a", 1)
    _randomize(m, "b", 2)
    prompts = [tok.encode(t) for t in TEXTS]
    reqs = [Request(p, a, SamplingParams(max_new_tokens=8, temperature=1.0, seed=i, stop_token_ids=[]))
            for i, (p, a) in enumerate(zip(prompts, ["a", "b", None, "a"]))]
    reqs.append(Request(prompts[1], "b", SamplingParams(max_new_tokens=8, greedy=True, stop_token_ids=[])))
    static = TorchEngine(m, tok, compile=True, _capture=False)
    _assert_same(static.generate(reqs), TorchEngine(m, tok).generate(reqs))
    lin = [m.model.layers[0].self_attn.k_proj, m.model.layers[0].self_attn.v_proj]
    assert static._qkv[0][1].shape[0] == m.config.num_attention_heads * m.model.layers[0].self_attn.head_dim + sum(
        x.out_features for x in lin)


def test_compile_needs_cuda(setup):
    m, tok, _ = setup
    with pytest.raises(ValueError, match="CUDA"):
        TorchEngine(m, tok, compile=True)
    with pytest.raises(ValueError, match="sync_every"):
        TorchEngine(m, tok, sync_every=0)


# ---------------------------------------------------------------------------------- driver


class CountEnv:
    """Two roles alternate; the episode lasts `task` model turns. Reward = length of each reply."""

    def reset(self, task):
        self.n, self.replies = task, []
        return self._turn()

    def _turn(self):
        if len(self.replies) >= self.n:
            return None
        role = "asker" if len(self.replies) % 2 == 0 else "answerer"
        msgs = [{"role": "user", "content": "count"}] + [{"role": "assistant", "content": r} for r in self.replies]
        return Prompt(role, msgs)

    def step(self, reply):
        self.replies.append(reply)
        return self._turn()

    def turn_rewards(self):
        return [float(len(r)) for r in self.replies]

    def metrics(self):
        return {"turns": len(self.replies)}


def test_driver_batches_all_roles_per_round(setup):
    m, tok, _ = setup
    eng = CountingEngine(TorchEngine(m, tok))
    roles = {"asker": RoleSpec("a", SamplingParams(max_new_tokens=4, stop_token_ids=[], seed=0)),
             "answerer": RoleSpec("b", SamplingParams(max_new_tokens=3, stop_token_ids=[], seed=0))}
    steps, eps = run_episodes(eng, tok, CountEnv, tasks=[1, 3, 5], roles=roles, num_chains=2, max_turns=4)
    assert len(eps) == 6 and [e.task_id for e in eps] == [0, 0, 1, 1, 2, 2]
    # round 1: all 6 episodes (asker); round 2: 4 left (answerer); round 3: 4 (asker); round 4: 2 (answerer)
    assert eng.calls == [["a"] * 6, ["b"] * 4, ["a"] * 4, ["b"] * 2]
    assert [len(e.samples) for e in eps] == [1, 1, 3, 3, 4, 4]
    assert [e.truncated for e in eps] == [False, False, False, False, True, True]  # 5 turns > max_turns
    for s in steps:
        assert s.reward == len(s.text)
        assert len(s.completion_ids) == len(s.logprobs) <= (4 if s.role == "asker" else 3)
        assert s.role == ("asker" if s.turn % 2 == 0 else "answerer")
        assert s.key == s.turn // 2  # no Prompt.key: the role's own turn count (what algo.group_by_turn compares)
    # chains of one task differ (distinct seeds per episode), and the run is reproducible
    assert eps[2].samples[0].completion_ids != eps[3].samples[0].completion_ids
    steps2, _ = run_episodes(eng, tok, CountEnv, tasks=[1, 3, 5], roles=roles, num_chains=2, max_turns=4)
    assert [s.completion_ids for s in steps] == [s.completion_ids for s in steps2]


class KeyedEnv(CountEnv):
    def _turn(self):
        t = super()._turn()
        return t and Prompt(t.role, t.messages, key=("place", len(self.replies) % 3))


def test_driver_keeps_the_envs_turn_key(setup):
    m, tok, _ = setup
    roles = {r: RoleSpec("a", SamplingParams(max_new_tokens=2, stop_token_ids=[], seed=0)) for r in ("asker", "answerer")}
    steps, _ = run_episodes(TorchEngine(m, tok), tok, KeyedEnv, tasks=[5], roles=roles, max_turns=5)
    assert [s.key for s in steps] == [("place", t % 3) for t in range(5)]


def test_driver_mixed_roles_in_one_call_and_overflow(setup):
    m, tok, _ = setup
    eng = CountingEngine(TorchEngine(m, tok))
    roles = {"asker": RoleSpec("a", SamplingParams(max_new_tokens=2, stop_token_ids=[])),
             "answerer": RoleSpec(None, SamplingParams(max_new_tokens=2, stop_token_ids=[]))}

    class Offset(CountEnv):  # odd tasks start with the answerer, so rounds mix roles
        def reset(self, task):
            self.skip = task % 2
            self.n, self.replies = task, [""] * self.skip
            return self._turn()

        def turn_rewards(self):
            return [float(len(r)) for r in self.replies[self.skip:]]

    steps, eps = run_episodes(eng, tok, Offset, tasks=[2, 3], roles=roles, max_turns=2)
    assert eng.calls[0] == ["a", None]  # both roles in ONE call
    with pytest.raises(KeyError, match="role"):
        run_episodes(eng, tok, CountEnv, tasks=[2], roles={"asker": roles["asker"]})
    _, eps = run_episodes(eng, tok, CountEnv, tasks=[2], roles=roles, max_model_len=5)
    assert eps[0].truncated and eps[0].samples == []


def test_driver_progress_shows_tokens_and_an_eta_inside_a_call(setup, capsys):
    """Episodes of a batched call finish together, so the episode count alone sits at 0 until the end:
    the bar also shows the decode step of the running call, an ETA and the turns and tokens done."""
    m, tok, _ = setup
    roles = {"asker": RoleSpec("a", SamplingParams(max_new_tokens=6, stop_token_ids=[], seed=0)),
             "answerer": RoleSpec("b", SamplingParams(max_new_tokens=6, stop_token_ids=[], seed=0))}
    run_episodes(TorchEngine(m, tok), tok, CountEnv, tasks=[3], roles=roles, num_chains=2, max_turns=4, progress=True)
    err = capsys.readouterr().err.replace("\r", "\n")
    assert "round 1: 2 turns, token 3/6, ETA" in err and "round 2: 2 turns, token 6/6" in err
    assert "| 2 turns, 12 tokens done" in err  # after round 1: 2 turns of 6 tokens
