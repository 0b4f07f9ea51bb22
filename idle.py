"""No role that silently stops learning: whether a role's turns this step leave it a policy gradient, and
why not when they do not.

  moves        whether one adapter's advantages leave the policy loss a gradient (learner.prepare_adapter reads
               it: a step with none is skipped, so AdamW's momentum cannot move the adapter on it)
  idle_roles   every trainable role that learns nothing from this step, with the reason (train.py prints a
               line each step and IDLE_ADVICE after several in a row)
  copy_key, uncancelled
               token-identical turns (one prompt, one reply) whose advantages cancel: rewards that differ but a
               gradient of 0 (four chains that wrote one plan, paid +A and -A)

Split from learner.py: the update reads `moves`, the driver reads the rest; none of it changes an update.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from collectives import all_sum
from config import Config
from rollout import Sample


def idle_roles(cfg: Config, kept: list[Sample], metrics: dict, step: int) -> dict[str, tuple[str, str]]:
    """Every trainable role due to train at `step` (learner rows of roles not due are left out) that learns nothing
    from this step's rewards -> (a key of IDLE_ADVICE, why): it took no turn, a filter left out all its turns
    (select's metrics), every advantage of its kept turns is zero (each group's rewards agreed; read after
    `update`, which sets Sample.advantage), or they cancel: the turns whose advantages are not 0 come in
    token-identical copies (the same prompt and reply) whose advantages sum to 0, so the policy gradient, which
    is the same for each copy, is 0 though the rewards differed (a role sampled near-deterministically: four
    chains write one plan and later roles decide its reward). Agreed over ranks (copies on different ranks are
    not summed: a miss there only leaves a line out)."""
    roles = [r for r in cfg.roles if r.trainable and cfg.trains_at(r, step)]
    signal = all_sum([float(any(s.advantage for s in kept if s.role == r.name and s.advantage is not None)) for r in roles])
    net = all_sum([float(uncancelled([s for s in kept if s.role == r.name])) for r in roles])
    out = {}
    for r, sig, left in zip(roles, signal, net):
        n = metrics.get(f"train/turns/{r.name}", 0.0)
        if not n:
            out[r.name] = ("no_turn", "it took no turn")
        elif metrics.get(f"train/dropped_by_dapo/{r.name}") == 1.0:
            out[r.name] = ("dapo", f"DAPO's filter (algo.dynamic_sampling) left out all {n:.0f} of its turns: every "
                                   "group's rewards agreed")
        elif metrics.get(f"train/dropped_by_labels/{r.name}") == 1.0:
            out[r.name] = ("labels", f"the label filter left out all {n:.0f} of its turns: the env labels them "
                                     "(env.turn_labels) and in every group the labels agreed")
        elif not sig:
            out[r.name] = ("zero_advantage", f"every advantage of its {n:.0f} turns is 0: in each group "
                                             f"({cfg.estimator_of(r)}) the rewards agreed")
        elif not left:
            out[r.name] = ("identical", f"the advantages of its {n:.0f} turns cancel: where rewards differ its turns are "
                                        "token-identical copies (one prompt, one reply), so its policy gradient is 0")
    return out


def moves(batch, adv: torch.Tensor, copies_cancel: bool, tol: float = 1e-5) -> bool:
    """Whether this rank's advantages (over a learner.AdapterBatch's tokens) leave the policy loss a gradient. Without copies_cancel: some advantage is not
    0. With it (the caller knows the update is one optimizer step over one mini-batch at ratio 1, so the copies'
    gradients are summed before it steps): some token's advantages, summed over the copies of its turn, are not 0
    up to tol x the largest of them. Copies: the same prompt, reply, loss mask and temperature, whose
    log-probabilities have the same gradient; four chains that wrote one plan, paid +A and -A, give the gradient of
    none. A turn without copies moves iff an advantage of it is not 0, as without copies_cancel. One read back."""
    a = adv * batch.mask
    if copies_cancel:
        keys: dict = {}
        idx = [keys.setdefault((copy_key(s), t), len(keys)) for s, t in zip(batch.samples, batch.temps.tolist())]
        if len(keys) < len(idx):
            at = torch.tensor(idx, device=a.device)[:, None].expand_as(a)
            net = torch.zeros(len(keys), a.shape[1], dtype=a.dtype, device=a.device).scatter_add_(0, at, a)
            big = torch.zeros_like(net).scatter_reduce_(0, at, a.abs(), "amax")
            return bool((net.abs() > tol * big).any())
    return bool((a != 0).any())


def copy_key(s: Sample) -> tuple:
    """What makes two turns of one role copies, whose log-probabilities have the same gradient: the same prompt,
    reply and loss mask (moves adds the temperature, which roles sharing an adapter may not share)."""
    return tuple(s.prompt_ids), tuple(s.completion_ids), tuple(s.loss_mask or ())


def uncancelled(samples: list[Sample], tol: float = 1e-5) -> bool:
    """Whether one role's turns' advantages leave a policy gradient: summed over its copies (copy_key), some sum is
    not 0."""
    net = defaultdict(float)
    for s in samples:
        if s.advantage:
            net[copy_key(s)] += s.advantage
    return any(abs(v) > tol for v in net.values())


IDLE_ADVICE = {  # what to change after idle_roles' reason has held for several steps (train.py prints it)
    "no_turn": "the workflow never asks for it here (a team that stops before its turn): check its env's flow",
    "dapo": "raise rollout.num_chains or algo.dynamic_sampling_max_rounds, or give it an estimator that does not "
            "centre per group (roles[i].adv_estimator: reinforce++, remax)",
    "labels": "raise rollout.num_chains (more chains, more groups with both labels) or switch the env's label "
              "filter off (math_3agent: --data.env-kwargs.evaluator_mixed_groups_only false)",
    "zero_advantage": "raise rollout.num_chains, give it a reward it can vary (a graded one), or an estimator that does "
                      "not centre per group (roles[i].adv_estimator)",
    "identical": "raise its roles[i].temperature, or teach it less in SFT (a held-out loss near 0 leaves it one reply "
                 "to sample), or give it an estimator that does not centre per group (roles[i].adv_estimator)",
}
