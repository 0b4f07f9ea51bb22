"""sft.py: SFT lowers the loss on its own examples and touches no other adapter; min_reward counts;
the teacher is balanced; best-of-k keeps the best; init_from loads exactly what SFT saved."""
import copy
import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lora
import session
import sft
from agents.math_team import build_messages, parse_verdict
from rewards.calculator import RewardCalculator, TrajectoryError, load_records
from rewards.math import math_reward

ROOT = Path(__file__).resolve().parent.parent
TASKS = [(f"What is {a} + {b}?", str(a + b)) for a, b in [(2, 3), (4, 4), (7, 1), (6, 3), (5, 5), (9, 2), (8, 8), (3, 1)]]


def chat(tok, role, q, history=()):
    return tok.apply_chat_template(build_messages(role, q, list(history)), add_generation_prompt=True, tokenize=False)


def short_chat(tok, role, q, history=()):
    """A short prompt (the tiny model on 2 shared cores: short sequences keep the test fast)."""
    text = "\n".join([q] + [h for _, h in history])
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)


def episode(tok, i, q, answer, gen, verdict, finish="stop", prompts=chat):
    """generator_initial -> evaluator_critique, rewards as the env gives them."""
    ok = math_reward(gen, answer) == 1.0
    crit = f"I checked the sum.\nVerdict: {verdict}"
    return {"split": "train", "step": 1, "task_id": i, "episode_id": i, "task": {"question": q, "answer": answer},
            "truncated": False, "error": None, "metrics": {"team_reward": float(ok)},
            "turns": [{"turn": 0, "role": "generator_initial", "prompt": prompts(tok, "generator_initial", q),
                       "reply": gen, "reply_tokens": len(tok(gen)["input_ids"]) + 1, "finish_reason": finish,
                       "reward": float(ok)},
                      {"turn": 1, "role": "evaluator_critique", "reply": crit, "reply_tokens": 8, "finish_reason": "stop",
                       "prompt": prompts(tok, "evaluator_critique", q, [("generator_initial", gen)]),
                       "reward": float((verdict == "Correct") == ok)}]}


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def good_records(tok, prompts=chat):
    return [episode(tok, i, q, a, f"{q[8:-1]} = {a}.\nSo the answer is \\boxed{{{a}}}.", "Correct", prompts=prompts)
            for i, (q, a) in enumerate(TASKS)]


@pytest.fixture(scope="module")
def run(_tiny_base, tmp_path_factory):
    """One SFT run of two roles on the tiny model, next to a third adapter SFT must not touch."""
    from config import load_config_file
    tmp = tmp_path_factory.mktemp("sft")
    model, tok = copy.deepcopy(_tiny_base[0]), _tiny_base[1]
    lora.add_lora(model, ["bystander"], 4, 8.0, 0.0, ("q_proj", "k_proj", "v_proj", "o_proj"), seed=1)
    with torch.no_grad():
        for p in lora.adapter_parameters(model, "bystander"):
            p.normal_(0, 0.05, generator=torch.Generator().manual_seed(3))  # B too: a non-trivial adapter
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    data = write(tmp / "train_step_000001.jsonl", good_records(tok, short_chat))
    train_cfg = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    cfg = sft.SFTConfig(data=(data,), roles=("generator_initial", "evaluator_critique"), min_reward=0.7, lr=3e-3,
                        epochs=3, micro_batch_size=2, grad_accum=2, val_frac=0.25, eval_every=4,
                        role_lora=("evaluator_critique:rank=4,alpha=8",), out=str(tmp / "out"), progress=False)
    hook_calls = []
    summary = sft.run_sft(cfg, train_cfg, model=model, tok=tok,
                          eval_hook=lambda m, a, step: hook_calls.append((a, step)) or {"hook": 1.0})
    return {"model": model, "tok": tok, "before": before, "summary": summary, "out": tmp / "out", "cfg": cfg,
            "train_cfg": train_cfg, "hook_calls": hook_calls}


def test_sft_lowers_the_loss_on_its_own_examples(run):
    model, tok, out = run["model"], run["tok"], run["out"]
    for a in ("generator_initial", "evaluator_critique"):
        exs = [sft.tokenize(sft.Example(a, a, r["prompt"], r["reply"], r["eos"], "x"), tok)
               for r in map(json.loads, (out / "examples" / f"{a}.jsonl").read_text().splitlines())]
        assert len(exs) == 8  # every turn passed the filter
        base = sft.mean_loss(model, None, exs, 4, tok.pad_token_id, "cpu")  # a fresh adapter IS the base (B = 0)
        after = sft.mean_loss(model, a, exs, 4, tok.pad_token_id, "cpu")
        assert after < 0.7 * base, (a, base, after)
        res = run["summary"]["losses"][a]
        assert res["train_loss_last"] < res["train_loss_first"] and res["val_loss_after"] < res["val_loss_before"]
        assert res["steps"] == 3 * 2 and res["train_examples"] == 6 and res["val_examples"] == 2
    rows = [json.loads(x) for x in (out / "sft_loss.jsonl").read_text().splitlines()]
    assert sum("loss" in r for r in rows) == 12 and sum("val_loss" in r for r in rows) == 6
    assert all(r["hook"] == 1.0 for r in rows if "val_loss" in r)  # the eval hook's numbers join the eval rows
    assert run["hook_calls"] == [("evaluator_critique", 0), ("evaluator_critique", 4), ("evaluator_critique", 6),
                                 ("generator_initial", 0), ("generator_initial", 4), ("generator_initial", 6)]
    assert (out / "sft_loss.png").stat().st_size > 1000 and (out / "summary.json").is_file()


