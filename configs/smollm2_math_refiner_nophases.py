"""Arm (g) of the team-versus-one-agent experiment (docs/experiments.md, pre-registered): arm (e-refine),
configs/smollm2_math_refiner.py, with ONE change: no phases: every role trains at every one of the 24 steps
(roles.train_windows None), as in the teams before phases existed. Phases were built so the judge's verdicts
would not erode while the generator changed under them; with verdicts the env derives from the judge's check
(arm e-derived) there is no verdict left to erode, and in (e-derived) the check did not move in its phase
(right on 73% of val problems before, 74% after), while the generator trained in 16 of the 24 steps that
(a)'s one solver trains in. Run after both SFTs, as (e-refine):
    python train.py --config configs/smollm2_math_refiner_nophases.py \\
        --roles.1.init-from runs/smollm2_sft_digit/evaluator_critique \\
        --roles.2.init-from runs/smollm2_sft_refiner/generator_refinement \\
        --trainer.output-dir runs/arms/g_nophases --trainer.test-freq 24"""
import dataclasses
from pathlib import Path

from config import load_config_file

refine = load_config_file(str(Path(__file__).with_name("smollm2_math_refiner.py")))
config = dataclasses.replace(
    refine,
    roles=tuple(dataclasses.replace(r, train_windows=None) for r in refine.roles),
    trainer=dataclasses.replace(refine.trainer, output_dir="runs/smollm2_math_refiner_nophases"),
)
