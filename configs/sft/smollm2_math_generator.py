"""SFT of arm (h)'s generator (docs/experiments.md): sft.py's scripted teacher on the team whose verdicts the env
derives from the judge's digit check (configs/smollm2_math_refiner_nophases.py), the first 200 training tasks,
the generator's turns only: the right solution in the words the refiner is taught and arm (a-sft)'s solver
learned ("79 - 26 = 53, so the answer is \\boxed{53}."; MathTeamEnv.scripted_replies), in the generator's own
prompt. The settings of the other SFTs (lr 2e-4, 2 epochs, micro-batch 4 x 2):
    python sft.py --config configs/sft/smollm2_math_generator.py  # -> runs/smollm2_sft_generator/generator_initial
Training tasks only: the validation set is never read."""
import dataclasses
from pathlib import Path

from sft import load_sft_config

refiner = load_sft_config(str(Path(__file__).with_name("smollm2_math_refiner.py")))
config = dataclasses.replace(refiner, train_config="configs/smollm2_math_refiner_nophases.py", roles=("generator_initial",), out="runs/smollm2_sft_generator")
