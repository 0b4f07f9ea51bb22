"""Trajectory files, eval.py and play.py on a real tiny run."""
import dataclasses
import json
from pathlib import Path

import pytest

import eval as troupe_eval
import play
import train
import trajectories
from config import load_config_file

ROOT = Path(__file__).resolve().parent.parent
# one worker runs this file: its module fixture (a real run) is then built once, not on every worker
pytestmark = pytest.mark.xdist_group("eval_play")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = load_config_file(str(ROOT / "configs" / "tiny_math_3agent.py"))
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=str(out), resume="none",
                                                                total_steps=2, test_freq=2, save_freq=2))
    train.main(cfg)
    return out


def test_trajectory_files_hold_what_the_agents_said(trained):
    recs = trajectories.read(trained / "trajectories" / "train_step_000001.jsonl")
    assert recs and all(r["split"] == "train" and r["step"] == 1 for r in recs)
    r = recs[0]
    assert r["task"]["question"] and r["turns"][0]["role"] == "generator_initial"
    t = r["turns"][0]
    assert t["prompt"].startswith("<|im_start|>system") and t["reply_tokens"] >= 1 and t["advantage"] is not None
    val = trajectories.read(trained / "trajectories" / "val_step_000002.jsonl")
    assert len(val) == 4 and all(v["turns"][0]["advantage"] is None for v in val)  # every val episode, not trained
    assert "[generator_initial]" in trajectories.show(val[0])


def test_eval_matches_the_in_loop_eval_and_never_touches_the_log(trained):
    log = (trained / "metrics.jsonl").read_bytes()
    ck = trained / "checkpoints" / "step_000002"
    res = troupe_eval.main(["--checkpoint", str(ck), "--n-samples", "2"])
    in_loop = [json.loads(x) for x in log.decode().splitlines() if '"val/' in x][-1]
    for k, v in in_loop.items():
        if k.startswith("val/"):
            assert res["greedy/" + k[4:]] == pytest.approx(v), k  # the same numbers as train.py's val at step 2
    assert {"mean@2/team", "pass@2/team", "mean@2/generator_initial"} <= set(res)
    assert (trained / "metrics.jsonl").read_bytes() == log
    saved = json.loads((ck / "eval" / "results.json").read_text())
    assert saved["step"] == 2 and len(trajectories.read(ck / "eval" / "sampled.jsonl")) == 2 * saved["tasks"]
    base = troupe_eval.main(["--config", str(ROOT / "configs" / "tiny_math_3agent.py"), "--base", "--limit", "2",
                             "--out", str(trained / "base_eval")])
    assert base["base"] and base["tasks"] == 2


CFG = str(ROOT / "configs" / "tiny_math_3agent.py")
# name -> (eval.py's arguments, the one line it ends with): each was a traceback, or accepted
BAD_ARGS = {
    "no such checkpoint": (["--checkpoint", "{tmp}/nope"], "{tmp}/nope cannot be loaded: {tmp}/nope is not a directory"),
    "a garbage checkpoint": (["--checkpoint", "{tmp}/junk"], "{tmp}/junk cannot be loaded: {tmp}/junk/manifest.json is unreadable"),
    "no such config": (["--config", "{tmp}/nope.py", "--base"], "config file {tmp}/nope.py does not exist"),
    "a config without config": (["--config", "{tmp}/x.py", "--base"], "{tmp}/x.py must define `config = Config(...)`"),
    "no such data": (["--config", CFG, "--base", "--data", "{tmp}/nope.jsonl"], "--data: {tmp}/nope.jsonl does not exist"),
    "garbage data": (["--config", CFG, "--base", "--data", "{tmp}/junk.jsonl"], "{tmp}/junk.jsonl:1: not UTF-8 text"),
    "negative --n-samples": (["--config", CFG, "--base", "--limit", "1", "--n-samples", "-1"], "--n-samples must be an integer >= 0, got -1"),
    "negative --maj-k": (["--config", CFG, "--base", "--limit", "1", "--maj-k", "-2"], "--maj-k must be an integer >= 0, got -2"),
    "--limit 0": (["--config", CFG, "--base", "--limit", "0"], "--limit must be an integer >= 1, got 0"),
    "negative --limit": (["--config", CFG, "--base", "--limit", "-1"], "--limit must be an integer >= 1, got -1"),
    "--threshold nan": (["--config", CFG, "--base", "--limit", "1", "--threshold", "nan"], "--threshold must be a finite number"),
    "--out a file": (["--config", CFG, "--base", "--limit", "1", "--out", "{tmp}/x.py"], "--out {tmp}/x.py is a file, not a directory"),
    "--out under a file": (["--config", CFG, "--base", "--limit", "1", "--out", "{tmp}/x.py/ev"], "--out {tmp}/x.py/ev: {tmp}/x.py is a file"),
    "--out through a symlink loop": (["--config", CFG, "--base", "--limit", "1", "--out", "{tmp}/loop/ev"],
                                     "--out {tmp}/loop/ev: Symlink loop"),
}


