"""Golden metrics of a fixed tiny run: any change to the numbers the trainer produces shows here.
Update them only for a deliberate fix, and say which in the commit:
    TROUPE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py"""
import dataclasses
import json
import os
from pathlib import Path

import pytest

import train
from config import load_config_file

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "tiny_toy.json"
RUNS = {  # name -> algo overrides, on configs/tiny_toy.py for 3 steps
    "grpo_kl_in_reward": dict(kl_coef=0.1, kl_in_reward=True, kl_kind="low_var_kl"),
    "rloo_kl_loss_seqnorm": dict(adv_estimator="rloo", kl_coef=0.1, loss_agg="seq-mean-token-sum-norm", ppo_epochs=2,
                                 mini_batch_size=16),
    "gae": dict(adv_estimator="gae", lam=0.95),
}


def run(tmp_path, algo):
    cfg = load_config_file(str(ROOT / "configs" / "tiny_toy.py"))
    cfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, **algo), trainer=dataclasses.replace(
        cfg.trainer, total_steps=3, output_dir=str(tmp_path), resume="none"))
    train.main(cfg)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_golden_metrics(tmp_path, name):
    got = run(tmp_path, RUNS[name])
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("TROUPE_UPDATE_GOLDEN") == "1":
        golden[name] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    want = golden[name]
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in w:
            assert g[k] == pytest.approx(w[k], rel=1e-3, abs=1e-5), (g["step"], k)
