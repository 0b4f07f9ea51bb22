import pytest
import torch

import lora
import ppo
from rollout import Request, RoleSpec, SamplingParams, TorchEngine, Turn, run_episodes

TEXTS = ["What is 3 + 4?", "the answer is", "Solve: 12 * 9 = ? then check the result twice", "def f"]


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
        return Turn(role, msgs)

    def step(self, reply):
        self.replies.append(reply)
        return self._turn()

    def turn_rewards(self):
        return [float(len(r)) for r in self.replies]

    def metrics(self):
        return {"turns": len(self.replies)}


class CountingEngine:
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, reqs):
        self.calls.append([r.adapter for r in reqs])
        return self.inner.generate(reqs)


def test_driver_batches_all_roles_per_round(setup):
    m, tok, _ = setup
    eng = CountingEngine(TorchEngine(m, tok))
    roles = {"asker": RoleSpec("a", SamplingParams(max_new_tokens=4, stop_token_ids=[], seed=0)),
             "answerer": RoleSpec("b", SamplingParams(max_new_tokens=3, stop_token_ids=[], seed=0))}
    steps, eps = run_episodes(eng, tok, CountEnv, tasks=[1, 3, 5], roles=roles, num_chains=2, max_turns=4)
    assert len(eps) == 6 and [e.task_id for e in eps] == [0, 0, 1, 1, 2, 2]
    # round 1: all 6 episodes (asker); round 2: 4 left (answerer); round 3: 4 (asker); round 4: 2 (answerer)
    assert eng.calls == [["a"] * 6, ["b"] * 4, ["a"] * 4, ["b"] * 2]
    assert [len(e.steps) for e in eps] == [1, 1, 3, 3, 4, 4]
    assert [e.truncated for e in eps] == [False, False, False, False, True, True]  # 5 turns > max_turns
    for s in steps:
        assert s.reward == len(s.info["text"])
        assert len(s.completion_ids) == len(s.logprobs) <= (4 if s.role == "asker" else 3)
        assert s.role == ("asker" if s.turn % 2 == 0 else "answerer")
    # chains of one task differ (distinct seeds per episode), and the run is reproducible
    assert eps[2].steps[0].completion_ids != eps[3].steps[0].completion_ids
    steps2, _ = run_episodes(eng, tok, CountEnv, tasks=[1, 3, 5], roles=roles, num_chains=2, max_turns=4)
    assert [s.completion_ids for s in steps] == [s.completion_ids for s in steps2]


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
    assert eps[0].truncated and eps[0].steps == []