def test_sft_leaves_every_other_adapter_and_the_base_bit_exact(run):
    model, before = run["model"], run["before"]
    now = model.state_dict()
    for k, v in before.items():
        assert torch.equal(now[k], v), k  # the base and the bystander adapter (and nothing else existed before)
    for a in ("evaluator_critique", "generator_initial"):  # each saved right after its own training
        saved = load_file(str(run["out"] / a / "adapter_model.safetensors"))
        own = lora.adapter_state_dict(model, a)
        assert all(torch.equal(own[k], v) for k, v in saved.items())  # training the next one left it alone
        assert any(v.abs().sum() > 0 for k, v in saved.items() if "lora_B" in k)  # and it did train


def test_per_role_lora_settings_are_written(run):
    g = json.loads((run["out"] / "generator_initial" / "adapter_config.json").read_text())
    e = json.loads((run["out"] / "evaluator_critique" / "adapter_config.json").read_text())
    assert (g["r"], g["lora_alpha"]) == (8, 16) and (e["r"], e["lora_alpha"]) == (4, 8.0)  # train config's / role's
    assert g["target_modules"] == e["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]


def test_init_from_loads_exactly_what_sft_saved(run, tmp_path):
    cfg = run["train_cfg"]
    roles = tuple(dataclasses.replace(r, init_from=run["summary"]["adapters"].get(r.name)) for r in cfg.roles)
    cfg = dataclasses.replace(cfg, roles=roles, trainer=dataclasses.replace(cfg.trainer, output_dir=str(tmp_path),
                                                                            resume="none"))
    cfg.validate()
    r, _ = session.build(cfg, None)
    for name in ("generator_initial", "evaluator_critique"):
        saved = load_file(str(run["out"] / name / "adapter_model.safetensors"))
        own = lora.adapter_state_dict(r.model, name)
        assert set(saved) == set(own) and all(torch.equal(own[k], v) for k, v in saved.items()), name
    assert lora.adapter_config(r.model, "evaluator_critique")["r"] == 4
    mod = next(iter(lora.lora_modules(r.model).values()))
    assert mod.scaling["evaluator_critique"] == 2.0 and mod.scaling["generator_initial"] == 2.0
    assert all(float(p.detach().abs().sum()) == 0 for k, p in lora.adapter_state_dict(r.model, "generator_refinement").items()
               if "lora_B" in k)  # a role without init_from starts fresh


def test_min_reward_filter_counts(tiny, tmp_path):
    _, tok = tiny
    (q0, a0), (q1, a1), (q2, a2) = TASKS[:3]
    recs = [episode(tok, 0, q0, a0, f"{q0[8:-1]} = {a0}.\nSo \\boxed{{{a0}}}.", "Correct"),  # both right
            episode(tok, 1, q1, a1, f"{q1[8:-1]} = 1.\nSo \\boxed{{1}}.", "Correct"),  # both wrong
            episode(tok, 2, q2, a2, f"{q2[8:-1]} = {a2}.\nSo \\boxed{{{a2}}}.", "Incorrect", finish="length")]
    recs[2]["turns"][1]["reward"] = None
    pairs = load_records(write(tmp_path / "t.jsonl", recs), with_source=True)
    calc = RewardCalculator()
    w = [[s.weighted for s in calc.score_episode(r)] for _, r in pairs]
    assert w[0][0] > 0.7 and w[0][1] > 0.7 and w[1][0] < 0.6 and w[1][1] < 0.6 and w[2][1] < 0.6
    roles = {"generator_initial", "evaluator_critique"}
    kept, counts = sft.select_turns(pairs, calc, 0.7, "weighted", roles)
    assert [(src.split(":")[-1], t["role"]) for src, _, t, _ in kept] == [("1", "generator_initial"),
                                                                         ("1", "evaluator_critique")]
    assert counts == {"generator_initial": {"turns": 3, "kept": 1, "below": 1, "cut": 1, "no_reward": 0},
                      "evaluator_critique": {"turns": 3, "kept": 1, "below": 2, "cut": 0, "no_reward": 0}}
    kept, counts = sft.select_turns(pairs, calc, 1.0, "recorded", {"evaluator_critique"})
    assert counts == {"evaluator_critique": {"turns": 3, "kept": 1, "below": 1, "cut": 0, "no_reward": 1}}
    kept, counts = sft.select_turns(pairs, calc, 0.0, "recorded", roles)  # >= : a reward of 0 passes 0.0
    assert counts["generator_initial"]["kept"] == 2 and counts["evaluator_critique"]["kept"] == 2


def test_math_teacher_is_balanced_and_prefers_the_models_own_wrong_samples(tiny):
    _, tok = tiny
    (q0, a0), (q1, a1) = TASKS[:2]
    own_wrong = f"{q0[8:-1]} = 9.\nSo \\boxed{{9}}."
    recs = [("f:1", episode(tok, 0, q0, a0, own_wrong, "Correct")),
            ("f:2", episode(tok, 1, q1, a1, f"{q1[8:-1]} = {a1}.\nSo \\boxed{{{a1}}}.", "Correct"))]
    tasks = [{"question": q0, "answer": a0}, {"question": "Simplify x + x.", "answer": "2x"},
             {"question": TASKS[2][0], "answer": TASKS[2][1]}]
    exs, counts = sft.math_teacher(recs, tasks, tok, "evaluator_critique", 0, seed=0)
    # task 0: own wrong sample (+ a synthetic right one); task 1: own right + perturbed; "2x": no pair; task 2: both made
    assert counts == {"teacher:synthetic_right": 2, "teacher:own_wrong": 1, "teacher:own_right": 1,
                      "teacher:perturbed": 2, "tasks_without_incorrect": 1}
    right = [e for e in exs if e.source.endswith("right")]
    wrong = [e for e in exs if not e.source.endswith("right")]
    assert len(right) == len(wrong) == 3
    assert all(parse_verdict(e.reply) is True for e in right) and all(parse_verdict(e.reply) is False for e in wrong)
    ow = next(e for e in wrong if e.source == "teacher:own_wrong")
    assert ow.prompt == recs[0][1]["turns"][1]["prompt"]  # the very prompt the evaluator saw
    calc, truth = RewardCalculator(), {t["question"]: t["answer"] for t in tasks + [r["task"] for _, r in recs]}
    for e in exs:  # each critique is right, calibrated (states the true answer) and well formatted
        q = next(q for q in truth if q in e.prompt)
        a = truth[q]
        sol = e.prompt.split("Solution:\n", 1)[1].split("\n\nIs the latest", 1)[0]
        assert (math_reward(sol, a) == 1.0) == e.source.endswith("right")
        rec = {"task": {"question": q, "answer": a}, "turns": [{"role": "generator_initial", "reply": sol},
                                                              {"role": "evaluator_critique", "reply": e.reply}]}
        assert calc.score_episode(rec)[1].components["quality"] == 1.0
    again, _ = sft.math_teacher(recs, tasks, tok, "evaluator_critique", 0, seed=0)
    assert [(e.prompt, e.reply) for e in again] == [(e.prompt, e.reply) for e in exs]  # seeded
    exs, counts = sft.math_teacher(recs, tasks, tok, "evaluator_critique", 1, seed=0)
    assert len(exs) == 2  # teacher_tasks limits the pairs


def test_perturbed_answers_are_wrong_and_only_the_answer_changes():
    import random
    sol = "4 + 4 = 8.\nSo \\boxed{8}."
    for s in range(20):
        bad = sft.perturb(sol, "8", random.Random(s))
        assert bad.startswith("4 + 4 = 8.\nSo \\boxed{") and math_reward(bad, "8") == 0.0
    assert sft.perturb(sol, "2x", random.Random(0)) is None and sft.perturb("no box", "8", random.Random(0)) is None


def test_rejection_sampling_keeps_the_best_of_k(tiny):
    from envs import toy
    from rollout import RoleSpec, SamplingParams
    model, tok = tiny
    lora.add_lora(model, ["speaker"], 4, 8.0, 0.0, ("q_proj", "v_proj"), seed=0)
    specs = {"speaker": RoleSpec("speaker", SamplingParams(max_new_tokens=4, temperature=1.0, seed=5))}
    tasks = toy.load_tasks()[:3]
    best, every = sft.rejection_sample(model, tok, toy.ToyEnv, tasks, specs, 3, RewardCalculator(), max_turns=1)
    assert len(every) == 9 and len(best) == 3 and [b["task_id"] for b in best] == [0, 1, 2]
    for b in best:
        group = [r for r in every if r["task_id"] == b["task_id"]]
        assert b["metrics"]["team_reward"] == max(r["metrics"]["team_reward"] for r in group)
        assert b["turns"][0]["prompt"].startswith("<|im_start|>user")
    assert len({r["turns"][0]["reply"] for r in every}) > 3  # sampled, not greedy
    best2, _ = sft.rejection_sample(model, tok, toy.ToyEnv, tasks, specs, 3, RewardCalculator(), max_turns=1)
    assert best2 == best  # seeded


def test_bad_input_is_a_clear_error(tiny, tmp_path):
    model, tok = tiny
    good = json.dumps(good_records(tok)[0])
    f = tmp_path / "t.jsonl"
    f.write_text(good + "\n" + good[:-5] + "\n")
    cfg = sft.SFTConfig(data=(str(f),), out=str(tmp_path / "o"), progress=False)
    with pytest.raises(TrajectoryError, match=r"t\.jsonl:2: .*bad JSON"):
        sft.run_sft(cfg, model=model, tok=tok)
    rec = good_records(tok)[0]
    del rec["turns"][1]["prompt"]
    f.write_text(good + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(TrajectoryError, match=r"t\.jsonl:2: turns\[1\] has no prompt"):
        sft.run_sft(cfg, model=model, tok=tok)
    f.write_text(good + "\n")
    with pytest.raises(ValueError, match="role_lora 'x:rank=two'"):
        sft.run_sft(dataclasses.replace(cfg, role_lora=("x:rank=two",)), model=model, tok=tok)
    with pytest.raises(ValueError, match="nothing to learn from"):
        sft.run_sft(sft.SFTConfig(out=str(tmp_path / "o")), model=model, tok=tok)


def test_cli_and_config_file(tmp_path):
    f = tmp_path / "sft_cfg.py"
    f.write_text("from sft import SFTConfig\nconfig = SFTConfig(lr=1e-3, roles=('solver',), min_reward=0.5)\n")
    cfg = sft.cli(["--config", str(f), "--data", "a.jsonl", "b/*.jsonl", "--role-lora", "solver:rank=4",
                   "--weights", "completion", "0.5", "--min-reward", "0.9"])
    assert cfg.lr == 1e-3 and cfg.roles == ("solver",) and cfg.data == ("a.jsonl", "b/*.jsonl")
    assert cfg.min_reward == 0.9 and cfg.weights == {"completion": 0.5} and cfg.role_lora == ("solver:rank=4",)
    assert sft.parse_role_lora(cfg.role_lora + ("x:targets=q_proj+v_proj,alpha=4",)) == {
        "solver": {"rank": 4}, "x": {"targets": ("q_proj", "v_proj"), "alpha": 4.0}}


def test_roles_with_other_targets_train_on_their_own_copy_of_the_base(tiny, tmp_path):
    model, tok = tiny
    data = write(tmp_path / "t.jsonl", good_records(tok, short_chat)[:2])
    cfg = sft.SFTConfig(data=(data,), roles=("generator_initial", "evaluator_critique"), lr=1e-3, grad_accum=1, rank=8,
                        val_frac=0, role_lora=("evaluator_critique:targets=v_proj+q_proj,rank=2",),
                        out=str(tmp_path / "o"), progress=False)
    summary = sft.run_sft(cfg, model=model, tok=tok)
    e = json.loads((tmp_path / "o" / "evaluator_critique" / "adapter_config.json").read_text())
    g = json.loads((tmp_path / "o" / "generator_initial" / "adapter_config.json").read_text())
    assert e["target_modules"] == ["q_proj", "v_proj"] and e["r"] == 2
    assert g["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"] and g["r"] == 8
    assert lora.adapter_names(model) == ["generator_initial"]  # the evaluator trained on a copy
    assert summary["losses"]["evaluator_critique"]["steps"] == 1 == summary["losses"]["generator_initial"]["steps"]


def test_the_loss_does_not_depend_on_how_a_step_is_split(tiny):
    model, tok = tiny
    exs = [sft.tokenize(sft.Example("a", "a", short_chat(tok, "a", q), f"It is {a}.", True, "x"), tok) for q, a in TASKS[:4]]
    exs[0] = sft.tokenize(sft.Example("a", "a", exs[0].prompt, "A much longer reply: " + "1 + " * 12 + "1.", True, "x"), tok)
    lora.add_lora(model, ["a", "b"], 4, 8.0, 0.0, ("q_proj", "v_proj"), seed=0)
    start = [p.detach().clone() for p in lora.adapter_parameters(model, "a")]
    after = {}
    for name, mb, acc in (("a", 4, 1), ("b", 1, 4)):  # one optimizer step on the same 4 examples
        if name == "b":
            with torch.no_grad():
                for p, q in zip(lora.adapter_parameters(model, "b"), start):
                    p.copy_(q)
        cfg = sft.SFTConfig(lr=1e-2, micro_batch_size=mb, grad_accum=acc, grad_clip=1e9, progress=False)
        sft.train_adapter(model, name, [dataclasses.replace(e, adapter=name) for e in exs], [], cfg,
                          tok.pad_token_id, "cpu", lambda row: None)
        after[name] = [p.detach().clone() for p in lora.adapter_parameters(model, name)]
    assert any(not torch.equal(x, y) for x, y in zip(after["a"], start))
    for x, y in zip(after["a"], after["b"]):
        # Adam's first step is about lr * sign(grad): float noise moves only near-zero gradients, by far
        # less than lr; a loss normalised per micro-batch reweights rows and flips signs (~2 * lr)
        torch.testing.assert_close(x, y, rtol=0, atol=1e-4)


def test_sft_continues_from_a_saved_adapter_and_drops_long_examples(run, tiny, tmp_path):
    model, tok = tiny
    first = run["summary"]["losses"]["generator_initial"]
    recs = good_records(tok, short_chat)
    recs[0]["turns"][0]["reply"] += " And so on," * 40  # too long for max_len
    data = write(tmp_path / "t.jsonl", recs)
    cfg = dataclasses.replace(run["cfg"], data=(data,), roles=("generator_initial",), epochs=1, max_len=64,
                              init_from=(f"generator_initial={run['out'] / 'generator_initial'}",), eval_every=0,
                              out=str(tmp_path / "o"))
    res = sft.run_sft(cfg, run["train_cfg"], model=model, tok=tok)
    assert res["dropped_too_long_or_empty"] == {"generator_initial": 1} and res["counts"]["generator_initial"]["kept"] == 8
    got = res["losses"]["generator_initial"]
    assert got["train_examples"] + got["val_examples"] == 7
    assert got["val_loss_before"] < 0.8 * first["val_loss_before"]  # it starts where the saved adapter left off
    saved = load_file(str(run["out"] / "generator_initial" / "adapter_model.safetensors"))
    assert json.loads((tmp_path / "o" / "generator_initial" / "adapter_config.json").read_text())["r"] == 8
    assert any(not torch.equal(lora.adapter_state_dict(model, "generator_initial")[k], v) for k, v in saved.items())


def test_min_steps_lifts_only_the_adapters_with_few_examples(_tiny_base):
    """A role with few examples (a planner) repeats its epochs up to min_steps optimizer steps; one that
    already has them (its researchers) trains exactly its epochs; 0 = epochs alone."""
    model, tok = copy.deepcopy(_tiny_base[0]), _tiny_base[1]
    lora.add_lora(model, ["a"], 4, 8.0, 0.0, ("q_proj", "v_proj"), seed=1)
    exs = [sft.tokenize(sft.Example("a", "a", short_chat(tok, "a", q), f"{a}.", True, "x"), tok) for q, a in TASKS]
    steps = {}
    for n_train, min_steps in [(3, 0), (3, 5), (8, 5), (8, 0)]:  # 2 examples a step: 2 and 4 steps an epoch
        cfg = sft.SFTConfig(epochs=1, min_steps=min_steps, micro_batch_size=1, grad_accum=2, lr=1e-3, progress=False)
        rows = []
        res = sft.train_adapter(model, "a", exs[:n_train], exs[-1:], cfg, tok.pad_token_id, "cpu", rows.append)
        assert res["steps"] == sum("loss" in r for r in rows)
        steps[n_train, min_steps] = (res["steps"], res["epochs"])
    assert steps == {(3, 0): (2, 1), (3, 5): (6, 3), (8, 5): (8, 2), (8, 0): (4, 1)}


# ---------------------------------------------------------------------- hostile options and reruns

@pytest.mark.parametrize("field, value", [("lr", float("inf")), ("lr", float("nan")), ("lr", 1e30),
                                          ("grad_clip", float("nan")), ("grad_clip", -1.0), ("warmup_steps", -5),
                                          ("min_reward", float("nan")), ("alpha", float("inf")), ("eval_every", -1),
                                          ("weight_decay", float("inf")), ("teacher_tasks", -2),
                                          ("min_steps", -1), ("seed", 2**32)])
def test_every_number_is_checked_before_anything_is_written(tiny, tmp_path, field, value):
    """lr inf / grad_clip nan saved a NaN adapter and exited 0; warmup -5 and grad_clip -1 trained the
    loss upward."""
    model, tok = tiny
    data = write(tmp_path / "t.jsonl", good_records(tok, short_chat)[:2])
    cfg = sft.SFTConfig(data=(data,), roles=("generator_initial",), out=str(tmp_path / "o"), progress=False,
                        **{field: value})
    with pytest.raises(ValueError, match=f"sft option {field}: "):
        sft.run_sft(cfg, model=model, tok=tok)
    assert not (tmp_path / "o").exists()


def test_names_that_would_write_outside_the_output_are_refused(tiny, tmp_path):
    model, tok = tiny
    recs = good_records(tok, short_chat)[:2]
    for r in recs:
        r["turns"][0]["role"] = "../../evil"  # a trajectory file names the role, hence the adapter directory
    data = write(tmp_path / "t.jsonl", recs)
    out = tmp_path / "a" / "o"
    with pytest.raises(ValueError, match=r"'\.\./\.\./evil' is not a usable name"):
        sft.run_sft(sft.SFTConfig(data=(data,), out=str(out), progress=False), model=model, tok=tok)
    assert not (tmp_path / "evil").exists() and not out.exists()
    good = write(tmp_path / "g.jsonl", good_records(tok, short_chat)[:2])
    for kw, want in [({"roles": ("/tmp/x",)}, "sft option roles: '/tmp/x'"),
                     ({"roles": ("critic",)}, "'critic' is reserved"),
                     ({"init_from": (f"../x={tmp_path}",)}, r"sft option init_from .*'\.\./x'"),
                     ({"role_lora": ("a.b:rank=4",)}, r"sft option role_lora .*'a\.b'"),
                     ({"role_lora": ("x:rank=0",)}, r"role_lora 'x:rank=0'")]:
        with pytest.raises(ValueError, match=want):
            sft.run_sft(sft.SFTConfig(data=(good,), out=str(out), progress=False, **kw), model=model, tok=tok)
        assert not out.exists()


def test_a_rerun_is_skipped_only_for_the_same_sft_and_never_overwrites_or_truncates_another(_tiny_base, tmp_path):
    """The "done" check covers the options, the base and the data: a rerun on other data said "not run
    again" (RL then started from adapters of another SFT), and a failing rerun truncated sft_loss.jsonl."""
    model, tok = _tiny_base
    data = tmp_path / "t.jsonl"
    write(data, good_records(tok, short_chat)[:4])
    out = tmp_path / "o"
    cfg = sft.SFTConfig(data=(str(data),), roles=("generator_initial",), lr=1e-3, grad_accum=1, val_frac=0,
                        out=str(out), progress=False)
    first = sft.run_sft(cfg, model=copy.deepcopy(model), tok=tok)
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert (out / "sft_loss.jsonl").read_text() and not list(out.glob("*.tmp"))
    again = sft.run_sft(cfg, model=copy.deepcopy(model), tok=tok)  # the same SFT: not run again
    assert again["losses"] == first["losses"] and again["fingerprint"]

    def boom(*a):
        raise RuntimeError("a rerun that fails half-way")
    write(data, good_records(tok, short_chat)[4:8])  # other data in the same file
    with pytest.raises(ValueError, match=rf"{out} holds a finished SFT of another data"):
        sft.run_sft(cfg, model=copy.deepcopy(model), tok=tok, eval_hook=boom)
    write(data, good_records(tok, short_chat)[:4])
    with pytest.raises(ValueError, match="holds a finished SFT of another options"):
        sft.run_sft(dataclasses.replace(cfg, lr=2e-3), model=copy.deepcopy(model), tok=tok, eval_hook=boom)
    with pytest.raises(ValueError, match="holds a finished SFT of another base_model"):
        sft.run_sft(dataclasses.replace(cfg, model="tiny-other"), model=copy.deepcopy(model), tok=tok, eval_hook=boom)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files  # nothing lost or rewritten


def test_a_bad_option_on_the_command_line_is_one_line(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, str(ROOT / "sft.py"), "--data", str(tmp_path / "t.jsonl"), "--lr", "inf",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 1 and r.stderr.strip() == "error: sft option lr: must be a number in (0, 1.0], got inf"
    assert not (tmp_path / "o").exists()


def _math_teacher_rows(style, tiny_base, tmp_path):
    """sft.py's math teacher under a train config whose judge prompt is `style`: the examples it wrote
    for evaluator_critique, and the train tasks' truths by question."""
    from config import load_config_file
    tc = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    tc = dataclasses.replace(tc, data=dataclasses.replace(tc.data, env_kwargs={"evaluator_prompt": style}))
    cfg = sft.SFTConfig(roles=("evaluator_critique",), teacher="math", teacher_tasks=3, epochs=1, micro_batch_size=2,
                        out=str(tmp_path / "out"), progress=False)
    sft.run_sft(cfg, tc, model=copy.deepcopy(tiny_base[0]), tok=tiny_base[1])
    rows = [json.loads(x) for x in (tmp_path / "out" / "examples" / "evaluator_critique.jsonl").read_text().splitlines()]
    return rows, {t["question"]: t["answer"] for t in __import__("workflows").load_data(tc)[0]}


def test_the_math_teacher_writes_the_check_line_when_the_train_config_asks_for_it(_tiny_base, tmp_path):
    """env_kwargs evaluator_prompt="check" in the train config: sft.py's teacher critiques open with the
    check line and their prompts are the evaluator_check prompt (what the judge sees at RL time)."""
    from agents.math_team import check_line
    rows, truths = _math_teacher_rows("check", _tiny_base, tmp_path)
    assert len(rows) == 6 and all(r["reply"].startswith("Check: ") for r in rows)
    assert all("First check the answer yourself" in r["prompt"] for r in rows)
    for r in rows:
        q = next(q for q in truths if f"Problem: {q}\n" in r["prompt"])
        assert r["reply"].startswith(check_line(truths[q]))


def test_the_math_teacher_writes_the_blind_judges_two_turns_when_the_train_config_asks_for_it(_tiny_base, tmp_path):
    """env_kwargs evaluator_prompt="blind": sft.py's teacher writes the judge's check turn (the problem
    only) and its verdict turns after it, the prompts the env gives that judge at RL time."""
    from agents.math_team import check_line
    rows, truths = _math_teacher_rows("blind", _tiny_base, tmp_path)
    checks = [r for r in rows if "Solution:" not in r["prompt"]]
    assert len(rows) == 9 and len(checks) == 3 and all("Before you see the solution" in r["prompt"] for r in rows)
    for r in checks:
        assert r["reply"] == check_line(truths[next(q for q in truths if f"Problem: {q}\n" in r["prompt"])])
    for r in rows:
        if r not in checks:
            truth = truths[next(q for q in truths if f"Problem: {q}\n" in r["prompt"])]
            assert r["reply"].startswith("The solution ") and r["prompt"].index(check_line(truth)) < r["prompt"].index("Solution:")


def test_the_math_teacher_writes_the_digit_judges_two_turns_when_the_train_config_asks_for_it(_tiny_base, tmp_path):
    """env_kwargs evaluator_prompt="digit": sft.py's teacher writes the digit judge's check turn (the sign
    and last digit, the problem only) and its verdict turns after it, in the env's prompts."""
    from agents.math_team import digit_check_line
    rows, truths = _math_teacher_rows("digit", _tiny_base, tmp_path)
    checks = [r for r in rows if "Solution:" not in r["prompt"]]
    assert len(rows) == 9 and len(checks) == 3 and all("the sign and the last digit only" in r["prompt"] for r in rows)
    for r in rows:
        q = next(q for q in truths if f"Problem: {q}\n" in r["prompt"])
        if r in checks:
            assert r["reply"] == digit_check_line(q, truths[q]) and "ends in" in r["reply"]
        else:
            assert r["reply"].startswith("The solution ") and "end in your digit" in r["prompt"]
            assert r["prompt"].index(digit_check_line(q, truths[q])) < r["prompt"].index("Solution:")


def test_the_scripted_teacher_gives_the_math_refiner_its_lessons_under_derived_verdicts(_tiny_base, tmp_path):
    """teacher=scripted under a math-team train config whose verdicts the env derives from the digit check:
    the refiner's examples are the env's own prompts after a caught mistake (never taught) and the fix."""
    from config import load_config_file
    tc = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    tc = dataclasses.replace(tc, data=dataclasses.replace(tc.data, env_kwargs={"evaluator_prompt": "digit",
                                                                                "verdict_from_check": True}))
    cfg = sft.SFTConfig(roles=("generator_refinement",), teacher="scripted", teacher_tasks=3, epochs=1,
                        micro_batch_size=2, out=str(tmp_path / "out"), progress=False)
    summary = sft.run_sft(cfg, tc, model=copy.deepcopy(_tiny_base[0]), tok=_tiny_base[1])
    rows = [json.loads(x) for x in (tmp_path / "out" / "examples" / "generator_refinement.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["source"] == "teacher:repair" for r in rows)
    for r in rows:
        assert "Verdict: Incorrect" in r["prompt"] and "Check: " in r["prompt"]
        assert r["reply"].startswith("The answer must ") and "\\boxed{" in r["reply"]
    assert summary["teacher"]["teacher:mistake/generator_initial"] == 3


def test_every_shipped_sft_config_loads_with_its_train_config():
    """configs/sft/*.py: each loads, names a train config that loads, and trains roles that config has."""
    from config import load_config_file
    paths = sorted((ROOT / "configs" / "sft").glob("*.py"))
    assert len(paths) >= 7
    for p in paths:
        cfg = sft.load_sft_config(str(p))
        if cfg.train_config is None:
            continue
        tc = load_config_file(str(ROOT / cfg.train_config))
        assert set(cfg.roles) <= {r.name for r in tc.roles}, p.name


# ---------------------------------------------------------------------- pack_turns


def _conversation(tok, n, observation="doc {i} says {v}."):
    """One tool agent's n turns, each prompt the chat template re-rendering the last prompt + reply + an
    observation (what a researcher's rounds and a ReAct agent's steps look like)."""
    msgs = [{"role": "system", "content": "You answer with tools."}, {"role": "user", "content": "Where is Lomi?"}]
    out = []
    for i in range(n):
        prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        reply = f"Action: search[Lomi {i}]"
        out.append(sft.tokenize(sft.Example("a", "a", prompt, reply, True, f"x:{i}"), tok))
        msgs += [{"role": "assistant", "content": reply},
                 {"role": "user", "content": "Observation: " + observation.format(i=i, v=7 * i)}]
    return out


def test_the_chunked_head_gives_sft_the_loss_and_gradient_whole_logits_give(tiny):
    """SFTConfig.logits_chunk_tokens: loss_sum with the vocabulary projection 5 tokens at a time (ppo.head_logprobs)
    gives the loss, token count and adapter gradient of whole logits (0), on packed and padded rows; and no
    vocabulary-wide tensor has more rows than the chunk or the rows' one projected column."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Widest(TorchDispatchMode):
        def __init__(self, vocab):
            super().__init__()
            self.vocab, self.rows = vocab, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dim() and out.shape[-1] == self.vocab and \
                    func.overloadpacket.__name__ not in ("t", "transpose", "expand", "view", "_unsafe_view", "slice"):
                self.rows = max(self.rows, out.numel() // self.vocab)
            return out

    model, tok = tiny
    exs = sft.pack_conversations(_conversation(tok, 3) + [sft.tokenize(sft.Example(
        "a", "a", short_chat(tok, "a", "What is 2 + 3?"), "It is 5.", True, "y"), tok)])
    lora.add_lora(model, ["a"], 4, 8.0, 0.0, ("q_proj", "v_proj"), seed=0)
    with torch.no_grad():
        for p in lora.adapter_parameters(model, "a"):
            p.normal_(0, 0.05)
    lora.set_adapter(model, "a")
    out = {}
    for chunk in (5, 0):
        model.zero_grad(set_to_none=True)
        with Widest(model.lm_head.weight.shape[0]) as w:
            s, n = sft.loss_sum(model, exs, tok.pad_token_id, "cpu", chunk)
            (s / n).backward()
        out[chunk] = (float(s.detach()), n, [p.grad.clone() for p in lora.adapter_parameters(model, "a")], w.rows)
    (s5, n5, g5, w5), (s0, n0, g0, w0) = out[5], out[0]
    assert n5 == n0 and s5 == pytest.approx(s0, rel=1e-5)
    for x, y in zip(g5, g0):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)
    assert w5 <= max(5, len(exs)) < n0 <= w0, (w5, w0)


def test_pack_turns_gives_every_reply_the_loss_and_gradient_it_has_alone(tiny):
    model, tok = tiny
    conv = _conversation(tok, 3)
    alone = sft.tokenize(sft.Example("a", "a", short_chat(tok, "a", "What is 2 + 3?"), "It is 5.", True, "y"), tok)
    exs = conv + [alone]
    packed = sft.pack_conversations(exs)
    assert [e.turns() for e in packed] == [3, 1] and packed[1] is alone
    assert packed[0].ids == conv[-1].ids and packed[0].source == "x:0"
    assert sum(e.reply_tokens() for e in packed) == sum(e.reply_tokens() for e in exs)
    assert sum(len(e.ids) for e in packed) < 0.6 * sum(len(e.ids) for e in exs)  # the shared prefix read once
    lora.add_lora(model, ["a"], 4, 8.0, 0.0, ("q_proj", "v_proj"), seed=0)
    with torch.no_grad():  # B = 0 at init would hide a wrong mask from the adapter's gradient
        for p in lora.adapter_parameters(model, "a"):
            p.normal_(0, 0.05)
    lora.set_adapter(model, "a")
    grads = []
    for rows in (exs, packed):
        model.zero_grad(set_to_none=True)
        s, n = sft.loss_sum(model, rows, tok.pad_token_id, "cpu")
        (s / n).backward()
        grads.append((float(s.detach()), n, [p.grad.clone() for p in lora.adapter_parameters(model, "a")]))
    (s1, n1, g1), (s2, n2, g2) = grads
    assert n1 == n2 and abs(s1 - s2) < 1e-4 * abs(s1)
    for x, y in zip(g1, g2):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)
    assert sft.mean_loss(model, "a", packed, 2, tok.pad_token_id, "cpu") == pytest.approx(
        sft.mean_loss(model, "a", exs, 2, tok.pad_token_id, "cpu"), rel=1e-5)


def test_pack_turns_joins_only_turns_that_extend_one_another_token_for_token(tiny):
    _, tok = tiny
    a = _conversation(tok, 2)
    b = _conversation(tok, 2, observation="another page {i}.")  # its second turn extends a[0] too
    rewritten = sft.tokenize(sft.Example("a", "a", a[1].prompt.replace("You answer with tools.", "You answer."),
                                         a[1].reply, True, "r"), tok)  # a template that rewrites the history
    packed = sft.pack_conversations([a[0], a[1], b[1], rewritten])
    assert [(e.turns(), e.source) for e in packed] == [(2, "x:0"), (1, "x:1"), (1, "r")]
    assert packed[0].ids == a[1].ids and packed[1].ids == b[1].ids  # the first continuation joins, the other not
    assert packed[0].reply_spans() == [(a[0].n_prompt, len(a[0].ids)), (a[1].n_prompt, len(a[1].ids))]
    # a repeated first turn is a conversation of its own, and the second continuation may join it
    packed = sft.pack_conversations([a[0], a[1], b[1], a[0]])
    assert [(e.turns(), e.ids) for e in packed] == [(2, a[1].ids), (2, b[1].ids)]
    assert [e.turns() for e in sft.pack_conversations([a[0], a[0]])] == [1, 1]


def test_steps_of_keeps_a_conversation_in_one_step_and_at_most_a_step_of_turns(tiny):
    _, tok = tiny
    singles = [sft.tokenize(sft.Example("a", "a", short_chat(tok, "a", q), a, True, "x"), tok) for q, a in TASKS]
    order = list(range(len(singles)))[::-1]
    assert sft.steps_of(singles, order, 3) == [[singles[i] for i in order[s:s + 3]] for s in range(0, 8, 3)]
    units = sft.pack_conversations(_conversation(tok, 3)) + singles[:4] + sft.pack_conversations(_conversation(tok, 5))
    steps = sft.steps_of(units, list(range(len(units))), 4)
    assert [[e.turns() for e in s] for s in steps] == [[3, 1], [1, 1, 1], [5]]  # a longer one alone


def test_min_steps_is_a_floor_when_packed_steps_hold_fewer_turns(tiny):
    """Packed, an epoch can take more steps than turns / per_step (a conversation never splits; a longer
    one trains alone); min_steps still counts the steps taken, and an epoch is never cut short."""
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    lora.add_lora(model, ["a"], 4, 8.0, 0.0, ("q_proj", "v_proj"), seed=1)
    units = sft.pack_conversations(_conversation(tok, 3) + _conversation(tok, 3, observation="page {i}."))
    assert [e.turns() for e in units] == [3, 3]  # 6 turns: 3 steps of 2 unpacked, 2 steps packed
    for min_steps, want in [(0, (2, 1)), (5, (6, 3)), (6, (6, 3)), (7, (8, 4))]:
        cfg = sft.SFTConfig(epochs=1, min_steps=min_steps, micro_batch_size=1, grad_accum=2, lr=1e-3, progress=False)
        rows = []
        res = sft.train_adapter(model, "a", units, [], cfg, tok.pad_token_id, "cpu", rows.append)
        assert (res["steps"], res["epochs"]) == want and res["steps"] == sum("loss" in r for r in rows)
        assert (res["train_examples"], res["train_sequences"]) == (6, 2)  # examples count turns
    # eval_every: a held-out eval after every 2nd step, the last step's once (the final one), extra epochs too
    rows = []
    cfg = sft.SFTConfig(epochs=1, min_steps=5, eval_every=2, micro_batch_size=1, grad_accum=2, lr=1e-3, progress=False)
    sft.train_adapter(model, "a", units, units[:1], cfg, tok.pad_token_id, "cpu", rows.append)
    assert [r["step"] for r in rows if "val_loss" in r] == [0, 2, 4, 6]


def test_pack_turns_continues_a_prefix_shorter_than_its_key():
    """A turn under 8 tokens long is still a prefix the next turn can extend (the lookup key is its tail)."""
    a = sft.Example("a", "a", "p", "r", True, "s", ids=[1, 2, 3], n_prompt=2)
    b = sft.Example("a", "a", "p", "r", True, "t", ids=[1, 2, 3, 9, 9, 9, 9, 9, 9, 9, 4], n_prompt=10)
    packed = sft.pack_conversations([a, b])
    assert [e.turns() for e in packed] == [2] and packed[0].reply_spans() == [(2, 3), (10, 11)]


def test_pack_turns_off_keeps_the_fingerprint_of_sfts_made_before_it():
    """pack_turns off leaves the options' hash as it was before the option existed (a finished SFT stays
    done); on, it is another SFT."""
    import hashlib
    base = sft.SFTConfig(out="o")
    off, on = (sft.fingerprint(dataclasses.replace(base, pack_turns=x), None, [], {})["options"] for x in (False, True))
    old = {k: v for k, v in dataclasses.asdict(base).items()
           if k not in ("out", "progress", "train_config", "data", "model", "dtype", "pack_turns")}
    assert off == hashlib.sha256(json.dumps(old, sort_keys=True, default=str).encode()).hexdigest()[:16] != on


def test_pack_turns_in_a_teachers_sft_packs_the_researchers_rounds(_tiny_base, tmp_path):
    """The research team's scripted SFT with pack_turns: the researcher's rounds train as conversations
    (fewer sequences, fewer tokens, every turn kept), the one-turn roles as before."""
    from config import load_config_file
    tc = load_config_file(str(ROOT / "configs" / "cpu" / "research.py"))
    tc = dataclasses.replace(tc, model=dataclasses.replace(tc.model, spec="tiny"))
    res = {}
    for pack in (False, True):
        cfg = sft.SFTConfig(teacher="scripted", teacher_tasks=3, epochs=1, lr=1e-3, pack_turns=pack, progress=False,
                            out=str(tmp_path / str(pack)))
        res[pack] = sft.run_sft(cfg, tc, model=copy.deepcopy(_tiny_base[0]), tok=_tiny_base[1])["losses"]
    p = res[True]["researcher"]["packed"]
    n = res[False]["researcher"]
    assert p["turns"] == n["train_examples"] + n["val_examples"] and p["sequences"] < p["turns"]
    r = res[True]["researcher"]
    assert (r["train_examples"] + r["val_examples"], r["train_sequences"] + r["val_sequences"]) == (p["turns"], p["sequences"])
    assert p["tokens"] < 0.7 * p["tokens_unpacked"]
    assert "packed" not in n and res[True]["planner"]["packed"]["sequences"] == res[True]["planner"]["packed"]["turns"]
    # the held-out loss before training is the same number packed or not (the same adapters, the same turns)
    assert res[True]["researcher"]["val_loss_before"] == pytest.approx(n["val_loss_before"], rel=1e-4)


def test_the_pack_turns_benchmark_runs_and_checks_its_arms_agree():
    """bench/sft_pack.py on the tiny model: both arms over the same turns, their loss sums equal (it asserts),
    the packed arm reading fewer tokens."""
    import os
    import re
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "bench/sft_pack.py", "--model", "tiny", "--tasks", "3", "--conversations", "2",
                        "--rounds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    ratio = float(re.search(r"packed / unpacked: tokens ([0-9.]+)", r.stdout).group(1))
    assert 0 < ratio < 0.7


def test_a_second_sft_into_one_out_is_refused_naming_the_first(_tiny_base, tmp_path):
    """Two sft.py into one --out both ran: a loss log of both runs under a summary that says done. --out is locked
    (rundir.DirLock): the second is one line naming the holder, and writes nothing."""
    import subprocess
    import sys
    from rundir import DirLock
    data, out = tmp_path / "t.jsonl", tmp_path / "o"
    write(data, good_records(_tiny_base[1], short_chat)[:2])
    with DirLock(out, "another sft.py"):
        r = subprocess.run([sys.executable, "sft.py", "--data", str(data), "--roles", "generator_initial", "--out",
                            str(out), "--no-progress"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert r.stderr.startswith(f"error: {out} is in use by another sft.py (pid {os.getpid()} on "), r.stderr
    assert [p.name for p in out.iterdir()] == [".lock"]  # nothing of the refused run


def test_a_torn_summary_is_no_finished_sft_and_the_sft_runs_again(_tiny_base, tmp_path, capsys):
    """A torn summary.json was read as a finished SFT of another everything: every rerun refused, forever (and a
    recipe's SFT stage never recovered). It is no finished SFT: a note, and the SFT runs again."""
    model, tok = _tiny_base
    data, out = tmp_path / "t.jsonl", tmp_path / "o"
    write(data, good_records(tok, short_chat)[:2])
    cfg = sft.SFTConfig(data=(str(data),), roles=("generator_initial",), epochs=1, grad_accum=1, val_frac=0,
                        out=str(out), progress=False)
    sft.run_sft(cfg, model=copy.deepcopy(model), tok=tok)
    first = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text('{"config": {"da')
    capsys.readouterr()
    sft.run_sft(cfg, model=copy.deepcopy(model), tok=tok)
    assert f"note: {out / 'summary.json'} is unreadable (JSONDecodeError): the SFT runs again" in capsys.readouterr().out
    again = json.loads((out / "summary.json").read_text())
    assert again["fingerprint"] == first["fingerprint"] and again["adapters"] == first["adapters"]
