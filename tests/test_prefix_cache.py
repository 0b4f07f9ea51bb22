"""TorchEngine's prefix cache: a request whose prompt extends a finished row's prompt +
completion under the same adapter restores that KV and prefills only the rest. Every test compares
with an engine that has no cache (prefix_cache_tokens=0): same tokens, logprobs to 1e-5, and counts
(never times) show that the cache did its work."""
import pytest
import torch

import lora
import session
from config import ConfigError
from engines import PrefixCache
from rollout import Request, SamplingParams, TorchEngine
from test_rollout import _randomize, setup  # noqa: F401 (fixture)
from test_train import tiny_cfg

NEW_TEXT = [" Observation: 42.", " Then?", " Tool says: error in line 3, try again", " ok"]


def _assert_same(a, b, atol=1e-5):
    assert [(r.completion_ids, r.finish_reason, r.stop_reason) for r in a] == \
           [(r.completion_ids, r.finish_reason, r.stop_reason) for r in b]
    for x, y in zip(a, b):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=atol)


def _conversation(engines, tok, prompts, adapters, sps, rounds):
    """Multi-round conversations, each engine on its own: round r+1's prompt = round r's prompt + the
    reply + some new text. Every engine must give the same replies (asserted), so the prompts agree."""
    prompts = [list(p) for p in prompts]
    for r in range(rounds):
        outs = [e.generate([Request(p, a, s) for p, a, s in zip(prompts, adapters, sps)]) for e in engines]
        for o in outs[1:]:
            _assert_same(o, outs[0])
        prompts = [p + x.completion_ids + tok.encode(NEW_TEXT[(i + r) % len(NEW_TEXT)])
                   for i, (p, x) in enumerate(zip(prompts, outs[0]))]
    return prompts


def _sps(n=10):
    return [SamplingParams(max_new_tokens=n, greedy=True, stop_token_ids=[]),
            SamplingParams(max_new_tokens=n - 3, seed=7, stop_token_ids=[]),
            SamplingParams(max_new_tokens=n, seed=8, top_k=20, top_p=0.9, temperature=0.8),
            SamplingParams(max_new_tokens=n + 2, seed=9, stop_token_ids=[])]


@pytest.mark.parametrize("sync_every", [1, 4])
def test_multi_round_mixed_adapters_equal_uncached_and_prefill_less(setup, sync_every):
    """Ragged prompts, mixed adapters (and the base), greedy and seeded sampling (top-k/top-p), rows of
    different lengths: four rounds give the uncached engine's tokens and logprobs, and the cached
    engine forwards well under half the prompt tokens (each round re-sends the whole history)."""
    m, tok, prompts = setup
    plain = TorchEngine(m, tok, prefix_cache_tokens=0, sync_every=sync_every)
    cached = TorchEngine(m, tok, sync_every=sync_every)
    system = tok.encode("You are a careful agent. Think, call a tool, read what it says, answer. ")
    _conversation([plain, cached], tok, [system + p for p in prompts], ["a", "b", None, "a"], _sps(), rounds=4)
    assert plain.cached_tokens == 0 and not plain.prefix.entries
    assert cached.prefilled_tokens + cached.cached_tokens == plain.prefilled_tokens
    assert cached.prefilled_tokens < 0.5 * plain.prefilled_tokens, (cached.prefilled_tokens, plain.prefilled_tokens)


def test_stop_ids_and_strings_cut_what_is_cached(setup):
    """A row that stopped early (a stop id, a stop string) keeps only the tokens it returned: the next
    round extends its real reply, and still equals the uncached engine."""
    m, tok, prompts = setup
    free = TorchEngine(m, tok).generate([Request(prompts[0], "a", SamplingParams(max_new_tokens=12, greedy=True,
                                                                                 stop_token_ids=[]))])[0]
    sps = [SamplingParams(max_new_tokens=12, greedy=True, stop_token_ids=[free.completion_ids[4]]),
           SamplingParams(max_new_tokens=12, seed=3, stop=["e"], stop_token_ids=[]),
           SamplingParams(max_new_tokens=12, greedy=True, stop_token_ids=[]),
           SamplingParams(max_new_tokens=12, seed=4, stop_token_ids=[])]
    plain, cached = TorchEngine(m, tok, prefix_cache_tokens=0), TorchEngine(m, tok, sync_every=3)
    _conversation([plain, cached], tok, prompts, ["a", "b", "a", None], sps, rounds=3)
    assert cached.cached_tokens > 0


