"""Arm (e) of the team-versus-one-agent experiment (docs/experiments.md, pre-registered): the per-role
team of arm (d), configs/smollm2_math_roles.py, with everything built to make the judge useful:
- the judge writes its own check line first (env evaluator_prompt="check": last digit, size, result),
  and starts from an SFT on the math teacher's balanced critiques in exactly that style;
- hard-negative probes (env probes=True): it also judges the generator's right first solution and a
  near miss of it, labelled, at every step (2 more judge turns: rollout.max_turns 6);
- balanced labels (roles.balance_labels): right and wrong solutions weigh the same in its update;
- phases (roles.train_windows): the generator and the refiner learn at steps 1-8 and 17-24, the judge
  at 9-16, each holding still while the other learns.
Run after the SFT (configs/sft/smollm2_math_judge.py):
    python train.py --config configs/smollm2_math_judge.py --roles.1.init-from runs/smollm2_sft_check/evaluator_critique
Everything else (data, seeds, 24 steps, val of 500 at steps 0/12/24, lr, LoRA) is arm (d)'s; the judge's
lr 5e-5 and reinforce++ are (d)'s too."""
import dataclasses
from pathlib import Path

from config import load_config_file

roles_cfg = load_config_file(str(Path(__file__).with_name("smollm2_math_roles.py")))
solvers = ((1, 8), (17, 24))
g, e, r = roles_cfg.roles
config = dataclasses.replace(
    roles_cfg,
    roles=(dataclasses.replace(g, train_windows=solvers),
           dataclasses.replace(e, max_tokens=48, lr=5e-5, adv_estimator="reinforce++", balance_labels=True,
                               train_windows=((9, 16),)),
           dataclasses.replace(r, train_windows=solvers)),
    rollout=dataclasses.replace(roles_cfg.rollout, max_turns=6),
    data=dataclasses.replace(roles_cfg.data, env_kwargs={"probes": True, "evaluator_prompt": "check"}),
    trainer=dataclasses.replace(roles_cfg.trainer, output_dir="runs/smollm2_math_judge"),
)
