"""The RL core's options do what they say: KL in the reward reaches every estimator, Dr. GRPO's
constant normaliser, ratio 1 on policy, DAPO's filter, ReMax's per-turn greedy baseline, GSPO's
defaults, merge_turns across roles, loud empty steps, the logged metrics, and learning itself."""
import dataclasses
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import learner
import lora
import ppo
import train
from config import AlgoConfig, Config, ConfigError, load_config_file
from critic import Critic
from envs import Prompt, toy
from rollout import (
    RoleSpec,
    Sample,
    SamplingParams,
    TorchEngine,
    merge_turns,
    run_episodes,
)

ROOT = Path(__file__).resolve().parent.parent
TOY = str(ROOT / "configs" / "tiny_toy.py")


def toy_cfg(tmp_path, **over) -> Config:
    cfg = load_config_file(TOY)
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=str(tmp_path / "run"),
                                                                resume="none"))
    for section, kw in over.items():
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **kw)})
    return cfg


def rows(path):
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln]


def role_batch(tok, n=6, seed=0):
    """n turns of one role with ragged prompts and completions, rewards 0/1 in groups of 3."""
    g = torch.Generator().manual_seed(seed)
    steps = []
    for i in range(n):
        P, C = 3 + 4 * (i % 3), 2 + (5 * i) % 7
        p = torch.randint(5, 900, (P,), generator=g).tolist()
        c = torch.randint(5, 900, (C,), generator=g).tolist()
        steps.append(Sample(i, i // 3, "r", 0, p, c, [-2.0] * C, reward=float(i % 2)))
    return learner.AdapterBatch(steps, [1.0] * n, tok.pad_token_id, norm_len=16)


# --------------------------------------------------------------------------------------------
# 1. KL in the reward reaches every estimator, and the loss gets no second KL term


@pytest.mark.parametrize("estimator", sorted(ppo.ADVANTAGES))
def test_kl_in_reward_changes_every_estimator(tiny, estimator):
    _, tok = tiny
    rb = role_batch(tok)
    for s in rb.samples:
        s.baseline = 0.5
    cfg = Config(algo=AlgoConfig(adv_estimator=estimator, kl_coef=1.0, kl_in_reward=True))
    kl_tok = torch.rand(rb.mask.shape, generator=torch.Generator().manual_seed(1)) * rb.mask
    values = torch.rand(rb.mask.shape, generator=torch.Generator().manual_seed(2)) * rb.mask
    adv0, _ = learner.advantages(cfg, rb, kl_tok, values, kl_coef=0.0)
    adv1, _ = learner.advantages(cfg, rb, kl_tok, values, kl_coef=1.0)
    assert not torch.allclose(adv0, adv1), f"{estimator} never saw the KL in the reward"
    assert torch.all(adv1[rb.mask == 0] == 0)


def test_kl_in_reward_adds_no_kl_to_the_loss(tiny):
    m, tok = tiny
    lora.add_lora(m, ["r"], rank=4, alpha=8)
    rb = role_batch(tok)
    adv = torch.randn(rb.mask.shape, generator=torch.Generator().manual_seed(0)) * rb.mask
    ref = rb.sample_logp - 0.3  # a large KL, were it used
    finals = []
    for kl_coef in (0.0, 1.0):
        mm = __import__("copy").deepcopy(m)
        params = lora.adapter_parameters(mm, "r")
        with torch.no_grad():
            for p in params:
                p.add_(0.01)
        opt = torch.optim.SGD(params, lr=0.1)
        cfg = Config(algo=AlgoConfig(kl_coef=1.0, kl_in_reward=True, micro_batch_size=2))
        out = learner.policy_update(mm, [learner.AdapterUpdate("r", rb, adv, rb.sample_logp, ref, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), torch.Generator().manual_seed(0))], cfg, torch.device("cpu"), kl_coef)["r"]
        assert "kl_loss" not in out
        finals.append([p.detach().clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*finals))


# --------------------------------------------------------------------------------------------
# 2. Dr. GRPO divides by a constant: micro-batching and padding do not change the gradient
# 3. the ratio is exactly 1 on the first mini-batch, whatever the dropout


@pytest.mark.parametrize("agg", ["seq-mean-token-sum-norm", "token-mean", "seq-mean-token-mean"])
def test_update_independent_of_micro_batch_size(tiny, agg):
    m, tok = tiny
    lora.add_lora(m, ["r"], rank=4, alpha=8)
    with torch.no_grad():
        for p in lora.adapter_parameters(m, "r"):
            p.add_(0.01)
    rb = role_batch(tok)
    adv = torch.randn(rb.mask.shape, generator=torch.Generator().manual_seed(0)) * rb.mask
    grads = []
    for micro in (1, 2, 3, 6):
        mm = __import__("copy").deepcopy(m)
        params = lora.adapter_parameters(mm, "r")
        opt = torch.optim.SGD(params, lr=1.0)
        cfg = Config(algo=AlgoConfig(loss_agg=agg, micro_batch_size=micro, mini_batch_size=6, grad_clip=1e9))
        learner.policy_update(mm, [learner.AdapterUpdate("r", rb, adv, rb.sample_logp, None, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), torch.Generator().manual_seed(0))], cfg, torch.device("cpu"), 0.0)["r"]
        grads.append(torch.cat([p.detach().flatten() for p in params]))
    for g in grads[1:]:
        torch.testing.assert_close(g, grads[0], rtol=1e-5, atol=1e-6)
    # padding: the same rows behind a much longer prompt row (wider batch, more pad) give the same loss
    long = Sample(99, 9, "r", 0, list(range(5, 60)), [7, 8], [-2.0, -2.0], reward=0.0)
    rb2 = learner.AdapterBatch(rb.samples + [long], [1.0] * 7, tok.pad_token_id, norm_len=16)
    adv2 = torch.zeros_like(rb2.mask)
    adv2[:6, :adv.shape[1]] = adv
    rb2.mask[6] = 0  # the long row carries no loss: only the padding changed
    lp = ppo.agg_loss(adv, rb.mask, agg, None, 16), ppo.agg_loss(adv2, rb2.mask, agg, None, 16)
    torch.testing.assert_close(lp[0], lp[1])


@pytest.mark.parametrize("algo", [
    dict(), dict(ppo_epochs=2, mini_batch_size=2, micro_batch_size=2), dict(kl_coef=0.5, kl_kind="low_var_kl"),
    dict(kl_coef=0.5, kl_kind="full", micro_batch_size=4), dict(entropy_coef=0.01, loss_agg="seq-mean-token-sum-norm"),
    dict(policy_loss="gspo", micro_batch_size=3)])
def test_fused_update_equals_updating_adapters_one_by_one(tiny, algo):
    """Three adapters' rows in shared forwards give each adapter the weights (and metrics) it gets
    alone; a fourth adapter, not updated (and adapter a's KL reference: algo.kl_ref init), and the base stay
    bit-exact."""
    m, tok = tiny
    lora.add_lora(m, ["a", "b", "c", "frozen"], rank=4, alpha=8)
    with torch.no_grad():
        for n in ("a", "b", "c", "frozen"):
            for p in lora.adapter_parameters(m, n):
                p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))))
    data = []
    for j, name in enumerate("abc"):  # ragged batches of different sizes: different mini-batch counts
        rb = role_batch(tok, n=5 + j, seed=j)
        adv = torch.randn(rb.mask.shape, generator=torch.Generator().manual_seed(10 + j)) * rb.mask
        data.append((name, rb, adv, rb.sample_logp - 0.1 * (j + 1)))
    cfg = Config(algo=AlgoConfig(**{"micro_batch_size": 4, "mini_batch_size": 64, **algo}))
    base = {k: v.detach().clone() for k, v in m.named_parameters() if ".lora_" not in k}
    frozen = [p.detach().clone() for p in lora.adapter_parameters(m, "frozen")]
    results = []
    for fused in (True, False):
        mm = __import__("copy").deepcopy(m)
        parts = []
        for j, (name, rb, adv, ref) in enumerate(data):
            # SGD: weights move by exactly the gradient (Adam's first step, g / |g|, would blow float noise
            # in near-zero gradients up to lr)
            opt = torch.optim.SGD(lora.adapter_parameters(mm, name), lr=1.0)
            parts.append(learner.AdapterUpdate(name, rb, adv, rb.sample_logp, ref, opt, torch.optim.lr_scheduler.LambdaLR(
                opt, lambda s: 1.0), torch.Generator().manual_seed(100 + j), ref="frozen" if name == "a" else None))
        groups = [parts] if fused else [[p] for p in parts]
        metrics = {k: v for g in groups for k, v in learner.policy_update(mm, g, cfg, torch.device("cpu"), 0.5).items()}
        results.append((mm, metrics))
    (fm, fmet), (sm, smet) = results
    for name in "abc":
        for x, y, before in zip(lora.adapter_parameters(fm, name), lora.adapter_parameters(sm, name),
                                lora.adapter_parameters(m, name)):
            assert not torch.equal(x, before)  # it was updated
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
        for k, v in smet[name].items():
            assert fmet[name][k] == pytest.approx(v, rel=1e-4, abs=1e-6), (name, k)
    assert all(torch.equal(a, b) for a, b in zip(frozen, lora.adapter_parameters(fm, "frozen")))
    assert all(torch.equal(base[k], v) for k, v in fm.named_parameters() if ".lora_" not in k)




@pytest.mark.parametrize("algo, checkpointing", [
    (dict(), False), (dict(), True), (dict(entropy_coef=0.05), False), (dict(kl_coef=0.5, kl_kind="low_var_kl+"), False),
    (dict(policy_loss="gspo", ppo_epochs=2, mini_batch_size=3, micro_batch_size=2), False)])
def test_the_chunked_head_gives_the_update_whole_logits_give(tiny, algo, checkpointing):
    """algo.logits_chunk_tokens: the vocabulary projection run 5 tokens at a time (recomputed in backward) gives the
    logprobs, entropies, metrics and updated weights the whole (b, T, V) logits give (0), for a fused update of two
    adapters at temperatures 1 and 0.7, with and without gradient checkpointing (math_3agent's); and the old
    logprobs (learner.score) too."""
    m, tok = tiny
    if checkpointing:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora.add_lora(m, ["a", "b", "ref"], rank=4, alpha=8)
    with torch.no_grad():
        for p in lora.adapter_parameters(m, "a") + lora.adapter_parameters(m, "b"):
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    out = []
    for chunk in (5, 0):
        mm = __import__("copy").deepcopy(m)
        parts = two_adapter_parts(mm, tok, ref="ref")
        parts[1].batch.temps[:] = 0.7
        cfg = Config(algo=AlgoConfig(**{"micro_batch_size": 4, "mini_batch_size": 64, "logits_chunk_tokens": chunk, **algo}))
        assert (learner.head_weight(mm, cfg) is None) == (chunk == 0)
        old = learner.score(mm, parts[1].batch, "b", cfg, torch.device("cpu"))
        metrics = learner.policy_update(mm, parts, cfg, torch.device("cpu"), 0.5)
        out.append((old, metrics, [torch.cat([p.detach().flatten() for p in lora.adapter_parameters(mm, x)]) for x in "ab"]))
    (old5, met5, w5), (old0, met0, w0) = out
    torch.testing.assert_close(old5, old0, rtol=1e-5, atol=1e-5)
    for x, y, before in zip(w5, w0, ("a", "b")):
        assert not torch.equal(x, torch.cat([p.detach().flatten() for p in lora.adapter_parameters(m, before)]))
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)
    for name in "ab":
        assert met5[name].keys() == met0[name].keys()
        for k, v in met0[name].items():
            assert met5[name][k] == pytest.approx(v, rel=1e-4, abs=1e-6), (name, k)


