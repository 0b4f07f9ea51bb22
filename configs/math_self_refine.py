"""Arm (a'') of the team-versus-one-agent experiment (docs/experiments.md): the single solver of
configs/math_single.py given the team's number of generations as Self-Refine: it answers, sees its own
solution and may revise it once (2 generations a problem, as the team's ~2). 4 tasks a step like the
team, so the generated tokens per step match the team's too. Everything else is math_single's."""
import dataclasses
from pathlib import Path

from config import load_config_file

single = load_config_file(str(Path(__file__).with_name("math_single.py")))
config = dataclasses.replace(
    single,
    rollout=dataclasses.replace(single.rollout, max_turns=2),
    data=dataclasses.replace(single.data, batch_size=4, env_kwargs={"self_refine": True}),
    trainer=dataclasses.replace(single.trainer, output_dir="runs/math_self_refine"),
)
