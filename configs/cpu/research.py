"""CPU recipe (recipes.py research): the deep-research team (planner -> researchers -> writer) on
SmolLM2-135M over the larger made-up world's 3-/4-hop questions (data/research_world_*.jsonl: 450 documents,
140 train and 100 val questions; data/research_data.py LARGER). SFT on the scripted team's turns for 20 of the
training questions, at least 48 optimizer steps a role (`min_steps`), then 8 GRPO steps of 4 questions x 4
chains; val: all 100 held-out questions, greedy, at step 0 (the SFT start) and step 8; the base model on the
first 40 (BASE_TASKS: it scored 0.000 on all 20 of the small set).
Why the larger world: the small one (data/research_{train,val}.jsonl over data/search_corpus.jsonl's 160
documents) has 20 val questions, too few to measure a change of the size RL makes (every run of 2026-11-26/27 in
docs/recipes.md, the ones quoted below included, was on those 20).
Why min_steps: with 2 epochs alone the researchers (5 turns an episode) had 48 steps and reached a held-out
teacher loss of 0.02, but the planner and the writer (one turn each) had 6 and stopped at 0.85 and 0.32:
the writer then answered with a document id (`Answer: [product4]`) and the planner asked fewer sub-questions
than the hops (recipe run of 2026-11-26, docs/recipes.md).
Why warmup_steps 4 (lr 5e-5, 1e-4, 1.5e-4, then 2e-4): without it every RL arm from these SFT adapters fell at the
first update (train team reward 0.179 -> 0.094) and ended at 0.000-0.091 on val; with it (an RL run from the same,
bit-identical SFT adapters, 2026-11-27) the team held (0.441 -> 0.429, +0.429 +- 0.109 paired s.e. over the same
run without warm-up) and the planner's and researchers' val rewards rose (0.64 -> 0.80, 0.60 -> 0.76).
Why pack_turns: the researcher's 210 teacher turns are 70 conversations (each round's prompt is the last one +
reply + observation); trained one turn a sequence, its SFT stage had done 25 of 48 steps after 36 minutes
(2026-11-28, beside two jobs); as conversations it reads 2.5x fewer tokens, 2.46x faster (bench/sft_pack.py).
Why group_by_turn (PettingLLMs' AT-GRPO groups by agent and turn): a researcher's reward falls with its
sub-question's place in the chain (val at the SFT start: 0.88, 0.71, 0.68, 0.47 for sub-questions 1-4), so centred
over all of a task's researcher turns, GRPO's advantage scored the place, not the work: the 4th sub-question's turns
were pushed down whatever they wrote. Grouped by (task, role, turn), sub-question i is compared with sub-question i
of the task's other chains: the env keys each turn by its sub-question and round (Prompt.key), and a
researcher's merged rounds keep their first round's key. (Until 2026-11-29 the key was the turn's index in the
episode, which put a later sub-question, and the writer, in a group of its own whenever an earlier sub-question
took another number of rounds (or the plan had another length) in one chain: all of 110 logged sub-questions took
3 rounds at temperature 0.7, so the runs quoted here were barely touched.) Without it the recipe
collapsed (0.576 -> 0.000, the notes lost the answer from step 5); with it, from the same SFT adapters, it ended at
0.251 (+0.251 +- 0.043 paired s.e. over that run, still -0.325 +- 0.061 below the SFT start: the planner dropped the
fourth hop, which its own reward pays): docs/recipes.md, 2026-11-29."""
import dataclasses
from pathlib import Path

from config import load_config_file

base = load_config_file(str(Path(__file__).resolve().parent.parent / "research.py"))
R = dataclasses.replace
config = R(base, data=R(base.data, train_files="data/research_world_train.jsonl",
                       val_files="data/research_world_val.jsonl", val_size=100,
                       env_kwargs={**base.data.env_kwargs, "corpus": "data/research_world_corpus.jsonl"}),
           algo=R(base.algo, warmup_steps=4, group_by_turn=True),
           trainer=R(base.trainer, total_steps=8, test_freq=8, save_freq=4, val_before_train=True,
                     output_dir="runs/recipes/research/rl"))
BASE_TASKS = 40
SFT = {"teacher_tasks": 20, "lr": 2e-4, "epochs": 2, "min_steps": 48, "micro_batch_size": 4, "grad_accum": 2,
       "pack_turns": True}
