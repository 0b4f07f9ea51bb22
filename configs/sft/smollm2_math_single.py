"""SFT of arm (a-sft)'s solver (docs/experiments.md): sft.py's scripted teacher on the single-agent baseline
(configs/math_single.py), the first 200 training tasks, the right solution in the words the team's refiner is
taught ("79 - 26 = 53, so the answer is \\boxed{53}."; envs/math_single.py MathSingleEnv.scripted_replies):
the teacher's solutions that arm (e-refine)'s refiner saw, given to one agent. The settings of the refiner's
SFT (configs/sft/smollm2_math_refiner.py: lr 2e-4, 2 epochs, micro-batch 4 x 2):
    python sft.py --config configs/sft/smollm2_math_single.py  # -> runs/smollm2_sft_single/solver
Training tasks only: the validation set is never read."""
import dataclasses
from pathlib import Path

from sft import load_sft_config

refiner = load_sft_config(str(Path(__file__).with_name("smollm2_math_refiner.py")))
config = dataclasses.replace(refiner, train_config="configs/math_single.py", roles=("solver",), out="runs/smollm2_sft_single")
