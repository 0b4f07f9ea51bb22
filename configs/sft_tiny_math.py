"""SFT of the 3-agent math team on the tiny random model (CPU, about a minute): the math teacher's
balanced critiques for the evaluator, plus whatever turns of a tiny run pass min_reward.
    python train.py --config configs/tiny_math_3agent.py                  # writes runs/tiny_math_3agent/trajectories
    python sft.py --config configs/sft_tiny_math.py                       # -> runs/tiny_math_3agent/sft/<adapter>/
    python train.py --config configs/tiny_math_3agent.py --trainer.output-dir runs/tiny_rl_from_sft \\
        --roles.1.init-from runs/tiny_math_3agent/sft/evaluator_critique
CPU demo values: a higher LR than the full-size default (2e-5), few tasks, 2 epochs."""
from sft import SFTConfig

config = SFTConfig(
    train_config="configs/tiny_math_3agent.py",
    data=("runs/tiny_math_3agent/trajectories/train_*.jsonl",),
    teacher="math", teacher_tasks=32, min_reward=0.7,
    lr=1e-3, epochs=2, micro_batch_size=2, grad_accum=4, val_frac=0.1,
)
