"""SFT of arm (e-refine)'s refiner (configs/smollm2_math_refiner.py): sft.py's scripted teacher on the team whose
verdicts the env derives from the judge's digit check (configs/smollm2_math_judge_derived.py), the first 200
training tasks, the refiner's turns only: per task a first solution whose answer is a mistake the check catches
(never taught), the check and the env's "Verdict: Incorrect", then the fix: the claimed sign and last digit,
then the right result ("The answer must end in 3: 79 - 26 = 53, so the answer is \\boxed{53}.";
envs/math_3agent.py MathTeamEnv.scripted_repair). The settings of the judge's SFT
(configs/sft/smollm2_math_evaluator.py: lr 2e-4, 2 epochs, micro-batch 4 x 2):
    python sft.py --config configs/sft/smollm2_math_refiner.py  # -> runs/smollm2_sft_refiner/generator_refinement
Training tasks only: the validation set is never read."""
from sft import SFTConfig

config = SFTConfig(
    train_config="configs/smollm2_math_judge_derived.py",
    roles=("generator_refinement",),
    teacher="scripted", teacher_tasks=200, min_reward=0.7,
    lr=2e-4, epochs=2, micro_batch_size=4, grad_accum=2, val_frac=0.1,
    out="runs/smollm2_sft_refiner",
)