def test_the_chunked_head_is_used_only_where_logits_are_the_heads_product_of_the_final_norm():
    """A Llama-family model (here a tied Llama, SmolLM2's kind) takes the chunked head and scores what whole logits
    score; Gemma2 (a softcap after the head), Phi (its final norm is not `norm`, the head has a bias) keep whole
    logits, or their logprobs would be wrong (Gemma2 by up to ~3 nats at its real softcap, as a review measured)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM, PhiConfig, PhiForCausalLM

    small = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(0)
    models = {"llama": LlamaForCausalLM(LlamaConfig(**small, tie_word_embeddings=True)),
              "gemma2": Gemma2ForCausalLM(Gemma2Config(**small, head_dim=8, final_logit_softcapping=0.3)),
              "phi": PhiForCausalLM(PhiConfig(**small))}
    cfg = Config()
    samples = [Sample(0, 0, "r", 0, [1, 2, 3], [4, 5, 6, 7], [-1.0] * 4, reward=1.0),
               Sample(1, 0, "r", 0, [1, 2], [9, 8, 7], [-1.0] * 3, reward=0.0)]
    batch = learner.AdapterBatch(samples, [0.8, 1.0], 0, 8)
    for name, m in models.items():
        m.eval()
        assert (learner.head_weight(m, cfg) is not None) == (name == "llama"), name
        got = learner.score(m, batch, None, cfg, torch.device("cpu"))
        whole = learner.score(m, batch, None, dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, logits_chunk_tokens=0)),
                              torch.device("cpu"))
        torch.testing.assert_close(got, whole, rtol=1e-5, atol=1e-5)
        assert (got * batch.mask).abs().sum() > 0


def test_the_chunked_head_never_holds_a_micro_batchs_whole_logits(tiny):
    """What algo.logits_chunk_tokens is for, counted: during a fused update no tensor with a vocabulary-sized last
    dimension has more rows than the chunk (or the micro-batch's rows, for the one column the model still projects);
    with whole logits (0) some tensor holds every token of the micro-batch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Widest(TorchDispatchMode):
        def __init__(self, vocab):
            super().__init__()
            self.vocab, self.rows = vocab, 0

        SHAPES = {"t", "transpose", "expand", "view", "_unsafe_view", "permute", "slice", "select", "unsqueeze",
                  "squeeze", "as_strided", "detach", "alias"}  # W.t(), the attention mask's expand: no new numbers

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab and \
                        func.overloadpacket.__name__ not in self.SHAPES:
                    self.rows = max(self.rows, t.numel() // self.vocab)
            return out

    m, tok = tiny
    lora.add_lora(m, ["a", "b"], rank=4, alpha=8)
    vocab = m.lm_head.weight.shape[0]
    rows = {}
    for chunk in (4, 0):
        mm = __import__("copy").deepcopy(m)
        parts = two_adapter_parts(mm, tok)
        cfg = Config(algo=AlgoConfig(micro_batch_size=6, mini_batch_size=64, logits_chunk_tokens=chunk, entropy_coef=0.01))
        with Widest(vocab) as w:
            learner.policy_update(mm, parts, cfg, torch.device("cpu"), 0.0)
        rows[chunk] = w.rows
        tokens = max(len(s.prompt_ids) + len(s.completion_ids) for p in parts for s in p.batch.samples)
    assert rows[4] <= 6, rows  # a chunk of 4 tokens, or the 6 rows' one projected column
    assert rows[0] >= 6 * (tokens - max(len(s.prompt_ids) for p in parts for s in p.batch.samples)), rows


def test_micro_batches_by_token_budget():
    """algo.micro_batch_tokens: a micro-batch holds at most that many padded tokens (rows x its longest row),
    short rows many to a micro-batch, long ones few, a row over the budget alone; the update is the one
    micro-batches of rows give (the loss normalisers are global)."""
    from collectives import lockstep_chunks
    lengths = [10, 9, 5, 5, 2, 2]
    chunks = [c for c, _ in lockstep_chunks(list("abcdef"), 8, lengths=lengths, max_tokens=18)]
    assert chunks == [["a"], ["b", "c"], ["d", "e", "f"]]  # 10 | 2 x 9 = 18 | 3 x 5 = 15 (a 4th row: 20)
    assert [c for c, _ in lockstep_chunks(list("abcdef"), 2, lengths=lengths, max_tokens=18)] == [["a"], ["b", "c"], ["d", "e"], ["f"]]
    assert [c for c, _ in lockstep_chunks(list("abcdef"), 8, lengths=lengths, max_tokens=5)] == [[x] for x in "abcd"] + [["e", "f"]]
    assert [c for c, _ in lockstep_chunks(list("abcdef"), 8, lengths=lengths)] == [list("abcdef")]  # no budget: rows only
    with pytest.raises(ConfigError, match="algo.micro_batch_tokens"):
        Config(algo=AlgoConfig(micro_batch_tokens=0)).validate()


def test_update_with_a_token_budget_equals_the_update_by_rows(tiny):
    m, tok = tiny
    lora.add_lora(m, ["r"], rank=4, alpha=8)
    rb = role_batch(tok, n=9)
    adv = torch.randn(rb.mask.shape, generator=torch.Generator().manual_seed(0)) * rb.mask
    widths, weights = [], []
    hook = m.register_forward_hook(lambda mod, args, kw, out: widths[-1].append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    for budget in (None, 40):
        widths.append([])
        mm = m  # the hook sits on m: reset its adapter instead of copying it
        with torch.no_grad():
            for i, p in enumerate(lora.adapter_parameters(mm, "r")):
                p.copy_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
        opt = torch.optim.SGD(lora.adapter_parameters(mm, "r"), lr=1.0)
        cfg = Config(algo=AlgoConfig(micro_batch_size=9, mini_batch_size=9, micro_batch_tokens=budget, grad_clip=1e9))
        learner.policy_update(mm, [learner.AdapterUpdate("r", rb, adv, rb.sample_logp, None, opt,
                                                         torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                                                         torch.Generator().manual_seed(0))], cfg, torch.device("cpu"), 0.0)
        weights.append(torch.cat([p.detach().flatten() for p in lora.adapter_parameters(mm, "r")]))
    hook.remove()
    assert widths[0] == [(9, max(rb.rows_len))]  # rows only: one forward of all nine
    assert len(widths[1]) > 1 and all(b * t <= 40 or b == 1 for b, t in widths[1]), widths[1]
    assert sum(b for b, _ in widths[1]) == 9
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-5, atol=1e-6)

class HostSyncs(TorchDispatchMode):
    """Counts the ops that make the host wait for the device on a GPU: reading a value back (.item(),
    float(), int(), bool() all dispatch aten._local_scalar_dense) and the ops whose output size depends on
    the values (nonzero, masked_select, unique, boolean indexing). On CPU the same ops are dispatched, so
    counting them here says what a GPU would wait for. (A device-to-host copy, .cpu() or .tolist() of a
    device tensor, is invisible on CPU: the learner reads its tensors back only in reduce_stats and per
    mini-batch, outside the loop counted here. So is a host-to-device copy from pageable memory, which the
    loop makes through collectives.to_device: test_the_update_moves_host_tensors_only_through_to_device.)"""
    SYNCS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "unique_consecutive", "is_nonzero"}

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.SYNCS or (name == "index" and any(t is not None and t.dtype == torch.bool for t in args[1])):
            self.n += 1
        return func(*args, **(kwargs or {}))


def test_host_sync_counter_counts_what_waits_for_the_device():
    x = torch.arange(6.0)
    with HostSyncs() as c:
        x.sum().item(), float(x.max()), bool(x.any()), x[x > 2], x.nonzero()
        x[[0, 1]] * 2, x.sum() / (x > 2).sum().clamp(min=1)  # index by positions, masked arithmetic: no wait
    assert c.n == 5


def two_adapter_parts(m, tok, ref=None) -> list:
    """A fused update's parts: adapters "a" and "b", 6 turns each, random advantages, reference logprobs."""
    parts = []
    for j, name in enumerate("ab"):
        rb = role_batch(tok, n=6, seed=j)
        adv = torch.randn(rb.mask.shape, generator=torch.Generator().manual_seed(10 + j)) * rb.mask
        opt = torch.optim.SGD(lora.adapter_parameters(m, name), lr=0.1)
        parts.append(learner.AdapterUpdate(name, rb, adv, rb.sample_logp, rb.sample_logp - 0.1, opt,
                                           torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                                           torch.Generator().manual_seed(j), ref=ref))
    return parts


@pytest.mark.parametrize("algo", [dict(), dict(kl_coef=0.5, kl_kind="low_var_kl", entropy_coef=0.01),
                                  dict(kl_coef=0.5, kl_kind="full", loss_agg="seq-mean-token-mean"),
                                  dict(policy_loss="gspo")])
def test_no_host_sync_inside_the_update_micro_batch_loop(tiny, algo):
    """The same fused update over two adapters (one mini-batch of 6 turns each) in 1 micro-batch or in 6:
    the same number of host syncs, so none happens per micro-batch. Before this, each micro-batch read its
    loss, its metrics and a finiteness flag back to the host (~12 syncs per adapter per micro-batch)."""
    m, tok = tiny
    lora.add_lora(m, ["a", "b", "ref"], rank=4, alpha=8)
    counts, weights = [], []
    for micro in (6, 1):
        mm = __import__("copy").deepcopy(m)
        parts = two_adapter_parts(mm, tok, ref="ref")
        cfg = Config(algo=AlgoConfig(**{"micro_batch_size": micro, "mini_batch_size": 6, **algo}))
        with HostSyncs() as c:
            out = learner.policy_update(mm, parts, cfg, torch.device("cpu"), 0.5)
        counts.append(c.n)
        weights.append(torch.cat([p.detach().flatten() for p in lora.adapter_parameters(mm, "a")]))
        assert set(out) == {"a", "b"} and all(math.isfinite(out[x]["pg_loss"]) for x in out)
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-4, atol=1e-6)  # the same update, chunked
    assert counts[0] == counts[1], f"host syncs: {counts[0]} in 1 micro-batch, {counts[1]} in 6"



