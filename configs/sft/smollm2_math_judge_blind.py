"""SFT of arm (e-blind)'s judge (configs/smollm2_math_judge_blind.py): arm (e)'s judge SFT
(configs/sft/smollm2_math_judge.py: the math teacher for 200 training tasks, the base team's own samples
first) in the blind judge's two turns: per task its check line seeing the problem only, then a verdict
on a right and on a wrong solution after it:
    python sft.py --config configs/sft/smollm2_math_judge_blind.py  # -> runs/smollm2_sft_blind/evaluator_critique
Training tasks only: the validation set is never read."""
import dataclasses
from pathlib import Path

from sft import load_sft_config

config = dataclasses.replace(load_sft_config(str(Path(__file__).with_name("smollm2_math_evaluator.py"))),
                             train_config="configs/smollm2_math_judge_blind.py", out="runs/smollm2_sft_blind")
