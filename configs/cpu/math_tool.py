"""CPU recipe (recipes.py math_tool): the math-tool team (analyzer -> executor + sandboxed Python ->
verifier) on SmolLM2-135M, on the arithmetic data (levels 2, 3, 5). SFT on the scripted team's turns (a
plan naming the computation, Python that computes it, the boxed printed result) for 64 of the 1289
training problems, 6 epochs (48 optimizer steps a role), then 12 GRPO steps of 4 problems x 4 chains;
val: all 120 held-out problems of those levels, greedy, at step 0 (the SFT start) and step 12.
Why 6 epochs: at 2 (16 steps) the verifier's loss on held-out teacher turns (train tasks) stayed at 0.83
and in the RL's train episodes it wrote anything but the boxed printed result (the team scored 0.000 at
the SFT start); 48 steps is what the research recipe's researcher needed to reach 0.02."""
import dataclasses
from pathlib import Path

from config import load_config_file

base = load_config_file(str(Path(__file__).resolve().parent.parent / "math_tool.py"))
R = dataclasses.replace
config = R(base, data=R(base.data, val_size=120),
           trainer=R(base.trainer, total_steps=12, test_freq=12, save_freq=4, val_before_train=True,
                     output_dir="runs/recipes/math_tool/rl"))
SFT = {"teacher_tasks": 64, "lr": 2e-4, "epochs": 6, "micro_batch_size": 4, "grad_accum": 2}