def test_the_update_moves_host_tensors_only_through_to_device(tiny):
    """On a GPU `.to("cuda")` from pageable memory waits for every kernel queued before it; the update's
    micro-batch loop moves its host tensors (token ids, temperatures, masks, advantages, old and reference
    logprobs) with collectives.to_device instead (pinned, non-blocking). CPU cannot see that wait, so this counts
    what can be seen: every Tensor.to with a device made in learner.py while a fused update of two adapters runs
    (KL in the loss, so the reference logprobs move too) goes through to_device."""
    import inspect
    from torch.overrides import TorchFunctionMode

    import collectives

    class Moves(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.direct, self.helper = [], 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.to and (kwargs.get("device") is not None or any(
                    isinstance(a, (torch.device, str)) for a in args[1:])):
                caller = inspect.currentframe().f_back
                if caller.f_code is collectives.to_device.__code__:
                    self.helper += 1
                elif caller.f_code.co_filename.endswith("learner.py"):
                    self.direct.append(f"learner.py:{caller.f_lineno}")
            return func(*args, **kwargs)

    m, tok = tiny
    lora.add_lora(m, ["a", "b"], rank=4, alpha=8)
    parts = two_adapter_parts(m, tok)
    cfg = Config(algo=AlgoConfig(micro_batch_size=2, mini_batch_size=6, kl_coef=0.5, kl_kind="low_var_kl"))
    with Moves() as c:
        learner.policy_update(m, parts, cfg, torch.device("cpu"), 0.5)
    assert not c.direct, c.direct
    assert c.helper >= 6 * 4  # 6 micro-batches: ids and temperatures, and each adapter's mask, advantages, ...

def test_no_host_sync_inside_the_critic_micro_batch_loop(tiny):
    m, tok = tiny
    counts = []
    for micro in (6, 1):
        mm = __import__("copy").deepcopy(m)
        cfg = Config(algo=AlgoConfig(adv_estimator="gae", micro_batch_size=micro, mini_batch_size=6))
        critic = Critic(mm, cfg, torch.device("cpu"))
        critic.make_optimizer(mm)
        rb = role_batch(tok, n=6)
        returns = torch.rand(rb.mask.shape, generator=torch.Generator().manual_seed(3)) * rb.mask
        with HostSyncs() as c:
            out = critic.update(mm, rb, returns, torch.zeros_like(returns))
        counts.append(c.n)
        assert math.isfinite(out["vf_loss"]) and out["vf_loss"] > 0
    assert counts[0] == counts[1], f"host syncs: {counts[0]} in 1 micro-batch, {counts[1]} in 6"

def test_routed_rows_drop_out_only_for_adapters_that_have_dropout(tiny):
    """The fused update routes rows per adapter in training mode: the critic's dropout must not reach
    policy rows (it did: the routed path used the largest dropout of ANY adapter)."""
    m, tok = tiny
    lora.add_lora(m, ["a", "b"], rank=4, alpha=8)
    lora.add_lora(m, ["critic"], rank=4, alpha=8, dropout=0.5)
    for p in lora.adapter_parameters(m, "a") + lora.adapter_parameters(m, "b") + lora.adapter_parameters(m, "critic"):
        torch.nn.init.normal_(p, std=0.1)
    ids = torch.tensor([tok.encode("What is 1 + 1?")] * 2)
    m.train()
    lora.set_row_adapters(m, ["a", "b"])
    with torch.no_grad():
        assert torch.equal(m(input_ids=ids).logits, m(input_ids=ids).logits)  # no dropout for policy rows
        lora.set_row_adapters(m, ["a", "critic"])
        assert not torch.equal(m(input_ids=ids).logits, m(input_ids=ids).logits)  # the critic's row drops out
    lora.set_adapter(m, None)


def test_ratio_is_exactly_one_on_policy_with_lora_dropout(tmp_path):
    cfg = toy_cfg(tmp_path, lora=dict(dropout=0.05), trainer=dict(total_steps=2, save_freq=2),
                  algo=dict(recompute_old_logprobs="always", mini_batch_size=8, micro_batch_size=4))
    train.main(cfg)
    for r in rows(tmp_path / "run" / "metrics.jsonl"):
        assert r["train/ratio_max_first/speaker"] == 1.0  # was 1.107 with dropout in the update only
        assert r["train/ratio_max/speaker"] > 1.0  # later mini-batches are off-policy: the ratio moves
    conf = json.loads((tmp_path / "run/checkpoints/step_000002/adapters/speaker/adapter_config.json").read_text())
    assert conf["lora_dropout"] == 0.0  # policy adapters never drop out


def test_adaptive_kl_steps_once_per_sequence_of_the_step(tmp_path):
    """verl's n_steps is the number of sequences: on the 3-role team a step has more turns than
    episodes, and beta must move by the turns. Step 1 measures KL 0 (fresh adapters: err -0.2), step 2
    a positive KL far above the tiny target (err +0.2): beta_2 = beta_0 (1 - 0.2 n_1/H)(1 + 0.2 n_2/H)
    with n_s the turns in step s's trajectory file."""
    cfg = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    cfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, kl_coef=0.1, kl_in_reward=True, kl_adaptive=True,
                                                            kl_target=1e-9, kl_horizon=100),
                              data=dataclasses.replace(cfg.data, env_kwargs={"evaluator_mixed_groups_only": False}),  # train every turn
                              trainer=dataclasses.replace(cfg.trainer, output_dir=str(tmp_path / "run"), resume="none",
                                                          total_steps=2, save_freq=0, test_freq=0, val_before_train=False,
                                                          trajectory_sample=1.0))
    train.main(cfg)
    r = rows(tmp_path / "run" / "metrics.jsonl")
    n = [sum(len(e["turns"]) for e in rows(tmp_path / "run" / "trajectories" / f"train_step_00000{k}.jsonl")) for k in (1, 2)]
    assert min(n) > cfg.data.batch_size * cfg.rollout.num_chains  # more sequences than episodes
    assert r[0]["train/kl"] == 0 and r[1]["train/kl"] > 0
    assert r[0]["train/kl_coef"] == pytest.approx(0.1 * (1 - 0.2 * n[0] / 100))
    assert r[1]["train/kl_coef"] == pytest.approx(0.1 * (1 - 0.2 * n[0] / 100) * (1 + 0.2 * n[1] / 100))


def test_adaptive_kl_needs_the_kl_in_the_reward():
    with pytest.raises(ValueError, match="algo.kl_adaptive"):
        Config(algo=AlgoConfig(kl_coef=0.1, kl_adaptive=True)).validate()


def test_adapter_divergence_is_the_symmetrised_kl_between_adapters(tiny):
    from learner import adapter_divergence
    m, tok = tiny
    lora.add_lora(m, ["a", "b", "c"], rank=4, alpha=8)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for pa, pb in zip(lora.adapter_parameters(m, "a"), lora.adapter_parameters(m, "b")):
            pa.copy_(torch.randn(pa.shape, generator=g) * 0.1)
            pb.copy_(pa)  # b = a; c stays fresh (= the base)
    rb = role_batch(tok)
    d = adapter_divergence(m, rb, ["a", "b", "c", None], "cpu", micro_batch_size=4)
    assert set(d) == {"a~b", "a~c", "a~base", "b~c", "b~base", "c~base"}
    assert d["a~b"] == pytest.approx(0, abs=1e-6) and d["c~base"] == pytest.approx(0, abs=1e-6)
    assert d["a~base"] > 1e-3 and d["a~c"] == pytest.approx(d["a~base"], rel=1e-5)
    with torch.no_grad():  # by hand: both directions over every generated token
        ids, attn = rb.ids, rb.attn
        lora.set_adapter(m, "a")
        la = torch.log_softmax(m(input_ids=ids, attention_mask=attn).logits[:, :-1].float(), -1)
        lora.set_adapter(m, None)
        lb = torch.log_softmax(m(input_ids=ids, attention_mask=attn).logits[:, :-1].float(), -1)
    sym = 0.5 * ((la.exp() * (la - lb)).sum(-1) + (lb.exp() * (lb - la)).sum(-1))
    assert d["a~base"] == pytest.approx(float((sym * rb.mask).sum() / rb.mask.sum()), rel=1e-4)
    calls = []  # one adapter (eval.py --base): no pair, and no forward run for it
    hook = m.register_forward_hook(lambda *_: calls.append(1))
    assert adapter_divergence(m, rb, [None], "cpu") == {} and calls == []
    hook.remove()


# --------------------------------------------------------------------------------------------
# 4b. group_by_turn: a turn is centred among the same turn of its task's other chains


def test_group_by_turn_centres_each_turn_among_its_tasks_chains(tiny):
    """A researcher's reward falls with its sub-question's place (turn 1 easier than turn 4): grouped by (task,
    role) the later turn's advantage is negative whatever it did; grouped by (task, role, turn) it is centred
    among the other chains' turn 4, and only a real difference there gets a sign."""
    _, tok = tiny
    rewards = {(0, 1): 1.0, (0, 4): 0.5, (1, 1): 1.0, (1, 4): 0.5, (2, 1): 1.0, (2, 4): 0.0}  # (episode, turn)
    steps = [Sample(e, 7, "researcher", t, [5, 6, 7], [8, 9], [-1.0, -1.0], reward=r) for (e, t), r in rewards.items()]
    rb = learner.AdapterBatch(steps, list(rewards.values()), tok.pad_token_id, 16)
    by_task, _ = learner.advantages(Config(algo=AlgoConfig(adv_estimator="grpo")), rb, None, None, 0.0)
    by_turn, _ = learner.advantages(Config(algo=AlgoConfig(adv_estimator="grpo", group_by_turn=True)), rb, None, None, 0.0)
    a_task, a_turn = (((a * rb.mask).sum(1) / rb.mask.sum(1)).tolist() for a in (by_task, by_turn))  # per turn
    assert all(a > 0 for a in a_task[0:6:2]) and a_task[1] < 0 and a_task[3] < 0  # turn 4 pushed down for its place
    assert a_turn[0] == a_turn[2] == a_turn[4] == pytest.approx(0.0)  # turn 1: the three chains agree
    assert a_turn[1] == pytest.approx(a_turn[3]) and a_turn[1] > 0 > a_turn[5]  # turn 4: 0.5, 0.5 above the chain that scored 0
    assert learner.group_key(Config(algo=AlgoConfig(group_by_turn=True)), steps[1]) == (7, "researcher", 4)


