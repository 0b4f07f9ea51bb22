"""SFT of arm (e-digit)'s judge (configs/smollm2_math_judge_digit.py): arm (e-blind)'s judge SFT
(configs/sft/smollm2_math_judge_blind.py: the math teacher for 200 training tasks, the base team's own
samples first) with the digit check: per task its check line seeing the problem only (the sign and last
digit, worked from the operands), then a verdict on a right and on a wrong solution after it; the wrong
solutions are ones the check catches (own samples that end in the right digit are skipped):
    python sft.py --config configs/sft/smollm2_math_judge_digit.py  # -> runs/smollm2_sft_digit/evaluator_critique
Training tasks only: the validation set is never read."""
import dataclasses
from pathlib import Path

from sft import load_sft_config

config = dataclasses.replace(load_sft_config(str(Path(__file__).with_name("smollm2_math_evaluator.py"))),
                             train_config="configs/smollm2_math_judge_digit.py", out="runs/smollm2_sft_digit")
