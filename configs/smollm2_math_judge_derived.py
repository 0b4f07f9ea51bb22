"""Arm (e-derived) of the team-versus-one-agent experiment (docs/experiments.md, pre-registered): arm
(e-digit), configs/smollm2_math_judge_digit.py, with ONE change: the verdict is the check's comparison,
made by the env (env verdict_from_check=True): the judge writes its blind digit check and nothing else,
and each verdict (on every solution, and on the probes) is whether the answer (the whole number it stands
for, as math_reward reads it) has the sign and last digit the check claims, written in the words the
teacher taught the judge's verdict turn ("The solution says 120: it ends in 0, not 8.\nVerdict: Incorrect"). (e-digit)'s judge kept its check (right on 73% of val problems at steps 0, 12 and 24)
but its own verdicts drifted from it (94% at step 0, 97% at 12, 83% at 24; 63 of 182 right answers its check cleared were
rejected at step 24). The judge learns only its check (paid +-1 on the claim, its phase 9-16); the
probes are counted but train nothing, and with no labelled judge turn left roles.balance_labels is off
(it would balance nothing). Run after (e-digit)'s SFT (configs/sft/smollm2_math_judge_digit.py;
its check turns are the ones this judge writes, its verdict turns are not used):
    python train.py --config configs/smollm2_math_judge_derived.py \\
        --roles.1.init-from runs/smollm2_sft_digit/evaluator_critique \\
        --trainer.output-dir runs/arms/e_derived --trainer.test-freq 24
(--trainer.test-freq 24: val at steps 0 and 24 only, as registered; without it, also at 12.)
Everything else (data, seeds, 24 steps, phases, lr, val of 500) is (e-digit)'s."""
import dataclasses
from pathlib import Path

from config import load_config_file

digit = load_config_file(str(Path(__file__).with_name("smollm2_math_judge_digit.py")))
g, e, r = digit.roles
config = dataclasses.replace(
    digit,
    roles=(g, dataclasses.replace(e, balance_labels=False), r),
    data=dataclasses.replace(digit.data, env_kwargs={**digit.data.env_kwargs, "verdict_from_check": True}),
    trainer=dataclasses.replace(digit.trainer, output_dir="runs/smollm2_math_judge_derived"),
)
