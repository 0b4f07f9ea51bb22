"""An sft.py config (`config = SFTConfig(...)`, not a train Config: hence its own folder) for the
tiny 3-agent math team, CPU demo values (a higher LR than the full-size default 2e-5, 32 teacher
tasks, 2 epochs): the math teacher's balanced critiques (correct and incorrect solutions, right
verdicts) train the evaluator; add trajectory files with `--data` to train the other roles too.
    python sft.py --config configs/sft/tiny_math.py --data 'runs/tiny_math_3agent/trajectories/train_*.jsonl'
    python train.py --config configs/tiny_math_3agent.py --mode both --sft-config configs/sft/tiny_math.py
"""
from sft import SFTConfig

config = SFTConfig(
    train_config="configs/tiny_math_3agent.py",
    teacher="math", teacher_tasks=32, min_reward=0.7,
    lr=1e-3, epochs=2, micro_batch_size=2, grad_accum=4, val_frac=0.1,
)
