"""CPU recipe (recipes.py search): the search team (query writer -> BM25 -> answerer, 3 cycles) on
SmolLM2-135M, on the larger made-up world of data/search_world_*.jsonl (30 countries, 180 people: 100
train and 200 val questions; data/search_data.py), so the val set can measure the recipe (the small
world of configs/search.py has 30 val questions). SFT on the scripted team's turns for 24 of the 100
training questions, then 12 GRPO steps of 4 questions x 4 chains; val: all 200 held-out questions (80
one-hop, 120 two-hop), greedy, at step 0 (the SFT start) and step 12. The base model is evaluated on the first
60 of them (BASE_TASKS): it never writes an answer, so each of its episodes runs all 3 cycles to the token
limit, and on all 200 that eval alone took 27 of the recipe's 68 minutes (2026-11-27)."""
import dataclasses
from pathlib import Path

from config import load_config_file

base = load_config_file(str(Path(__file__).resolve().parent.parent / "search.py"))
R = dataclasses.replace
config = R(base, data=R(base.data, train_files="data/search_world_train.jsonl", val_files="data/search_world_val.jsonl",
                        val_size=200, env_kwargs={**base.data.env_kwargs, "corpus": "data/search_world_corpus.jsonl"}),
           trainer=R(base.trainer, total_steps=12, test_freq=12, save_freq=4, val_before_train=True,
                     output_dir="runs/recipes/search/rl"))
SFT = {"teacher_tasks": 24, "lr": 2e-4, "epochs": 2, "micro_batch_size": 4, "grad_accum": 2}
BASE_TASKS = 60