@pytest.mark.parametrize("case", list(BAD_ARGS))
def test_a_bad_argument_is_one_line_before_any_model_loads(case, tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "manifest.json").write_bytes(b"\x00\xff")
    (tmp_path / "x.py").write_text("x = 1\n")
    (tmp_path / "junk.jsonl").write_bytes(b"\xff\xfe junk\n")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    args, want = BAD_ARGS[case]
    with pytest.raises(SystemExit) as e:
        troupe_eval.main([a.replace("{tmp}", str(tmp_path)) for a in args])
    msg = str(e.value.code)
    assert msg.startswith("error: " + want.replace("{tmp}", str(tmp_path))) and "\n" not in msg, msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk", "junk.jsonl", "loop", "x.py"]  # nothing written


def test_a_bad_argument_exits_non_zero_with_one_line():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "eval.py", "--config", CFG, "--base", "--data", "/nope/tasks.jsonl"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == ["error: --data: /nope/tasks.jsonl does not exist"], r.stderr


def test_out_inside_a_checkpoint_is_refused(trained, tmp_path):
    """--out <checkpoint>/adapters wrote results.json and the episodes among the adapters: the checkpoint was unusable."""
    from rundir import checkpoint_config
    ck = trained / "checkpoints" / "step_000002"
    before = sorted(p.relative_to(ck) for p in ck.rglob("*") if not p.is_relative_to(ck / "eval"))
    for out, owned in ((ck / "adapters", " (its adapters)"), (ck / "adapters" / "x", " (its adapters)"),
                       (ck / "tokenizer", " (its tokenizer)"), (ck, "")):
        with pytest.raises(SystemExit) as e:
            troupe_eval.main(["--checkpoint", str(ck), "--out", str(out)])
        assert str(e.value.code).startswith(f"error: --out {out} is inside the checkpoint {ck}{owned}: "), e.value.code
    assert sorted(p.relative_to(ck) for p in ck.rglob("*") if not p.is_relative_to(ck / "eval")) == before
    checkpoint_config(ck)  # still loads
    troupe_eval.check_out(ck / "eval_maj")  # a new folder in it is fine (compare.py's docstring uses one)


def test_majority_vote_by_hand():
    vote = troupe_eval.majority_vote
    assert vote([("7", 1.0), ("6", 0.0), ("7.0", 1.0)]) == ("7", 1.0, {"7": 2, "6": 1})  # normalised: 7.0 = 7
    assert vote([("6", 0.0), ("7", 1.0)])[:2] == ("6", 0.0)  # a tie goes to the answer seen first
    assert vote([(None, 0.0), (None, 0.0), ("7", 1.0)])[:2] == ("7", 1.0)  # no answer does not vote
    assert vote([(None, 0.0)]) == (None, 0.0, {})


def test_eval_maj_k_writes_one_voted_row_per_task(trained, tmp_path):
    res = troupe_eval.main(["--checkpoint", str(trained / "checkpoints" / "step_000002"), "--maj-k", "3",
                            "--out", str(tmp_path / "maj")])
    rows = [json.loads(x) for x in (tmp_path / "maj" / "majority.jsonl").read_text().splitlines()]
    assert res["maj_k"] == 3 and len(rows) == res["tasks"] == 4
    samples = trajectories.read(tmp_path / "maj" / "sampled.jsonl")
    assert len(samples) == 3 * 4
    for r in rows:  # the vote and its score, recomputed from the sampled episodes of that task
        mine = [e for e in samples if e["task_id"] == r["task_id"]]
        assert r["generations"] == sum(len(e["turns"]) for e in mine)
        assert r["tokens"] == sum(t["reply_tokens"] for e in mine for t in e["turns"])  # the k samples' budget
        assert sum(r["votes"].values()) <= 3 and r["correct"] in (0.0, 1.0)
    assert res["generations_per_task"] == pytest.approx(sum(len(e["turns"]) for e in samples) / 4)
    assert res["tokens_per_task"] == pytest.approx(sum(t["reply_tokens"] for e in samples for t in e["turns"]) / 4)
    assert res["maj@3/team"] == pytest.approx(sum(r["correct"] for r in rows) / 4)


