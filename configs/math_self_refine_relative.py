"""Arm (a''') of the team-versus-one-agent experiment (docs/experiments.md, pre-registered): arm (a''),
configs/math_self_refine.py, with its revision paid like the team's refiner (env revision_reward=
"relative": a fix +1, a break -1, keeping a right answer +0.5, staying wrong 0) and centred among the
revisions of its task (algo.group_by_turn), not among first answers. (a'')'s revision fixed 66 answers
(10 broken) at step 0 and nothing by step 12: paid on its correctness, copying the first answer paid
as much as the first answer did. Everything else is (a'')'s."""
import dataclasses
from pathlib import Path

from config import load_config_file

a2 = load_config_file(str(Path(__file__).with_name("math_self_refine.py")))
config = dataclasses.replace(
    a2,
    algo=dataclasses.replace(a2.algo, group_by_turn=True),
    data=dataclasses.replace(a2.data, env_kwargs={"self_refine": True, "revision_reward": "relative"}),
    trainer=dataclasses.replace(a2.trainer, output_dir="runs/math_self_refine_relative"),
)
