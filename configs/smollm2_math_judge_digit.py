"""Arm (e-digit) of the team-versus-one-agent experiment (docs/experiments.md, pre-registered): arm
(e-blind), configs/smollm2_math_judge_blind.py, with ONE change: the judge's blind check is a cheap
necessary condition, the sign and the last digit worked from the operands' last digits (env
evaluator_prompt="digit": "Check: 3 + 5 = 8, so the answer ends in 8."), not its full result, and its
verdict compares the solution's answer against that. (e-blind)'s judge computed its full result blind and
was right on 10-12% of val problems, so its faithful comparisons rejected right solutions. The check turn
is paid on its claim (+-1); the longest teacher check is 47 tokens (88 - 95), so the judge's budget is 64 (48 in
(e-blind)). Run after its SFT (configs/sft/smollm2_math_judge_digit.py):
    python train.py --config configs/smollm2_math_judge_digit.py \\
        --roles.1.init-from runs/smollm2_sft_digit/evaluator_critique
Everything else (data, seeds, 24 steps, phases, balanced labels, probes, val of 500 at steps 0/12/24) is
(e-blind)'s, hence (e)'s."""
import dataclasses
from pathlib import Path

from config import load_config_file

blind = load_config_file(str(Path(__file__).with_name("smollm2_math_judge_blind.py")))
g, e, r = blind.roles
config = dataclasses.replace(
    blind,
    roles=(g, dataclasses.replace(e, max_tokens=64), r),
    data=dataclasses.replace(blind.data, env_kwargs={"probes": True, "evaluator_prompt": "digit"}),
    trainer=dataclasses.replace(blind.trainer, output_dir="runs/smollm2_math_judge_digit"),
)