def test_eval_of_a_config_uses_its_init_from_adapters(trained, tmp_path):
    """eval.py --config (no --base) evaluates the config's starting adapters: roles starting from the
    checkpoint's adapters (init_from, as after sft.py) give exactly the checkpoint's greedy numbers."""
    ck = trained / "checkpoints" / "step_000002"
    cfg_file = tmp_path / "from_ckpt.py"
    cfg_file.write_text(
        "import dataclasses\nfrom config import from_dict\nimport json\n"
        f"base = from_dict(json.loads(open({str(ck / 'config.json')!r}).read()))\n"
        f"config = dataclasses.replace(base, roles=tuple(dataclasses.replace(r, init_from={str(ck / 'adapters')!r} + '/' + "
        "(r.adapter or r.name)) for r in base.roles))\n")
    got = troupe_eval.main(["--config", str(cfg_file), "--out", str(tmp_path / "ev")])
    want = json.loads((ck / "eval" / "results.json").read_text()) if (ck / "eval" / "results.json").exists() else \
        troupe_eval.main(["--checkpoint", str(ck)])
    keys = [k for k in want if k.startswith("greedy/")]
    assert keys and all(got[k] == pytest.approx(want[k]) for k in keys)
    a = [t["reply"] for r in trajectories.read(tmp_path / "ev" / "greedy.jsonl") for t in r["turns"]]
    b = [t["reply"] for r in trajectories.read(ck / "eval" / "greedy.jsonl") for t in r["turns"]]
    assert a == b


