"""CPU recipe (recipes.py code): the code team (generator -> sandboxed tests -> refiner) on SmolLM2-135M,
on the synthetic family of short functions (data/code_data.py synthetic:train / synthetic:val; HumanEval
stays configs/code.py's, for GPUs). SFT on the teacher's reference solutions for 64 training tasks, then
12 GRPO steps of 4 tasks x 4 chains; val: 200 held-out functions (none of them in train), greedy, at step
0 (the SFT start) and step 12. The teacher also plays each task's repair lesson (envs/code_team.py's
scripted_repair with repair_mistake="approach": another family's function on the task's signature, a wrong
approach that fails a test, then the reference as the refiner's fix), so the refiner starts from up to 64
examples of rewriting code from its failing tests, not from the base model. (Taught on one-site near
misses instead, the default, the refiner copied the failing code in 54 of 62 val turns: docs/recipes.md.)"""
import dataclasses
from pathlib import Path

from config import load_config_file

base = load_config_file(str(Path(__file__).resolve().parent.parent / "code.py"))
R = dataclasses.replace
config = R(base, roles=tuple(R(r, max_tokens=128) for r in base.roles),
           rollout=R(base.rollout, max_model_len=1024),
           data=R(base.data, train_files="synthetic:train", val_files="synthetic:val", val_size=200,
                  env_kwargs={**base.data.env_kwargs, "repair_mistake": "approach"}),
           trainer=R(base.trainer, total_steps=12, test_freq=12, save_freq=4, val_before_train=True,
                     output_dir="runs/recipes/code/rl"))
SFT = {"teacher_tasks": 64, "lr": 2e-4, "epochs": 2, "micro_batch_size": 4, "grad_accum": 2}
