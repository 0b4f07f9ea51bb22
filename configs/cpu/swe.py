"""CPU recipe (recipes.py swe): the SWE team (analyzer -> writer -> validator) on SmolLM2-135M, on the
generated SWE-bench-format instances (data/swe_*.jsonl). SFT on the scripted team's turns (the gold patch
as edit blocks, the tool calls that find it, the reproduction the validator runs) for 32 of the 195
training instances, then 4 GRPO steps of 2 instances x 2 chains; val: all 42 held-out instances, greedy,
at step 0 (the SFT start) and step 4. The analyzer's and the validator's budgets are raised to what the
teacher's replies need (diagnosis up to 134 tokens, a reproduction call up to 118). Not yet run to the
end: the untrained team's step is ~115 s at 1 instance x 2 chains (one thread); the SFT'd team's
episodes are longer (tool calls, edit blocks, a reproduction), so expect over an hour on 2 cores.
Why pack_turns: its SFT stage alone took 37 min (46 steps); the analyzer's 96 teacher turns are 32
conversations (61,982 -> 25,913 tokens), the validator's 64 are 32 (48,390 -> 25,133), the writer speaks once
(bench/sft_pack.py measures the wall the same packing saves on the research researcher: 2.46x).
Why BASE_TASKS: SmolLM2-135M alone calls no tool and writes no edit block (reward 0 wherever it was tried), and
each of its episodes runs to the token limits, so the base is evaluated on the first 20 val instances."""
import dataclasses
from pathlib import Path

from config import load_config_file

base = load_config_file(str(Path(__file__).resolve().parent.parent / "swe_team.py"))
R = dataclasses.replace
budget = {"analyzer": 144, "writer": 160, "validator": 128}
config = R(base, roles=tuple(R(r, max_tokens=budget[r.name]) for r in base.roles),
           data=R(base.data, val_size=42),
           trainer=R(base.trainer, total_steps=4, test_freq=4, save_freq=1, val_before_train=True,
                     output_dir="runs/recipes/swe/rl"))
BASE_TASKS = 20
SFT = {"teacher_tasks": 32, "lr": 2e-4, "epochs": 2, "micro_batch_size": 2, "grad_accum": 4, "pack_turns": True}