def test_sampled_scores_by_hand():
    from rollout import Episode, Sample
    cfg = load_config_file(str(ROOT / "configs" / "tiny_toy.py"))
    eps = [Episode(i, i // 2, None, [Sample(i, i // 2, "speaker", 0, [1], [2], [0.0], reward=r)], {"team_reward": r})
           for i, r in enumerate([1.0, 0.0, 0.0, 0.0])]
    s = troupe_eval.sampled_scores(cfg, eps, threshold=1.0)
    assert s["mean@2/speaker"] == 0.25 and s["pass@2/speaker"] == 0.5 and s["pass@2/team"] == 0.5
    assert s["acted/speaker"] == 1.0
    # a role that speaks in 1 of a task's 2 episodes: not a pass@2 from one attempt, but named for what it is
    eps[1].samples.clear()
    s = troupe_eval.sampled_scores(cfg, eps, threshold=1.0)
    assert "pass@2/speaker" not in s and (s["mean@acted/speaker"], s["pass@acted/speaker"]) == (1 / 3, 0.5)
    assert s["acted/speaker"] == 0.75 and s["pass@2/team"] == 0.5


def test_play_prints_every_turn(trained, capsys):
    ep = play.main(["--checkpoint", str(trained / "checkpoints" / "step_000002"), "What is 2 + 2?", "--answer", "4"])
    out = capsys.readouterr().out
    assert ep.samples and all(f"--- {s.role} (turn {s.turn}" in out for s in ep.samples) and "rewards:" in out


def test_export_writes_plain_hf_models_equal_to_base_plus_adapter(trained, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import export
    import lora
    from model import load_model
    ck = trained / "checkpoints" / "step_000002"
    dirs = export.export(ck, tmp_path, ["generator_initial"])
    plain = AutoModelForCausalLM.from_pretrained(dirs[0]).eval()
    tok = AutoTokenizer.from_pretrained(dirs[0])
    assert tok.chat_template  # the tokenizer travels with its chat template
    m, _ = load_model("tiny")
    lora.load_adapter(m, "generator_initial", ck / "adapters" / "generator_initial")
    lora.set_adapter(m, "generator_initial")
    ids = torch.tensor([tok.encode("What is 2 + 2?")])
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, m.eval()(ids).logits, atol=1e-4, rtol=1e-4)
        lora.set_adapter(m, None)
        assert not torch.allclose(plain(ids).logits, m(ids).logits, atol=1e-4)  # the adapter is really in there


def test_push_to_hub_uploads_a_peft_adapter_with_a_card_and_fails_clearly_offline(trained, tmp_path):
    import os
    import subprocess
    import sys

    import export
    ck = trained / "checkpoints" / "step_000002"
    d = export.hub_folder(ck, "evaluator_critique", tmp_path)
    card = (d / "README.md").read_text()
    base = json.loads((d / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert f"base_model: {base}" in card and "library_name: peft" in card
    assert (d / "adapter_model.safetensors").read_bytes() == (ck / "adapters/evaluator_critique/adapter_model.safetensors").read_bytes()
    import lora
    from model import load_model
    m, _ = load_model("tiny")
    lora.load_adapter(m, "evaluator_critique", d)  # the uploaded folder is a loadable adapter
    # no hub here: a closed local port stands in for an unreachable one; the local export stays
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "hf_x", "HF_HUB_ETAG_TIMEOUT": "2"}
    r = subprocess.run([sys.executable, "export.py", "--checkpoint", str(ck), "--out", str(tmp_path / "x"),
                        "--adapter", "generator_initial", "--push-to-hub", "me/team"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode != 0 and "could not push adapter 'generator_initial' to the hub repo 'me/team-generator_initial'" in r.stderr, r.stderr[-2000:]
    assert (tmp_path / "x" / "generator_initial" / "config.json").exists()
    assert (tmp_path / "x" / "hub" / "generator_initial" / "README.md").exists()


def test_an_eval_into_a_used_folder_keeps_no_file_of_the_earlier_one(trained, tmp_path):
    """A greedy eval into the folder of an earlier --maj-k eval left its majority.jsonl and sampled.jsonl, and
    compare.py scored the arm by them (a maj@? row for an eval of other data)."""
    import compare
    ck, out = str(trained / "checkpoints" / "step_000002"), tmp_path / "ev"
    troupe_eval.main(["--checkpoint", ck, "--maj-k", "1", "--limit", "1", "--out", str(out)])
    assert (out / "majority.jsonl").exists() and (out / "sampled.jsonl").exists()
    troupe_eval.main(["--checkpoint", ck, "--limit", "1", "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["greedy.jsonl", "results.json"]
    (row,) = compare.main([str(out)])
    assert row["run"] == f"{out} (greedy)" and row["n"] == 1


def test_eval_and_play_check_the_env_kwargs_as_train_does(tmp_path):
    """eval.py and play.py skipped the workflow checks train.py makes (workflows.check_names / check_roles): an
    unknown env keyword was a traceback from inside the rollout. Each is one line naming the field, before any model."""
    bad = tmp_path / "bad.py"
    bad.write_text("import dataclasses\nfrom config import load_config_file\n"
                   f"c = load_config_file({CFG!r})\n"
                   "config = dataclasses.replace(c, data=dataclasses.replace(c.data, env_kwargs={'no_such_knob': 1}))\n")
    want = r"^error: config field data\.env_kwargs: workflow 'math_3agent' refused \{'no_such_knob': 1\}"
    for call in (lambda: troupe_eval.main(["--config", str(bad), "--base", "--limit", "1", "--out", str(tmp_path / "e")]),
                 lambda: play.main(["What is 2 + 2?", "--config", str(bad), "--base"])):
        with pytest.raises(SystemExit, match=want) as e:
            call()
        assert "\n" not in str(e.value.code)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.py"]


def test_export_refuses_an_out_that_is_a_file_and_an_adapter_it_does_not_have(trained, tmp_path):
    """export.py --out a file (or a path under one) was a traceback after the model loaded; --adapter ../x read
    <checkpoint>/adapters/../x and wrote <out>/../x. Each is one line, and nothing is written."""
    import export
    ck = trained / "checkpoints" / "step_000002"
    f = tmp_path / "a_file"
    f.write_text("x")
    cases = [((f, None), f"error: --out {f} is a file, not a directory"),
             ((f / "sub", None), f"error: --out {f / 'sub'}: {f} is a file, not a directory"),
             ((tmp_path / "ex", ["../x"]), f"error: --adapter '../x': {ck} has no such adapter"),
             ((ck / "adapters", None), f"error: --out {ck / 'adapters'} is inside the checkpoint {ck} (its adapters)")]
    for (out, adapters), want in cases:  # what `export.py --checkpoint CK --out OUT [--adapter A]` runs
        with pytest.raises(SystemExit) as e:
            export.export(ck, out, adapters)
        assert str(e.value.code).startswith(want) and "\n" not in str(e.value.code), e.value.code
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"] and f.read_text() == "x"
