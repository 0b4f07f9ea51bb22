"""SFT warm-start of the CPU demo's evaluator (SmolLM2-135M): the math teacher's balanced critiques
(one correct and one incorrect solution per training task, each with the right verdict) for 200
training tasks: on the 48 the base team was sampled on, its own right and wrong solutions first;
the other 152 get a short synthetic correct solution and a copy with a perturbed answer. The
docs/recipes.md's research recipe (~40 min on 2 shared cores, one thread each):
    python eval.py --config configs/smollm2_math_roles.py --base --data data/arith12_train.jsonl --limit 48 \\
        --n-samples 2 --out runs/smollm2_sft/train_samples          # the model's own (wrong) samples
    python sft.py --config configs/sft/smollm2_math_evaluator.py     # -> runs/smollm2_sft/evaluator_critique
    python train.py --config configs/smollm2_math_roles.py --roles.1.init-from runs/smollm2_sft/evaluator_critique \\
        --roles.1.lr 5e-5 --roles.1.frozen-steps 8 --roles.1.adv-estimator reinforce++   # arm (d)
Training tasks only: the validation set is never read."""
from sft import SFTConfig

config = SFTConfig(
    train_config="configs/smollm2_math_roles.py",
    data=("runs/smollm2_sft/train_samples/*.jsonl",),
    roles=("evaluator_critique",),
    teacher="math", teacher_tasks=200, min_reward=0.7,
    lr=2e-4, epochs=2, micro_batch_size=4, grad_accum=2, val_frac=0.1,
    out="runs/smollm2_sft",
)