# --------------------------------------------------------------------------------------------
# 5. DAPO's dynamic sampling


def _steps(rewards_by_group):
    out, eid = [], 0
    for task, rs in rewards_by_group.items():
        for r in rs:
            out.append(Sample(eid, task, "r", 0, [1], [2], [0.0], reward=r))
            eid += 1
    return out


def test_dynamic_sampling_filter():
    steps = _steps({0: [1.0, 1.0], 1: [0.0, 1.0], 2: [0.5]})
    grpo = Config(algo=AlgoConfig(adv_estimator="grpo", dynamic_sampling=True))
    assert [s.task_id for s in learner.informative(grpo, steps)] == [1, 1, 2]  # the flat group leaves; one stays (adv = r)
    for est in ("remax", "reinforce++", "gae"):  # there a flat group has advantages: nothing leaves
        cfg = Config(algo=AlgoConfig(adv_estimator=est, dynamic_sampling=True))
        assert [s.task_id for s in learner.informative(cfg, steps)] == [0, 0, 1, 1, 2]


@pytest.mark.parametrize("estimator", sorted(ppo.ADVANTAGES))
def test_dynamic_sampling_drops_only_groups_whose_advantages_are_zero(estimator):
    """Filter where a flat group's advantage is zero by construction, never where it carries signal:
    a remax group rewarded 1, 1, 1, 1 against a greedy 0 has advantage 1."""
    steps = _steps({0: [1.0] * 4, 1: [0.0, 1.0, 1.0, 0.0], 2: [0.0] * 4, 3: [0.7]})
    for s in steps:
        s.baseline = 0.0
    mask = torch.ones(len(steps), 3)
    scores = torch.tensor([s.reward for s in steps])
    token_rewards = torch.zeros_like(mask)
    token_rewards[:, -1] = scores
    fn = ppo.ADVANTAGES[estimator]
    fn = fn() if isinstance(fn, type) else fn  # a StatefulEstimator: a fresh instance
    adv, _ = fn(token_rewards, mask, group_ids=[s.task_id for s in steps],
                                       values=torch.rand(len(steps), 3), baseline=torch.zeros(len(steps)))
    if estimator == "reinforce++_baseline":  # r - group mean, before the batch whitening shifts every row alike
        adv = (scores - ppo.group_stats(scores, [s.task_id for s in steps])[0]).unsqueeze(-1) * mask
    cfg = Config(algo=AlgoConfig(adv_estimator=estimator, dynamic_sampling=True))
    kept = {id(s) for s in learner.informative(cfg, steps)}
    for s, a in zip(steps, adv):
        if id(s) not in kept:
            assert torch.all(a == 0), (estimator, s.task_id)
    if estimator not in ppo.GROUPED:
        assert len(kept) == len(steps)


def test_remax_refuses_merged_turns():
    with pytest.raises(ValueError, match="rollout.merge_turns"):
        Config(algo=AlgoConfig(adv_estimator="remax"), rollout=dataclasses.replace(Config().rollout, merge_turns=True)).validate()


def test_dapo_trims_to_the_batch_size():
    """7 tasks with informative groups after refill rounds, batch 4: the first 4 in stream order train."""
    steps = _steps({t: [0.0, 1.0] for t in range(7)} | {7: [1.0, 1.0]})
    cfg = Config(algo=AlgoConfig(adv_estimator="grpo", dynamic_sampling=True), data=dataclasses.replace(
        Config().data, batch_size=4))
    assert [s.task_id for s in learner.dapo_batch(cfg, steps)] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="algo.dynamic_sampling"):
        learner.check_names(Config(algo=AlgoConfig(adv_estimator="reinforce++", dynamic_sampling=True)))


def test_dynamic_sampling_refills_and_reports(tmp_path):
    # most toy groups start with some variance; a reward of 0/1 on 'has a 7' makes many flat ones
    cfg = toy_cfg(tmp_path, algo=dict(dynamic_sampling=True, dynamic_sampling_max_rounds=2),
                  data=dict(batch_size=8), trainer=dict(total_steps=2), rollout=dict(num_chains=2))
    train.main(cfg)
    r = rows(tmp_path / "run" / "metrics.jsonl")
    assert all(0 < x["train/kept_frac"] <= 1 for x in r)
    assert all(x["train/extra_rollouts"] in (0.0, 1.0, 2.0) for x in r)
    assert all(1 <= x["train/kept_tasks"] <= 8 for x in r)  # trimmed to the batch, however many rounds ran
    # the data cursor moved by the extra rounds: epoch counts every task rolled out
    assert r[-1]["train/epoch"] * 8 == pytest.approx(8 * 2 + 8 * sum(x["train/extra_rollouts"] for x in r))


# --------------------------------------------------------------------------------------------
# 6. ReMax: the baseline of every turn is the env's reward for the greedy reply to that prompt


class EchoEnv:
    """Three turns of two roles; each turn earns the fraction of '7's in its own reply."""
    roles = ("a", "b")

    def reset(self, task):
        self.rewards, self.history = [], task["question"]
        return Prompt("a", [{"role": "user", "content": self.history}])

    def step(self, reply):
        self.rewards.append(toy.target_fraction(reply))
        self.history += " " + reply[:20]
        if len(self.rewards) == 3:
            return None
        return Prompt("ab"[len(self.rewards) % 2], [{"role": "user", "content": self.history}])

    def turn_rewards(self):
        return self.rewards

    def metrics(self):
        return {}


def test_remax_baseline_is_the_greedy_reply_at_each_turn(tiny):
    m, tok = tiny
    lora.add_lora(m, ["a", "b"], rank=4, alpha=8)
    with torch.no_grad():
        for p in lora.adapter_parameters(m, "b"):
            p.add_(0.05)
    eng = TorchEngine(m, tok)
    specs = {r: RoleSpec(r, SamplingParams(max_new_tokens=6, seed=3)) for r in "ab"}
    greedy = {r: RoleSpec(r, SamplingParams(max_new_tokens=6, greedy=True)) for r in "ab"}
    steps, eps = run_episodes(eng, tok, EchoEnv, [{"question": "Say 7."}, {"question": "Go."}], specs, num_chains=2,
                              baseline_roles=greedy)
    assert len(eps) == 4 and len(steps) == 12  # the greedy twins are not training steps
    from rollout import Request
    for s in steps:
        want = eng.generate([Request(s.prompt_ids, s.role, greedy[s.role].sampling)])[0].text
        assert s.baseline == toy.target_fraction(want), (s.episode_id, s.turn)
    assert any(s.baseline != s.reward for s in steps)


def test_env_that_raises_costs_one_episode(tiny):
    m, tok = tiny

    class Fragile(EchoEnv):
        def step(self, reply):
            if "boom" in self.history:
                raise RuntimeError("parser exploded")
            return super().step(reply)

    eng = TorchEngine(m, tok)
    specs = {r: RoleSpec(None, SamplingParams(max_new_tokens=4, seed=1)) for r in "ab"}
    steps, eps = run_episodes(eng, tok, Fragile, [{"question": "boom"}, {"question": "fine"}], specs)
    assert eps[0].error.startswith("RuntimeError: parser exploded") and eps[0].metrics == {"env_error": 1.0}
    assert all(s.reward == 0.0 for s in eps[0].samples)
    assert eps[1].error is None and len(eps[1].samples) == 3


@pytest.mark.parametrize("module", ["code_team", "math_3agent", "math_tool", "react", "research", "swe", "video_qa"])
def test_workflow_aggregates_take_an_env_errors_episode(module):
    """An env that raised leaves its episode's metrics {"env_error": 1.0} (above); every workflow's own
    aggregate (session.summarize calls it on every episode) takes such an episode beside none, or beside
    its own kind (code_team's and math_tool's raised KeyError)."""
    import importlib
    import types
    agg = importlib.import_module(f"envs.{module}").aggregate
    errored = types.SimpleNamespace(metrics={"env_error": 1.0}, samples=[], error="RuntimeError: boom")
    assert isinstance(agg([errored]), dict)
    if module == "math_tool":
        from envs.math_tool import MathToolEnv, scripted_replies
        task = {"question": "What is 2 + 3?", "answer": "5"}
        env = MathToolEnv(code_timeout=30.0)
        env.reset(task)
        for r in scripted_replies(task):
            env.step(r)
        ok = types.SimpleNamespace(metrics=env.metrics(), samples=[])
        out = agg([errored, ok])
        assert out["final_acc"] == 1.0 and out["plan_right"] == 1.0  # the errored episode is left out, as research's


# --------------------------------------------------------------------------------------------
# 7. GSPO's settings, 8. merge_turns across roles, 9. loud empty steps


def test_gspo_brings_its_own_defaults():
    a = AlgoConfig(policy_loss="gspo")
    assert a.clip == (3e-4, 4e-4) and a.agg == "seq-mean-token-mean"
    assert AlgoConfig().clip == (0.2, 0.28) and AlgoConfig().agg == "token-mean"
    b = AlgoConfig(policy_loss="gspo", clip_high=1e-3, loss_agg="token-mean")
    assert b.clip == (3e-4, 1e-3) and b.agg == "token-mean"
    cli = train.cli(["--config", TOY, "--algo.policy-loss", "gspo"])  # a file's ppo defaults do not stick
    assert cli.algo.clip == (3e-4, 4e-4) and cli.algo.agg == "seq-mean-token-mean"


def test_merge_turns_across_roles_masks_the_other_roles():
    # episode 0: a speaks, b speaks, a speaks again with a prompt that extends its first turn
    a1 = Sample(0, 0, "a", 0, [1, 2], [3, 4], [-1.0, -1.0], reward=0.1)
    b1 = Sample(0, 0, "b", 1, [1, 2, 3, 4, 9], [5], [-1.0], reward=0.2)
    a2 = Sample(0, 0, "a", 2, [1, 2, 3, 4, 9, 5, 9], [6, 7], [-0.5, -0.5], reward=0.3)
    b2 = Sample(0, 0, "b", 3, [8, 8], [5], [-1.0], reward=0.4)  # does not extend b1: stays apart
    out = merge_turns([a1, b1, a2, b2])
    assert [(s.role, s.turn) for s in out] == [("a", 0), ("b", 1), ("b", 3)]
    a = out[0]
    assert a.completion_ids == [3, 4, 9, 5, 9, 6, 7]
    assert a.loss_mask == [1, 1, 0, 0, 0, 1, 1]  # b's turn and the template tokens carry no loss
    assert a.logprobs == [-1.0, -1.0, 0.0, 0.0, 0.0, -0.5, -0.5] and a.reward == 0.3 and a.merged_turns == 2


