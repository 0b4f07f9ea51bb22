"""The 3-agent math team on SmolLM2-135M-Instruct with ONE ADAPTER PER ROLE: arm (c) of docs/experiments.md's
experiment ("Does the team beat one agent?"), and with the SFT'd evaluator and its per-role settings
arm (d):
    python train.py --config configs/smollm2_math_roles.py --roles.1.init-from runs/smollm2_sft/evaluator_critique \
        --roles.1.lr 5e-5 --roles.1.frozen-steps 8 --roles.1.adv-estimator reinforce++
It is the CPU demo (configs/smollm2_math_cpu.py) with each role on its own adapter, at the
experiment's budget (24 steps, val = all 500 problems, greedy, at steps 0, 12 and 24; the demo is cut
to 8 steps and 150 problems); the demo's one shared adapter, arm (b), beat this one (0.372 vs 0.338 on
500 val problems at step 24). Everything else is the demo's: arithmetic of levels 1-2 (data/arith12_*); a judge paid +-1 against the truth and trained only on the groups whose judged
solutions differ, a refiner paid relative to the answer it was given."""
import dataclasses
from pathlib import Path

from config import load_config_file

demo = load_config_file(str(Path(__file__).with_name("smollm2_math_cpu.py")))
config = dataclasses.replace(
    demo,
    roles=tuple(dataclasses.replace(r, adapter=None) for r in demo.roles),  # None: an adapter named after the role
    data=dataclasses.replace(demo.data, val_size=None),
    trainer=dataclasses.replace(demo.trainer, total_steps=24, save_freq=12, test_freq=12,
                                output_dir="runs/smollm2_math_roles"),
)