def test_a_prefix_shared_by_two_requests_and_a_miss_in_one_batch(setup):
    """After one row X + Y, a batch of: X + Z (shares X only), X + Y + reply + W (extends the row) and a
    prompt never seen: rows are prefilled in windows of similar uncached suffix, and the two hits
    restore the rest of their prompts. X + Z under another adapter is a miss (adapters never share KV)."""
    m, tok, prompts = setup
    X = prompts[2] + tok.encode(" and a long shared system prompt that every request starts with, twice over")
    Y, Z, W = tok.encode(" first question"), tok.encode(" second"), tok.encode(" follow-up")
    sp = SamplingParams(max_new_tokens=8, seed=5, stop_token_ids=[])
    plain, cached = TorchEngine(m, tok, prefix_cache_tokens=0), TorchEngine(m, tok)
    first = cached.generate([Request(X + Y, "a", sp)])[0]
    _assert_same([first], plain.generate([Request(X + Y, "a", sp)]))
    batch = [Request(X + Z, "a", sp), Request(X + Y + first.completion_ids + W, "a", sp), Request(prompts[0], "a", sp)]
    n = [cached.prefix.lookup("a", r.prompt_ids, len(r.prompt_ids) - 1)[1] for r in batch]
    assert n[0] >= len(X) and n[1] == len(X + Y + first.completion_ids) - 1 and n[2] == 0
    assert cached.prefix.lookup("b", X + Z, len(X + Z) - 1) == (None, 0)
    need = [len(r.prompt_ids) - k for r, k in zip(batch, n)]
    groups = TorchEngine._prefill_groups(need)  # the miss's short prompt does not set the hits' window
    assert len(groups) == 2 and groups[0][1] == max(need)
    window = {i: q for rows, q in groups for i in rows}
    before = cached.cached_tokens
    _assert_same(cached.generate(batch), plain.generate(batch))
    assert cached.cached_tokens - before == sum(len(r.prompt_ids) - window[i] for i, r in enumerate(batch[:2]))
    both = batch + [Request(X + Z, "b", sp)]
    _assert_same(cached.generate(both), plain.generate(both))


def test_eviction_in_the_middle_keeps_results_exact(setup):
    """A budget that holds about one conversation: entries are evicted (least recently used first)
    while the rounds go on; every round still equals the uncached engine, the budget is never
    exceeded, and evicted conversations simply miss."""
    m, tok, prompts = setup
    budget = 60
    plain, cached = TorchEngine(m, tok, prefix_cache_tokens=0), TorchEngine(m, tok, prefix_cache_tokens=budget)
    sizes = []
    real_put = cached.prefix.put

    def put(*a, **k):
        real_put(*a, **k)
        sizes.append(cached.prefix.tokens)
    cached.prefix.put = put
    long_ = [p + tok.encode(" padding the prompt so that two rows do not fit") for p in prompts]
    _conversation([plain, cached], tok, long_, ["a", "a", "b", "b"], _sps(), rounds=3)
    assert max(sizes) <= budget and len(cached.prefix.entries) < 4
    assert 0 < cached.cached_tokens < 0.5 * plain.prefilled_tokens  # some hits, many misses


def test_prefix_cache_lru_and_index():
    """The cache alone: longest prefix across blocks and past the last whole block, LRU eviction
    (a hit refreshes an entry), an entry replaced by the one that extends it, the index emptied."""
    c = PrefixCache(max_tokens=100)
    kv = torch.zeros(1, 2, 1, 40, 1)
    a, b = list(range(40)), list(range(20)) + [99] * 20
    c.put("x", a, kv)
    c.put("x", b, kv)
    assert c.lookup("x", a + [5, 6], 41)[1] == 40 and c.lookup("y", a, 39) == (None, 0)
    assert c.lookup("x", b[:25] + [7], 25)[1] == 25  # a prefix of an entry, past its 1st block
    assert c.lookup("x", [1] + a, 40) == (None, 0)
    e, n = c.lookup("x", b, 39)
    assert n == 39 and e.ids == b
    c.lookup("x", a, 39)  # a is now the most recently used
    c.put("x", list(range(100, 130)), kv[:, :, :, :30])  # 110 tokens > 100: b goes, not a
    assert c.lookup("x", b, 39)[1] == 20 and c.tokens == 70  # only the shared 20 tokens of a remain
    e, _ = c.lookup("x", a, 39)
    c.put("x", a + [1, 2, 3], kv, replaces=e)
    assert len(c.entries) == 2 and c.tokens == 73
    c.clear()
    assert not c.entries and not c.index and c.tokens == 0