def test_a_step_that_trains_on_nothing_is_loud_then_fatal(tmp_path, capsys):
    cfg = toy_cfg(tmp_path, rollout=dict(max_model_len=10), trainer=dict(total_steps=5, max_empty_steps=2))
    with pytest.raises(RuntimeError, match="2 steps in a row trained on nothing .*truncated.*max_model_len=10"):
        train.main(cfg)
    assert "WARNING: this step trains on nothing" in capsys.readouterr().out


def test_workflow_roles_are_checked_before_the_model_loads(tmp_path):
    cfg = toy_cfg(tmp_path)
    cfg = dataclasses.replace(cfg, roles=(dataclasses.replace(cfg.roles[0], name="talker"),))
    with pytest.raises(ValueError, match="config field roles: workflow 'toy' has roles \\['speaker'\\]"):
        train.main(cfg)


# --------------------------------------------------------------------------------------------
# 11. the metrics people read, and learning itself


def test_logged_metrics_measure_what_they_say(tmp_path):
    cfg = toy_cfg(tmp_path, algo=dict(adv_estimator="gae", warmup_steps=4, mini_batch_size=8), trainer=dict(total_steps=2))
    train.main(cfg)
    r = rows(tmp_path / "run" / "metrics.jsonl")[-1]
    for k in ("pg_loss", "lr", "vf_loss", "explained_variance", "grad_norm", "entropy", "clipfrac"):
        assert math.isfinite(r[f"train/{k}/speaker"]), k
    # warm-up counts training steps: step 2 of 4, although each step takes 4 optimizer steps (32 turns / 8)
    assert r["train/lr/speaker"] == pytest.approx(cfg.algo.lr * 2 / 4)
    rew = [r[f"train/reward{x}/speaker"] for x in ("_min", "", "_max")]
    assert rew[0] <= rew[1] <= rew[2] and r["train/reward_std/speaker"] >= 0
    assert 1 <= r["train/response_len/speaker"] <= 8


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce++", "reinforce++_baseline", "remax", "gae"])
def test_every_estimator_learns_the_toy_reward(tmp_path, estimator):
    cfg = toy_cfg(tmp_path, algo=dict(adv_estimator=estimator), trainer=dict(total_steps=12))
    train.main(cfg)
    rew = [x["train/reward/speaker"] for x in rows(tmp_path / "run" / "metrics.jsonl")]
    assert rew[0] < 0.15 and sum(rew[-3:]) / 3 > rew[0] + 0.2, rew


def test_two_ranks_equal_one_with_real_advantages(tmp_path):
    common = ["--config", TOY, "--trainer.total-steps", "3", "--trainer.save-freq", "3", "--lora.dropout", "0.05",
              "--algo.mini-batch-size", "64", "--algo.micro-batch-size", "4", "--trainer.resume", "none",
              "--data.batch-size", "7"]
    # one mini-batch per step: with several, the random split into mini-batches differs between 1 and 2 ranks.
    # 7 tasks: rank 0 rolls out 4 (16 turns, 4 micro-batches), rank 1 3 (12 turns, 3): under FSDP2 rank 1 runs a
    # zero-weight dummy to stay in lockstep, under replicate it does not (tests/test_collectives.py)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, str(ROOT / "train.py"), *common, "--trainer.output-dir", str(tmp_path / "one")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, (one.stdout + one.stderr)[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          "29541", str(ROOT / "train.py"), *common, "--trainer.output-dir", str(tmp_path / "two")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, (two.stdout + two.stderr)[-4000:]
    # torchrun on ONE rank runs the distributed path too (process group + FSDP2: a multi-GPU setup checked on
    # one GPU) and trains exactly what the plain process trains
    solo = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port",
                           "29542", str(ROOT / "train.py"), *common, "--trainer.output-dir", str(tmp_path / "solo")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert solo.returncode == 0, (solo.stdout + solo.stderr)[-4000:]
    # trainer.strategy replicate: every rank keeps the whole model, only the adapters' gradients are averaged
    rep = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          "29543", str(ROOT / "train.py"), *common, "--trainer.strategy", "replicate",
                          "--trainer.output-dir", str(tmp_path / "rep")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert rep.returncode == 0, (rep.stdout + rep.stderr)[-4000:]
    assert "| 1 rank(s), FSDP2" in solo.stdout and "| 2 rank(s), FSDP2" in two.stdout
    assert "| 2 rank(s), replicated" in rep.stdout
    assert "FSDP2" not in one.stdout and "| 1 rank(s)" in one.stdout
    a = [{k: v for k, v in x.items() if not k.startswith(("time/", "perf/"))} for x in rows(tmp_path / "one/metrics.jsonl")]
    b = [{k: v for k, v in x.items() if not k.startswith(("time/", "perf/"))} for x in rows(tmp_path / "two/metrics.jsonl")]
    c = [{k: v for k, v in x.items() if not k.startswith(("time/", "perf/"))} for x in rows(tmp_path / "solo/metrics.jsonl")]
    d = [{k: v for k, v in x.items() if not k.startswith(("time/", "perf/"))} for x in rows(tmp_path / "rep/metrics.jsonl")]
    assert len(a) == len(b) == len(c) == len(d) == 3
    assert any(x["train/reward_std/speaker"] > 0 for x in a)  # non-zero advantages
    for x, y, z, w in zip(a, b, c, d):
        assert x.keys() == y.keys() == z.keys() == w.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-5), k
            assert x[k] == pytest.approx(z[k], rel=1e-4, abs=1e-5), k
            assert x[k] == pytest.approx(w[k], rel=1e-4, abs=1e-5), k
    from safetensors.torch import load_file
    fa = load_file(tmp_path / "one/checkpoints/step_000003/adapters/speaker/adapter_model.safetensors")
    for other in ("two", "rep"):
        fb = load_file(tmp_path / other / "checkpoints/step_000003/adapters/speaker/adapter_model.safetensors")
        for k in fa:  # 2 ranks sum gradients in another order; Adam divides by sqrt(v), so an element whose
            # gradient is ~0 turns that 1e-7 noise into a visible step (seen: 1 of 2048 off by 3e-4 = lr/16)
            close = torch.isclose(fa[k], fb[k], atol=1e-5, rtol=1e-4)
            assert close.float().mean() >= 0.995 and float((fa[k] - fb[k]).abs().max()) < 1e-3, (other, k)


