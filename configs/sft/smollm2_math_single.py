"""SFT of arm (a-sft)'s solver (docs/experiments.md): sft.py's scripted teacher on the single-agent baseline
(configs/math_single.py), the first 200 training tasks, the right solution in the words the team's refiner is
taught ("79 - 26 = 53, so the answer is \\boxed{53}."; envs/math_single.py MathSingleEnv.scripted_replies):
the teacher's solutions that arm (e-refine)'s refiner saw, given to one agent. The settings of the refiner's
SFT (configs/sft/smollm2_math_refiner.py: lr 2e-4, 2 epochs, micro-batch 4 x 2):
    python sft.py --config configs/sft/smollm2_math_single.py  # -> runs/smollm2_sft_single/solver
Training tasks only: the validation set is never read."""
from sft import SFTConfig

config = SFTConfig(
    train_config="configs/math_single.py",
    roles=("solver",),
    teacher="scripted", teacher_tasks=200, min_reward=0.7,
    lr=2e-4, epochs=2, micro_batch_size=4, grad_accum=2, val_frac=0.1,
    out="runs/smollm2_sft_single",
)
