"""CPU recipe (recipes.py react): one ReAct agent with [calculator] (configs/react_calculator.py) on
SmolLM2-135M, on the arithmetic data (levels 2, 3, 5). SFT on the scripted agent's trajectories (Thought,
Action: calculator[...], the answer) for 64 of the 1289 training problems, then 12 GRPO steps of 4
problems x 4 chains; val: all 120 held-out problems of those levels, greedy, at step 0 (the SFT start) and
step 12. The agent's turns extend one another: they train merged (merge_turns) and hit the prefix cache."""
import dataclasses
from pathlib import Path

from config import load_config_file

base = load_config_file(str(Path(__file__).resolve().parent.parent / "react_calculator.py"))
R = dataclasses.replace
config = R(base, data=R(base.data, val_size=120),
           trainer=R(base.trainer, total_steps=12, test_freq=12, save_freq=4, val_before_train=True,
                     output_dir="runs/recipes/react/rl"))
SFT = {"teacher_tasks": 64, "lr": 2e-4, "epochs": 2, "micro_batch_size": 4, "grad_accum": 2}