def test_tensorboard_logger_holds_what_metrics_jsonl_holds(tmp_path, capsys):
    """trainer.logger = (tensorboard,): event files under <run>/tensorboard with every numeric metric of
    metrics.jsonl at its step, and no console lines (console is a sink like the others)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    cfg = toy_cfg(tmp_path, trainer=dict(total_steps=2, logger=("tensorboard",)))
    train.main(cfg)
    assert "[step 1/2]" not in capsys.readouterr().out
    ev = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    ev.Reload()
    r = rows(tmp_path / "run" / "metrics.jsonl")
    for key in ("train/reward/speaker", "train/pg_loss/speaker", "time/step"):
        got = [(e.step, e.value) for e in ev.Scalars(key)]
        assert got == [(x["step"], pytest.approx(x[key], rel=1e-6)) for x in r if key in x]
    with pytest.raises(ValueError, match="trainer.logger"):
        dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, logger=("tensorbored",))).validate()


def test_a_new_estimator_is_one_function_and_one_dict_entry(tmp_path, monkeypatch):
    """What ppo.py promises a researcher: add a function to ADVANTAGES (here, at run time) and train with
    it by name; config, CLI and trainer need no edit."""
    def _adv_sign(token_rewards, mask, group_ids, **_):  # +1 above the group mean, -1 below
        r = token_rewards.sum(-1)
        mean, _, _ = ppo.group_stats(r, group_ids)
        adv = torch.sign(r - mean).unsqueeze(-1) * mask
        return adv, adv
    monkeypatch.setitem(ppo.ADVANTAGES, "sign", _adv_sign)
    assert train.cli(["--config", TOY, "--algo.adv-estimator", "sign"]).algo.adv_estimator == "sign"
    cfg = toy_cfg(tmp_path, algo=dict(adv_estimator="sign"), trainer=dict(total_steps=12))
    train.main(cfg)
    rew = [x["train/reward/speaker"] for x in rows(tmp_path / "run" / "metrics.jsonl")]
    assert rew[0] < 0.15 and sum(rew[-3:]) / 3 > rew[0] + 0.2, rew
    with pytest.raises(ValueError, match=r"algo.adv_estimator: unknown estimator 'sgn'; known: .*'sign'"):
        learner.check_names(dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, adv_estimator="sgn")))


# --------------------------------------------------------------------------------------------
# rollout importance sampling (engine != trainer)


def test_rollout_is_weights_by_hand_and_as_a_loss_weight():
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.0]])
    sample = torch.tensor([[-1.5, -1.0, -2.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w, m = ppo.rollout_is_weights(old, sample, mask, cap=2.0)
    assert w.tolist()[0] == pytest.approx([math.exp(0.5), math.exp(-1.0), 2.0, 0.0])  # exp(1.5) = 4.48 capped
    assert m["rollout_is_mean"] == pytest.approx((math.exp(0.5) + math.exp(-1) + math.exp(1.5)) / 3)
    assert m["rollout_is_capped_frac"] == pytest.approx(1 / 3)
    # verl's TIS: the per-token clipped loss times w == the loss of advantages times w (dual clip included)
    logp = torch.tensor([[-0.7, -2.5, -0.2, -1.0]])
    adv = torch.tensor([[1.5, -2.0, -0.5, 1.0]])
    ratio = torch.exp(logp - old)
    per_tok = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
    per_tok = torch.where(adv < 0, torch.minimum(per_tok, -adv * 3.0), per_tok)
    by_hand = (per_tok * w * mask).sum() / mask.sum()
    loss, _ = ppo.policy_loss(logp, old, adv * w, mask, 0.2, 0.28, 3.0)
    assert float(loss) == pytest.approx(float(by_hand))
    a = AlgoConfig()  # auto: on with the vLLM engine only
    assert a.rollout_is_on("vllm") and not a.rollout_is_on("torch") and AlgoConfig(rollout_is="on").rollout_is_on("torch")
    for cap in (0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="algo.rollout_is_cap"):
            Config(algo=AlgoConfig(rollout_is_cap=cap)).validate()


@pytest.mark.parametrize("mode", ["on", "off"])
def test_rollout_is_reweights_the_advantages_where_old_logprobs_are_recomputed(tmp_path, mode):
    import session
    from workflows import load_data
    cfg = toy_cfg(tmp_path, algo=dict(rollout_is=mode, rollout_is_cap=1.5, recompute_old_logprobs="always"))
    run, _ = session.build(cfg, None)
    tasks = load_data(cfg)[0][:4]
    steps, _ = session.episodes(run.engine, run.tok, cfg, tasks, list(range(4)), session.role_specs(cfg, 0), 4)
    for s in steps:  # an engine that sampled from another distribution: its logprobs 0.5 nats lower
        s.logprobs = [x - 0.5 for x in s.logprobs]
    part, out = learner.prepare_adapter(run, "speaker", steps, 1, 0)
    run.cfg = toy_cfg(tmp_path, algo=dict(rollout_is="off", recompute_old_logprobs="always"))
    plain, _ = learner.prepare_adapter(run, "speaker", steps, 1, 0)
    m = part.batch.mask
    assert m.sum() > 0 and plain.adv.abs().sum() > 0
    if mode == "on":  # exp(0.5) = 1.65 > the cap: every generated token weighs 1.5
        assert torch.allclose(part.adv * m, plain.adv * m * 1.5)
        assert out["rollout_is_capped_frac"] == 1.0 and out["rollout_is_mean"] == pytest.approx(math.exp(0.5), rel=1e-4)
    else:
        assert torch.equal(part.adv, plain.adv) and "rollout_is_mean" not in out


def test_adapter_divergence_memory_does_not_grow_with_tokens_times_vocabulary(tiny):
    """The largest tensor over the vocabulary the divergence allocates (views aside), counted by a
    dispatch mode: max(chunk_tokens, rows of a micro-batch) x vocabulary (the forward's last-position
    logits are rows x vocabulary), never rows x tokens x vocabulary as it was, one per adapter."""

    from learner import adapter_divergence

    class Largest(TorchDispatchMode):
        def __init__(self, V):
            super().__init__()
            self.numel, self.V = 0, V

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.V and not func.is_view:
                    self.numel = max(self.numel, t.numel())
            return out

    m, tok = tiny
    lora.add_lora(m, ["a", "b"], rank=4, alpha=8)
    V = m.config.vocab_size
    peaks, results = [], []
    for n in (6, 24):
        rb = role_batch(tok, n=n)
        with Largest(V) as probe:
            results.append(adapter_divergence(m, rb, ["a", "b", None], "cpu", micro_batch_size=n, chunk_tokens=8))
        peaks.append(probe.numel)
        assert rb.mask.sum() > 8 * 2 and rb.ids.shape[1] > 8  # several chunks; more tokens than a chunk
    assert peaks == [8 * V, 24 * V]
    assert results[0] == pytest.approx(adapter_divergence(m, role_batch(tok, n=6), ["a", "b", None], "cpu", 4, 256))


def test_an_estimator_with_state_is_one_class_and_one_dict_entry_and_resumes_exactly(tmp_path):
    """ppo.EMABaseline, a StatefulEstimator in ADVANTAGES: the run builds one per adapter, it learns the
    toy reward, its state is in the checkpoint, and 2 + 2 resumed steps equal 4 straight ones."""
    assert isinstance(ppo.ADVANTAGES["ema_baseline"], type)
    cfg = toy_cfg(tmp_path, algo=dict(adv_estimator="ema_baseline"), trainer=dict(total_steps=12, save_freq=0))
    train.main(cfg)
    rew = [x["train/reward/speaker"] for x in rows(tmp_path / "run" / "metrics.jsonl")]
    assert rew[0] < 0.15 and sum(rew[-3:]) / 3 > rew[0] + 0.2, rew

    def run(out, steps, resume):
        c = toy_cfg(tmp_path, algo=dict(adv_estimator="ema_baseline"))
        c = dataclasses.replace(c, trainer=dataclasses.replace(c.trainer, output_dir=str(tmp_path / out), total_steps=steps,
                                                               save_freq=2, resume=resume, test_freq=0))
        train.main(c)
        return rows(tmp_path / out / "metrics.jsonl")
    straight = run("a", 4, "none")
    run("b", 2, "none")
    state = torch.load(tmp_path / "b/checkpoints/step_000002/trainer_state.pt", weights_only=False)["estimators"]
    assert state["speaker"]["updates"] == 2 and state["speaker"]["baseline"] != 0.0
    resumed = run("b", 4, "auto")
    keys = [k for k in straight[-1] if k.startswith("train/") and "time" not in k and "per_s" not in k]
    assert [[r[k] for k in keys] for r in straight[2:]] == [[r[k] for k in keys] for r in resumed[2:]]


def test_a_stateful_estimators_settings_come_from_the_config_and_a_bad_key_is_one_line(tmp_path):
    """algo.estimator_kwargs reaches the instance the run builds: batches scoring 1, 0, 0 give EMABaseline's
    advantages 0, -1, -0.9 at the default decay 0.9 and 0, -1, 0 at decay 0 (the baseline is the last mean). An
    unknown key, a refused value and settings with no stateful estimator in use are each one line naming the field."""
    from session import Run
    mask = torch.ones(2, 3)

    def advantages(argv):
        cfg = train.cli(["--config", TOY, "--algo.adv-estimator", "ema_baseline", *argv]).validate()
        learner.check_names(cfg)
        est = Run(cfg, None, None, "cpu").estimator_state["speaker"]
        out = []
        for score in (1.0, 0.0, 0.0):
            token_rewards = torch.zeros(2, 3)
            token_rewards[:, -1] = score
            out.append(round(float(est(token_rewards, mask)[0][0, 0]), 6))
        return out
    assert advantages([]) == [0.0, -1.0, -0.9]
    assert advantages(["--algo.estimator-kwargs", "decay", "0"]) == [0.0, -1.0, 0.0]
    for argv, want in [(["--algo.adv-estimator", "ema_baseline", "--algo.estimator-kwargs", "decya", "0.5"],
                        "config field algo.estimator_kwargs: ema_baseline takes no setting 'decya' (its settings: decay)"),
                       (["--algo.adv-estimator", "ema_baseline", "--algo.estimator-kwargs", "decay", "1.5"],
                        "config field algo.estimator_kwargs.decay: must be a number in [0, 1), got 1.5"),
                       (["--algo.estimator-kwargs", "decay", "0.5"], "config field algo.estimator_kwargs: ['decay'] set, "
                        "but no estimator in use takes settings")]:
        r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", TOY, "--trainer.output-dir",
                            str(tmp_path / "run"), *argv], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.strip().splitlines()[-1].startswith(f"error: {want}"), r.stderr[-2000:]  # one line
        assert not (tmp_path / "run").exists()  # refused before anything ran


def test_train_windows_train_exactly_their_roles_and_resume_mid_window_bit_exactly(tmp_path):
    """roles.train_windows: the generator learns at steps 1-2, the judge at 3-4, the refiner always; a run
    stopped after step 3 (inside the judge's window) and resumed equals the straight run."""
    cfg = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    g, e, r = cfg.roles
    roles = (dataclasses.replace(g, train_windows=((1, 2),)), dataclasses.replace(e, train_windows=((3, 4),)), r)

    def run(out, steps, resume):
        c = dataclasses.replace(cfg, roles=roles, data=dataclasses.replace(cfg.data, env_kwargs={"evaluator_mixed_groups_only": False}),
                                trainer=dataclasses.replace(cfg.trainer, output_dir=str(tmp_path / out), total_steps=steps,
                                                            save_freq=1, test_freq=0, val_before_train=False, resume=resume))
        train.main(c)
        return rows(tmp_path / out / "metrics.jsonl")
    straight = run("a", 4, "none")
    trained = [{x for x in ("generator_initial", "evaluator_critique", "generator_refinement") if f"train/pg_loss/{x}" in m}
               for m in straight]
    assert trained == [{"generator_initial", "generator_refinement"}] * 2 + [{"evaluator_critique", "generator_refinement"}] * 2
    run("b", 3, "none")
    resumed = run("b", 4, "auto")
    keys = [k for k in straight[-1] if k.startswith(("train/", "val/")) and "time" not in k and "per_s" not in k]
    assert [straight[-1][k] for k in keys] == [resumed[-1][k] for k in keys]
    assert train.cli(["--config", str(ROOT / "configs" / "tiny_math_3agent.py"), "--roles.1.train-windows", "3", "4",
                      "9", "12"]).roles[1].train_windows == ((3, 4), (9, 12))
    with pytest.raises(ValueError, match=r"roles\[1\].train_windows"):
        dataclasses.replace(cfg, roles=(g, dataclasses.replace(e, train_windows=((5, 2),)), r)).validate()


def test_saving_a_checkpoint_before_a_roles_first_step_does_not_change_its_training(tmp_path):
    """The judge trains at steps 3-4 only; checkpoints at steps 1 and 2 must not initialise its optimizer
    (torch's get_optimizer_state_dict steps a fresh AdamW at lr 0 when its parameters hold no gradient, as
    they do when each adapter is updated on its own, fused_update off: its first real step was ~26% smaller):
    save_freq 1 and no checkpoint train the same, and a run resumed from step 2 equals both."""
    cfg = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    g, e, r = cfg.roles
    roles = (g, dataclasses.replace(e, train_windows=((3, 4),)), r)

    def run(out, steps, save_freq, resume="none"):
        c = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, fused_update=False), roles=roles, data=dataclasses.replace(cfg.data, env_kwargs={"evaluator_mixed_groups_only": False}),
                                trainer=dataclasses.replace(cfg.trainer, output_dir=str(tmp_path / out), total_steps=steps,
                                                            save_freq=save_freq, test_freq=0, val_before_train=False,
                                                            resume=resume))
        train.main(c)
        return rows(tmp_path / out / "metrics.jsonl")
    unsaved, saved = run("a", 4, 0), run("b", 4, 1)
    assert "train/pg_loss/evaluator_critique" in unsaved[2] and "train/pg_loss/evaluator_critique" not in unsaved[1]
    keys = [k for k in unsaved[-1] if k.startswith("train/") and "time" not in k and "per_s" not in k]
    assert [[m[k] for k in keys] for m in unsaved[2:]] == [[m[k] for k in keys] for m in saved[2:]]
    run("c", 2, 1)
    ckpt = torch.load(tmp_path / "c" / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=False)
    assert ckpt["optim"]["evaluator_critique"] is None and ckpt["optim"]["generator_initial"] is not None
    resumed = run("c", 4, 1, "auto")
    assert [[m[k] for k in keys] for m in unsaved[2:]] == [[m[k] for k in keys] for m in resumed[-2:]]


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")  # the case
def test_a_resumed_optimizer_that_never_stepped_keeps_its_schedules_lr(tmp_path, monkeypatch):
    """The judge's first two steps are skipped as non-finite, so its optimizer never steps while its LR warm-up
    moves on; resumed from a checkpoint at step 2 (its optimizer saved as None), steps 3-4 use the lr the
    straight run uses (a fresh optimizer keeps the schedule's first lr unless the loaded schedule sets it)."""
    cfg = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    now = {"step": 0}
    real_update, real_step = learner.update, learner.step_or_skip

    def update(run, samples, step, step_seed):
        now["step"] = step
        return real_update(run, samples, step, step_seed)

    def step_or_skip(part, params, nonfinite, stats, grad_clip):
        return real_step(part, params, nonfinite or (part.adapter == "evaluator_critique" and now["step"] <= 2),
                         stats, grad_clip)
    monkeypatch.setattr(learner, "update", update)
    monkeypatch.setattr(learner, "step_or_skip", step_or_skip)

    def run(out, steps, resume="none"):
        c = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, warmup_steps=4),
                                data=dataclasses.replace(cfg.data, env_kwargs={"evaluator_mixed_groups_only": False}),
                                trainer=dataclasses.replace(cfg.trainer, output_dir=str(tmp_path / out), total_steps=steps,
                                                            save_freq=1, test_freq=0, val_before_train=False, resume=resume))
        train.main(c)
        return rows(tmp_path / out / "metrics.jsonl")
    straight = run("a", 4)
    assert [m["train/skipped/evaluator_critique"] for m in straight[:2]] == [1, 1]
    run("b", 2)
    resumed = run("b", 4, "auto")
    lr = [m["train/lr/evaluator_critique"] for m in straight[2:]]
    assert lr[0] > 0 and [m["train/lr/evaluator_critique"] for m in resumed[-2:]] == lr


