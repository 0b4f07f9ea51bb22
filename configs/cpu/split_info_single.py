"""CPU recipe (recipes.py split_info_single): the one-agent baseline of the split-information team
(configs/cpu/split_info.py): one solver sees the question and EVERY fact in one context and answers in one turn
(envs/split_info.py SplitInfoSingleEnv). Built from the team's recipe, so it reads the same data and val set and
runs the same SFT (its teacher: the team's last reply, facts, step and answer) on the same 32 teacher tasks and
schedule, and the same RL steps, batch and chains. Its one turn may generate as many tokens as the team's four
(2 agents x 2 rounds x the team's MAX_TOKENS): the same cap on generated tokens per task; compare.py reports
what each arm actually generated. Not run yet (see the team's recipe)."""
import dataclasses
import runpy
from pathlib import Path

from config import RoleConfig

team = runpy.run_path(str(Path(__file__).resolve().parent / "split_info.py"))
R = dataclasses.replace
t = team["config"]
config = R(t, roles=(RoleConfig("solver", max_tokens=2 * 2 * team["MAX_TOKENS"], temperature=t.roles[0].temperature),),
           rollout=R(t.rollout, max_turns=1),
           data=R(t.data, env="split_info_single", env_kwargs={"turns": 1}),
           trainer=R(t.trainer, output_dir="runs/recipes/split_info_single/rl"))
BASE_TASKS = team["BASE_TASKS"]
SFT = dict(team["SFT"])
