"""SFT of arm (e)'s judge (configs/smollm2_math_judge.py): configs/sft/smollm2_math_evaluator.py's recipe
(the math teacher's balanced critiques for 200 training tasks, the base team's own samples first) with
that arm's train config, so every critique opens with the check line its evaluator_check prompt asks
for (agents.math_team.check_line):
    python eval.py --config configs/smollm2_math_roles.py --base --data data/arith12_train.jsonl --limit 48 \\
        --n-samples 2 --out runs/smollm2_sft/train_samples
    python sft.py --config configs/sft/smollm2_math_judge.py      # -> runs/smollm2_sft_check/evaluator_critique
Training tasks only: the validation set is never read."""
import dataclasses
from pathlib import Path

from sft import load_sft_config

config = dataclasses.replace(load_sft_config(str(Path(__file__).with_name("smollm2_math_evaluator.py"))),
                             train_config="configs/smollm2_math_judge.py", out="runs/smollm2_sft_check")