def _select_on_one_rank(r):
    mine = [Sample(r * 10 + i, r * 10 + i // 2, "judge", 0, [1], [2], [0.0], reward=float(i % 2), label=bool(i % 2))
            for i in range(4)] if r == 0 else [Sample(20, 20, "judge", 0, [1], [2], [0.0], reward=1.0)]
    kept, m = learner.select(Config(roles=(dataclasses.replace(Config().roles[1], name="judge"),)), mine)
    return len(kept), m, learner.all_sum(1.0)  # a collective after: both ranks still in step


def test_select_takes_the_same_collectives_on_every_rank_when_only_one_has_labels():
    """Rank 0 holds labelled turns, rank 1 none: both must run select's all_sum (rank 1 once took the
    dynamic-sampling branch instead and the ranks summed each other's numbers, then hung)."""
    from helpers import on_two_ranks
    got = on_two_ranks(_select_on_one_rank)
    assert got[0][1] == got[1][1] == {"train/labelled_turns_dropped": 0.0, "train/turns/judge": 5.0,
                                      "train/dropped_by_labels/judge": 0.0} and got[0][2] == got[1][2] == 2.0
    assert (got[0][0], got[1][0]) == (4, 1)


def test_rollout_is_on_recomputes_old_logprobs_and_never_is_refused(tmp_path):
    cfg = toy_cfg(tmp_path, algo=dict(rollout_is="on"), trainer=dict(total_steps=1))  # torch engine, fp32: auto
    train.main(cfg)
    r = rows(tmp_path / "run" / "metrics.jsonl")[0]
    assert r["train/rollout_is_mean/speaker"] == pytest.approx(1.0, abs=1e-3) and "train/logprob_gap/speaker" in r
    with pytest.raises(ValueError, match="algo.rollout_is"):
        Config(algo=AlgoConfig(rollout_is="on", recompute_old_logprobs="never")).validate()


def test_the_update_runs_without_the_rollouts_prefix_cache_and_balance_labels_says_when_it_has_nothing(
        tmp_path, monkeypatch, capsys):
    """The rollout's prefix cache is released before the update (its KV would sit in memory through the
    backward); balance_labels on turns the env never labelled warns instead of doing nothing quietly."""
    seen = []
    real = learner.update
    monkeypatch.setattr(learner, "update", lambda run, *a: seen.append(run.engine.prefix.tokens) or real(run, *a))
    cfg = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    cfg = dataclasses.replace(cfg, roles=tuple(dataclasses.replace(r, balance_labels=True) for r in cfg.roles),
                              data=dataclasses.replace(cfg.data, env_kwargs={"evaluator_mixed_groups_only": False}),
                              trainer=dataclasses.replace(cfg.trainer, output_dir=str(tmp_path / "run"), total_steps=1,
                                                          save_freq=0, test_freq=0, val_before_train=False, resume="none"))
    train.main(cfg)
    assert seen == [0]
    assert "roles.balance_labels is on for adapter 'evaluator_critique' but the env labelled none" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# algo.pack_turns: turns that extend one another share a row, and the update is the same


def _conversations():
    """Three episodes of three turns, each turn's prompt = the last turn's prompt + reply + an observation;
    then a second reply to episode 0's first prompt (a branch: its own row) and a turn at another
    temperature (its own row)."""
    g = torch.Generator().manual_seed(0)
    rnd = lambda n: torch.randint(5, 200, (n,), generator=g).tolist()  # noqa: E731
    steps = []
    for ep in range(3):
        prompt = rnd(6 + ep)
        for t in range(3):
            c = rnd(3 + t + ep)
            steps.append(Sample(ep, ep % 2, "speaker", t, list(prompt), c, [-1.5] * len(c), reward=float((ep + t) % 2)))
            prompt = prompt + c + rnd(2)
    steps.append(Sample(0, 0, "speaker", 3, list(steps[0].prompt_ids), rnd(4), [-1.5] * 4, reward=1.0))
    return steps


@pytest.mark.parametrize("algo", [dict(kl_coef=0.1, kl_kind="low_var_kl"),
                                  dict(kl_coef=0.1, kl_in_reward=True, adv_estimator="reinforce++"),
                                  dict(kl_coef=0.1, kl_kind="full", adv_estimator="rloo"),
                                  dict(kl_coef=0.1, mini_batch_size=3, micro_batch_size=2)])
def test_packed_update_equals_the_unpacked_one(tmp_path, algo):
    """Old logprobs recomputed, the reference's, the advantages, two epochs of the loss: with the turns
    packed (10 turns -> 4 rows) every turn's advantage, the losses and the gradient (SGD, lr 1: the weights
    move by exactly the gradient) equal the unpacked update's; with 4 mini-batches too (each packs its own
    turns: the same turns in each mini-batch, the same optimizer steps)."""
    import copy

    import session
    results = []
    for pack in (False, True):
        cfg = toy_cfg(tmp_path, lora=dict(dropout=0.0), algo=dict(pack_turns=pack, recompute_old_logprobs="always",
                                                                  ppo_epochs=2, **algo))
        run, _ = session.build(cfg, None)
        with torch.no_grad():
            for i, p in enumerate(lora.adapter_parameters(run.model, "speaker")):
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
        steps = copy.deepcopy(_conversations())
        part, out = learner.prepare_adapter(run, "speaker", steps, 1, 0)
        params = lora.adapter_parameters(run.model, "speaker")
        before = torch.cat([p.detach().flatten() for p in params])
        # several SGD steps at lr 1 blow float noise up (ratios ~1e4): the same 1e-5 as micro-batch 1 vs 2 unpacked
        part = dataclasses.replace(part, opt=torch.optim.SGD(params, lr=1.0 if "mini_batch_size" not in algo else 0.02))
        stats = learner.policy_update(run.model, [part], cfg, torch.device("cpu"), run.kl_ctrl.value)["speaker"]
        results.append((out, stats, [s.advantage for s in steps], torch.cat([p.detach().flatten() for p in params]) - before))
    (o0, s0, a0, w0), (o1, s1, a1, w1) = results
    assert "update_rows" not in o0 and o1["update_rows"] == 4
    assert a1 == pytest.approx(a0, abs=1e-6) and any(a != 0 for a in a0)
    for k in ("pg_loss", "entropy", "approx_kl", "clipfrac", "ratio_max") + (("kl_loss",) if "kl_loss" in s0 else ()):
        assert s1[k] == pytest.approx(s0[k], rel=1e-5, abs=1e-6), (k, s1[k], s0[k])
    assert abs(s0["approx_kl"]) > 1e-4  # the second epoch read the old logprobs: the packed ones were right
    assert w0.abs().max() > 1e-3  # the weights moved
    torch.testing.assert_close(w1, w0, rtol=1e-5, atol=1e-6)


def test_packing_is_used_only_where_it_is_exact(tiny):
    _, tok = tiny
    assert AlgoConfig().packs_turns and not AlgoConfig(pack_turns=False).packs_turns
    assert not AlgoConfig(policy_loss="gspo").packs_turns  # a sequence-level ratio over a whole conversation
    assert not AlgoConfig(loss_agg="seq-mean-token-mean").packs_turns
    steps = _conversations()
    steps[1].role = "refiner"  # another role on the same adapter continuing the conversation: the same row
    rb = learner.AdapterBatch(steps, [1.0] * 8 + [0.7, 1.0], tok.pad_token_id, 16)  # episode 2's last turn: 0.7
    pk = learner.Packed(rb)
    rows = {frozenset(i for i in range(10) if pk.row[i] == j) for j in pk.row.values()}
    assert rows == {frozenset({0, 1, 2}), frozenset({3, 4, 5}), frozenset({6, 7}), frozenset({8}), frozenset({9})}
    assert sum(pk.batch.row_turns) == 10 and len(pk.batch.samples) == 5
    # the last row of each conversation holds every turn's tokens; each turn's columns are its own
    torch.testing.assert_close(pk.unpack(pk.batch.mask), rb.mask)
    torch.testing.assert_close(pk.unpack(pk.batch.sample_logp), rb.sample_logp)
    assert float(pk.batch.mask.sum()) == float(rb.mask.sum())
    assert (sum(pk.batch.rows_len), sum(rb.rows_len)) == (109, 175)  # tokens the forwards read


def _play(tok, make_env, tasks, replies_of):
    """Each task's scripted replies played through a fresh env as Steps (prompt through the chat template,
    the reply's tokens + EOS as the completion), one episode per task; every episode must score 1."""
    from chat import chat_ids
    steps = []
    for ep, task in enumerate(tasks):
        env = make_env()
        p = env.reset(task)
        for r in replies_of(env, task):
            c = tok.encode(r, add_special_tokens=False) + [tok.eos_token_id]
            steps.append(Sample(ep, ep, p.role, len(steps), chat_ids(tok, p.messages), c, [-1.0] * len(c)))
            p = env.step(r)
        assert p is None and env.metrics()["team_reward"] == 1.0
    return steps


def _packed_rows(tok, steps, shared: bool) -> int:
    """Rows the update reads: each role on its own adapter, or every role on one (shared)."""
    by = {}
    for s in steps:
        by.setdefault("team" if shared else s.role, []).append(s)
    return sum(len(learner.Packed(learner.AdapterBatch(ss, [0.7] * len(ss), tok.pad_token_id, 64)).batch.samples)
               for ss in by.values())


def test_math_tool_transcript_packs_an_episode_into_one_row_on_one_adapter(tiny):
    """math_tool's team transcript (the default): every turn's prompt is the last turn's prompt + reply +
    new text, token for token through the chat template, so on ONE adapter a whole episode trains as one
    row (3 turns; 6 with a rejected first cycle); on per-role adapters a role's second cycle extends its
    first; the one-message layout (layout="message") packs nothing."""
    from envs.math_tool import MathToolEnv, scripted_replies
    _, tok = tiny
    tasks = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(3, 4), (12, 30), (7, 8)]]
    rejected = ["1. Guess.", "print(0)", "The output is wrong. Verdict: Incorrect"]  # a first cycle the verifier rejects

    def play(transcript, reject_first=False):
        return _play(tok, lambda: MathToolEnv(layout="transcript" if transcript else "message"), tasks,
                     lambda env, t: (rejected if reject_first else []) + scripted_replies(t))

    assert len(play(True)) == 9 and _packed_rows(tok, play(True), shared=True) == 3  # one row per episode
    assert _packed_rows(tok, play(True), shared=False) == 9  # one cycle: no role speaks twice
    assert _packed_rows(tok, play(True, reject_first=True), shared=False) == 9  # 18 turns: a role's cycles, one row
    assert _packed_rows(tok, play(True, reject_first=True), shared=True) == 3
    assert _packed_rows(tok, play(False, reject_first=True), shared=True) == 18  # the old layout: nothing extends


