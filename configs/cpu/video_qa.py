"""CPU recipe (recipes.py video_qa): the video-QA team on SmolLM2-135M, from a scripted perfect team's SFT.
SFT on the teacher's turns for 48 of the 390 training questions (so RL has room), then 8 GRPO steps of
4 questions x 4 chains; val: all 102 held-out questions, greedy, at step 0 (the SFT start) and step 8
(the base model on the first 40). Each role's SFT takes at least 24 optimizer steps (2 epochs alone are ~11).
    python recipes.py video_qa          # runs/recipes/video_qa/: sft, base eval, RL, summary.json, curves.png"""
import dataclasses
from pathlib import Path

from config import load_config_file

base = load_config_file(str(Path(__file__).resolve().parent.parent / "video_qa.py"))
R = dataclasses.replace
config = R(base, data=R(base.data, val_size=102),
           trainer=R(base.trainer, total_steps=8, test_freq=8, save_freq=4, val_before_train=True,
                     output_dir="runs/recipes/video_qa/rl"))
SFT = {"teacher_tasks": 48, "lr": 2e-4, "epochs": 2, "min_steps": 24, "micro_batch_size": 4, "grad_accum": 2}
BASE_TASKS = 40
