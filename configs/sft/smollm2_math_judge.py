"""SFT of arm (e)'s judge (configs/smollm2_math_judge.py): the math teacher's balanced critiques, each
opening with the check line the judge's evaluator_check prompt asks for (agents.math_team.check_line),
for 200 training tasks; the base team's own samples first, as in configs/sft/smollm2_math_evaluator.py:
    python eval.py --config configs/smollm2_math_roles.py --base --data data/arith12_train.jsonl --limit 48 \\
        --n-samples 2 --out runs/smollm2_sft/train_samples
    python sft.py --config configs/sft/smollm2_math_judge.py      # -> runs/smollm2_sft_check/evaluator_critique
Training tasks only: the validation set is never read."""
from sft import SFTConfig

config = SFTConfig(
    train_config="configs/smollm2_math_judge.py",
    data=("runs/smollm2_sft/train_samples/*.jsonl",),
    roles=("evaluator_critique",),
    teacher="math", teacher_tasks=200, min_reward=0.7,
    lr=2e-4, epochs=2, micro_batch_size=4, grad_accum=2, val_frac=0.1,
    out="runs/smollm2_sft_check",
)