def test_search_team_transcript_packs_each_roles_cycles(tiny):
    """The search team's transcript (the default): over the scripted team's multi-cycle episodes (2-hop
    questions: 2-3 cycles of query -> results -> answerer), each role's cycles train as one row on
    per-role adapters and an episode as one row on one adapter; layout="message" packs nothing."""
    from envs.search_team import SearchTeamEnv
    _, tok = tiny
    tasks = [json.loads(x) for x in (ROOT / "data" / "search_train.jsonl").read_text().splitlines() if x.strip()]
    env = SearchTeamEnv(corpus=str(ROOT / "data" / "search_corpus.jsonl"), max_refinement_iterations=3)
    tasks = [t for t in tasks if t["hops"] == 2 and len(env.scripted_replies(t)) >= 4][:3]
    assert len(tasks) == 3

    def play(transcript):
        return _play(tok, lambda: SearchTeamEnv(corpus=str(ROOT / "data" / "search_corpus.jsonl"),
                                                max_refinement_iterations=3,
                                                layout="transcript" if transcript else "message"),
                     tasks, lambda e, t: e.scripted_replies(t))

    steps = play(True)
    assert len(steps) >= 12 and _packed_rows(tok, steps, shared=False) == 6 and _packed_rows(tok, steps, shared=True) == 3
    assert _packed_rows(tok, play(False), shared=True) == len(steps)


def test_prefill_token_bench_counts_what_the_cache_and_packing_save(tiny):
    """bench/prefill_tokens.py's count on the math_tool episodes of the transcript test: unpacked update tokens
    = every turn's prompt + reply; packed = learner.Packed's rows' tokens; prefilled = each prompt minus the
    longest earlier sequence of its adapter it extends (one adapter: only the first prompt and the new text
    of each later turn)."""
    import importlib.util
    from envs.math_tool import MathToolEnv, scripted_replies
    spec = importlib.util.spec_from_file_location("prefill_tokens", ROOT / "bench" / "prefill_tokens.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    _, tok = tiny
    tasks = [{"question": f"What is {a} * {b}?", "answer": str(a * b)} for a, b in [(3, 4), (12, 30)]]
    steps = _play(tok, MathToolEnv, tasks, lambda env, t: scripted_replies(t))
    eps = [[(s.role, s.prompt_ids, s.completion_ids) for s in steps if s.episode_id == e] for e in range(2)]
    per_role, one = bench.count(eps, lambda r: r), bench.count(eps, lambda r: "team")
    assert per_role["prompt"] == per_role["prefilled"] == sum(len(s.prompt_ids) for s in steps)  # one cycle: no reuse
    assert per_role["update"] == per_role["update_packed"] == sum(len(s.prompt_ids + s.completion_ids) for s in steps)
    rows = learner.Packed(learner.AdapterBatch(steps, [0.7] * 6, tok.pad_token_id, 64)).batch
    assert one["update_packed"] == sum(rows.rows_len) == sum(len(eps[e][-1][1] + eps[e][-1][2]) for e in range(2))
    assert one["prefilled"] == sum(len(t[-1][1]) - sum(len(c) for _, _, c in t[:-1]) for t in eps)


def test_prefill_tokens_are_logged_per_step(tmp_path):
    """perf/prefill_tokens: the prompt tokens the TorchEngine forwarded in the step's rollout (no turn of
    the toy extends another, so every prompt token of its 32 episodes is prefilled)."""
    train.main(toy_cfg(tmp_path, trainer=dict(total_steps=1)))
    (row,) = [r for r in rows(tmp_path / "run" / "metrics.jsonl") if "time/step" in r]
    assert 32 * 5 <= row["perf/prefill_tokens"] <= 32 * 128


def stepped_once(tmp_path, algo: dict):
    """The toy team built with these algo fields, four tasks x four chains sampled, and one update on them paid 0, 1,
    0, 1 (every group has signal) -> (run, the sampled turns, the adapter's weights as a function, step 1's metrics,
    the weights before and after it)."""
    import copy

    import session
    from workflows import load_data
    cfg = toy_cfg(tmp_path, algo=algo)
    run, _ = session.build(cfg, None)
    tasks = load_data(cfg)[0][:4]
    steps, _ = session.episodes(run.engine, run.tok, cfg, tasks, list(range(4)), session.role_specs(cfg, 0), 4)
    weights = lambda: torch.cat([p.detach().flatten().clone() for p in lora.adapter_parameters(run.model, "speaker")])  # noqa: E731
    first = copy.deepcopy(steps)
    for i, s in enumerate(first):
        s.reward = float(i % 2)
    w0 = weights()
    m1 = learner.update(run, first, 1, 0)
    return run, steps, weights, m1, w0, weights()


def test_a_role_whose_step_carries_no_signal_is_not_moved_by_its_optimizers_momentum(tmp_path):
    """Step 1 has signal (rewards differ within groups): the adapter moves. Step 2's rewards all agree, so every
    advantage is 0: the adapter is skipped (no_signal 1, weights and LR schedule untouched) where AdamW, stepped
    on a zero gradient, would move it again along step 1's momentum. With a KL loss or an entropy bonus the step
    still trains (no_signal 0)."""
    import copy

    for algo, skips in ((dict(recompute_old_logprobs="always"), True),
                        (dict(recompute_old_logprobs="always", kl_coef=0.1, kl_kind="low_var_kl"), False),
                        (dict(recompute_old_logprobs="always", entropy_coef=0.01), False)):
        run, steps, weights, m1, w0, w1 = stepped_once(tmp_path, algo)
        assert (w1 - w0).abs().max() > 0 and m1["train/no_signal/speaker"] == 0.0
        flat = copy.deepcopy(steps)
        for s in flat:
            s.reward = 1.0
        sched = run.scheds["speaker"].last_epoch
        m2 = learner.update(run, flat, 2, 0)
        moved = float((weights() - w1).abs().max())
        if skips:
            assert m2["train/no_signal/speaker"] == 1.0 and moved == 0.0 and run.scheds["speaker"].last_epoch == sched
        else:
            assert m2["train/no_signal/speaker"] == 0.0 and moved > 0


def test_a_role_whose_advantages_cancel_on_identical_turns_is_not_moved_by_its_optimizers_momentum(tmp_path, monkeypatch):
    """Step 2's turns are four copies of one turn per task (one prompt, one reply), paid 1, 0, 1, 0: the centred
    advantages are +A, -A, +A, -A, so the policy gradient of each task's copies sums to 0 while no advantage is 0.
    In one mini-batch and one epoch the adapter is skipped like a step with every advantage 0 (no_signal 1, weights
    and LR schedule untouched), and the premise holds: made to step anyway, plain SGD (no momentum) leaves it where
    it was. Split over mini-batches, or over two epochs, the copies' gradients do not all meet at ratio 1 before an
    optimizer step, so it trains (no_signal 0); the same rewards on the sampled turns (one prompt per task, replies
    that differ) train too, and plain SGD moves them."""
    import copy

    for mini_batch_size, epochs, same, skips in ((64, 1, True, True), (2, 1, True, False), (64, 2, True, False),
                                                 (64, 1, False, False)):
        run, steps, weights, _, _, w1 = stepped_once(
            tmp_path, dict(recompute_old_logprobs="always", mini_batch_size=mini_batch_size, ppo_epochs=epochs))
        copies = copy.deepcopy(steps)
        for i, s in enumerate(copies):
            src = next(t for t in steps if t.task_id == s.task_id)  # the task's first turn, copied into each chain
            if same:
                s.prompt_ids, s.completion_ids, s.logprobs = list(src.prompt_ids), list(src.completion_ids), list(src.logprobs)
            s.reward = float(i % 2)
        by_task = defaultdict(list)
        for s in copies:
            by_task[s.task_id].append(s)
        assert all(sorted(t.reward for t in ts) == [0.0, 0.0, 1.0, 1.0] for ts in by_task.values())  # all have signal
        assert all(len({tuple(t.prompt_ids) for t in ts}) == 1 for ts in by_task.values())  # one prompt per task
        replies = [len({tuple(t.completion_ids) for t in ts}) for ts in by_task.values()]
        assert all(n == 1 for n in replies) if same else any(n > 1 for n in replies)  # a key of the prompt alone fails
        sched = run.scheds["speaker"].last_epoch
        m2 = learner.update(run, copies, 2, 0)
        moved = float((weights() - w1).abs().max())
        assert any(s.advantage for s in copies)  # the advantages are not 0: they cancel
        if skips:
            assert m2["train/no_signal/speaker"] == 1.0 and moved == 0.0 and run.scheds["speaker"].last_epoch == sched
        else:
            assert m2["train/no_signal/speaker"] == 0.0 and moved > 0
        if epochs == 1 and mini_batch_size == 64:  # the premise: the gradient itself (plain SGD steps on it alone)
            with monkeypatch.context() as mp:
                mp.setattr(learner, "moves", lambda *a, **k: True)
                run.opts["speaker"] = torch.optim.SGD(lora.adapter_parameters(run.model, "speaker"), lr=1.0)
                w2 = weights()
                learner.update(run, copy.deepcopy(copies), 3, 0)
                sgd = float((weights() - w2).abs().max())
            assert sgd < 1e-6 if same else sgd > 1e-4, sgd