def _train_step(m, name):
    """One real optimizer step on adapter `name` (AdamW, in place)."""
    opt = torch.optim.AdamW(lora.adapter_parameters(m, name), lr=0.05)
    lora.set_adapter(m, name)
    m(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.square().mean().backward()
    opt.step()
    lora.set_adapter(m, None)


def test_no_hit_across_a_weight_update(setup):
    """An optimizer step (in place: the parameters' version counters move) clears the cache with no
    sync; an update behind autograd's back (`.data`) is caught by sync(), which the trainer calls
    after every update. Either way the next round equals a fresh uncached engine's, with no hit."""
    m, tok, prompts = setup
    sp = [SamplingParams(max_new_tokens=8, seed=i, stop_token_ids=[]) for i in range(4)]
    cached = TorchEngine(m, tok)
    reqs = [Request(p, "a", s) for p, s in zip(prompts, sp)]
    nxt = [Request(p + r.completion_ids + tok.encode(" next"), "a", s)
           for p, r, s in zip(prompts, cached.generate(reqs), sp)]
    _train_step(m, "a")
    hits = cached.cached_tokens
    _assert_same(cached.generate(nxt), TorchEngine(m, tok, prefix_cache_tokens=0).generate(nxt))
    assert cached.cached_tokens == hits
    # through .data: invisible to the version counters, so only sync() clears the cache
    cached.generate(nxt)
    with torch.no_grad():
        for p in lora.adapter_parameters(m, "a"):
            p.data.mul_(1.5)
    cached.sync()
    hits = cached.cached_tokens
    _assert_same(cached.generate(nxt), TorchEngine(m, tok, prefix_cache_tokens=0).generate(nxt))
    assert cached.cached_tokens == hits
    cached.generate(nxt)  # the same weights: now it hits (the test above has teeth)
    assert cached.cached_tokens > hits


def test_static_path_does_not_use_the_cache(setup):
    m, tok, prompts = setup
    static = TorchEngine(m, tok, compile=True, _capture=False)
    eager = TorchEngine(m, tok)
    _conversation([static, eager], tok, prompts, ["a", None, "b", "a"], _sps(), rounds=2)
    assert static.cached_tokens == 0 and not static.prefix.entries and eager.cached_tokens > 0
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        TorchEngine(m, tok, prefix_cache_tokens=-1)


def test_config_field_reaches_the_engine(tmp_path):
    cfg = tiny_cfg(tmp_path, rollout=dict(prefix_cache_tokens=123))
    run, _ = session.build(cfg, None)
    assert run.engine.prefix.max_tokens == 123
    bad = tiny_cfg(tmp_path, rollout=dict(prefix_cache_tokens=-1))
    with pytest.raises(ConfigError, match=r"rollout\.prefix_cache_tokens"):
        bad.validate()


def test_rollout_fuse_reaches_the_engine_and_needs_compile(tmp_path, monkeypatch):
    """rollout.fuse reaches TorchEngine(fuse=True) beside compile=True (built here with the capture test hook
    off, since this machine may have no CUDA); without rollout.compile it is a config error naming the field."""
    import functools

    monkeypatch.setattr(session, "TorchEngine", functools.partial(TorchEngine, _capture=False))
    run, _ = session.build(tiny_cfg(tmp_path, rollout=dict(compile=True, fuse=True)), None)
    assert run.engine.compile and run.engine.fuse and run.engine._step_fn != run.engine._step_body
    run, _ = session.build(tiny_cfg(tmp_path / "off", rollout=dict(compile=True)), None)
    assert not run.engine.fuse and run.engine._step_fn == run.engine._step_body
    with pytest.raises(ConfigError, match=r"config field rollout\.fuse: .*needs rollout\.compile"):
        tiny_cfg(tmp_path, rollout=dict(fuse=True)).validate()
