"""Arm (e-refine) of the team-versus-one-agent experiment (docs/experiments.md, pre-registered): arm
(e-derived), configs/smollm2_math_judge_derived.py, with ONE change: the refiner starts from an SFT on the
scripted teacher's repair lessons (configs/sft/smollm2_math_refiner.py: after a mistake the digit check
catches, the claimed sign and last digit, then the right result). (e-derived)'s judge held through RL
(balanced accuracy 0.930 -> 0.899) but its refiner, untaught, fixed none of the 223 caught wrong first answers
it refined at step 24 and broke 5: nothing had shown it how to use the check's digit, and by then 92 of those
mistakes were within 9 of the truth (49 a slip of the last digit or the sign that the check named rightly). Run after both SFTs:
    python sft.py --config configs/sft/smollm2_math_refiner.py   # -> runs/smollm2_sft_refiner/generator_refinement
    python train.py --config configs/smollm2_math_refiner.py \\
        --roles.1.init-from runs/smollm2_sft_digit/evaluator_critique \\
        --roles.2.init-from runs/smollm2_sft_refiner/generator_refinement \\
        --trainer.output-dir runs/arms/e_refine --trainer.test-freq 24
Everything else (data, seeds, 24 steps, phases: generator and refiner 1-8 and 17-24, judge 9-16; lr, val of
500 greedy) is (e-derived)'s."""
import dataclasses
from pathlib import Path

from config import load_config_file

derived = load_config_file(str(Path(__file__).with_name("smollm2_math_judge_derived.py")))
config = dataclasses.replace(derived, trainer=dataclasses.replace(derived.trainer, output_dir="runs/smollm2_math_refiner"))
