"""Arm (e-blind) of the team-versus-one-agent experiment (docs/experiments.md, pre-registered): arm (e),
configs/smollm2_math_judge.py, with ONE change: the judge checks blind (env evaluator_prompt="blind"): it
writes its check line (last digit, size, its own result) in a turn of its own, seeing the problem only,
and gives its verdicts after it in the same conversation. Arm (e)'s judge read the solution first and
copied its answer into its "own" check (94% of its results at step 0, 99% at step 24), so it approved
near misses. The check turn is paid on its own result (+-1), the verdicts as in (e); one judge turn
more an episode (rollout.max_turns 7). Run after its SFT (configs/sft/smollm2_math_judge_blind.py):
    python train.py --config configs/smollm2_math_judge_blind.py \\
        --roles.1.init-from runs/smollm2_sft_blind/evaluator_critique
Everything else (data, seeds, 24 steps, phases, balanced labels, probes, val of 500 at steps 0/12/24) is (e)'s."""
import dataclasses
from pathlib import Path

from config import load_config_file

e_arm = load_config_file(str(Path(__file__).with_name("smollm2_math_judge.py")))
config = dataclasses.replace(
    e_arm,
    rollout=dataclasses.replace(e_arm.rollout, max_turns=7),
    data=dataclasses.replace(e_arm.data, env_kwargs={"probes": True, "evaluator_prompt": "blind"}),
    trainer=dataclasses.replace(e_arm.trainer, output_dir="runs/smollm2_math_judge_blind"),
)
