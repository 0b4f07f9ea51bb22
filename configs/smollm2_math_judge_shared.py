"""Arm (f), pre-registered (docs/experiments.md): arm (e)'s judge recipe (check prompt, SFT'd in that
style, probes, balanced labels) on the demo's ONE shared adapter. Phases need an adapter per role
(roles sharing an adapter train together), so (f) has none. Run after its SFT
(configs/sft/smollm2_math_judge.py with --train-config configs/smollm2_math_judge_shared.py --out
runs/smollm2_sft_check_shared):
    python train.py --config configs/smollm2_math_judge_shared.py --roles.0.init-from runs/smollm2_sft_check_shared/team \\
        --roles.1.init-from runs/smollm2_sft_check_shared/team --roles.2.init-from runs/smollm2_sft_check_shared/team"""
import dataclasses
from pathlib import Path

from config import load_config_file

demo = load_config_file(str(Path(__file__).with_name("smollm2_math_cpu.py")))
config = dataclasses.replace(
    demo,
    roles=tuple(dataclasses.replace(r, balance_labels=True, max_tokens=48) for r in demo.roles),
    rollout=dataclasses.replace(demo.rollout, max_turns=6),
    data=dataclasses.replace(demo.data, env_kwargs={"probes": True, "evaluator_prompt": "check"}, val_size=None),
    trainer=dataclasses.replace(demo.trainer, total_steps=24, save_freq=12, test_freq=12,  # the experiment's budget, not the demo's
                                output_dir="runs/smollm2_math_judge_shared"),
)
