"""CPU recipe (recipes.py reason_code_single): the one-agent baseline (i) of the reasoner + coder team
(configs/cpu/reason_code.py): one agent in the code style of envs/react.py, whose ```python blocks run in the same
sandbox and whose output comes back to it, until it boxes an answer. Built from the team's recipe, so it reads
the same data and val set and runs the same SFT schedule (its teacher runs the worked solution as one program,
then boxes what it printed) and the same RL steps, batch, chains and agent-and-turn groups. Its turn
budget is the team's (up to 8 turns: 7 programs and an answer) and so is its cap on generated tokens per task
(8 x 128 = the team's 4 rounds x (160 + 96)); compare.py reports what each arm actually generated.
Its SFT is matched to the team's coder by programs taught, not by tasks: the team's teacher teaches the coder
three programs a task (the perfect round's, and both rounds of the repair lesson), this teacher one, so it takes
three times the teacher tasks (96 programs each). Matched by tasks (32, until 2026-12-04), the agent learned from
a third of the coder's programs and scored 0.08-0.11 on test where the coder alone scored 0.41-0.52: a baseline
that flattered the team (docs/experiments.md, "The reasoner + coder endpoint on the test split"). Matched this
way it sees more distinct problems (96) than the coder (32): the difference, if any, favours the baseline."""
import dataclasses
import runpy
from pathlib import Path

from config import RoleConfig

team = runpy.run_path(str(Path(__file__).resolve().parent / "reason_code.py"))
R = dataclasses.replace
t = team["config"]
TURNS = t.rollout.max_turns
PER_TURN = sum(r.max_tokens for r in t.roles) * t.data.env_kwargs["max_rounds"] // TURNS
config = R(t, roles=(RoleConfig("agent", max_tokens=PER_TURN, temperature=t.roles[0].temperature),),
           rollout=R(t.rollout, merge_turns=False),
           data=R(t.data, env="react", env_kwargs={"style": "code", "tools": "python", "max_tool_calls": TURNS - 1}),
           trainer=R(t.trainer, output_dir="runs/recipes/reason_code_single/rl"))
BASE_TASKS = team["BASE_TASKS"]
PROGRAMS_PER_TEAM_TASK = 3  # the coder's examples per teacher task (tests/test_reason_code.py counts them)
SFT = dict(team["SFT"], teacher_tasks=team["SFT"]["teacher_tasks"] * PROGRAMS_PER_TEAM_TASK)
