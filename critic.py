"""GAE's value model (algo.adv_estimator gae): a linear head on the shared base wearing its own 'critic'
adapter, with its own optimizer. The learner asks it for the values of an adapter's turns before the
advantages (values) and trains it on the returns after (update); its micro-batches are the policy
update's (rows longest first, algo.micro_batch_size and micro_batch_tokens), in lockstep over ranks.
"""
from __future__ import annotations

import math

import torch

import lora
import ppo
from collectives import all_sum, average_grads, backward, clip_grad, lockstep_chunks
from learner import AdapterBatch, by_length


class Critic:
    """GAE's value model: a linear head on the shared base wearing its own 'critic' adapter, with
    its own optimizer (built after sharding: make_optimizer)."""

    def __init__(self, model, cfg, device):
        L = cfg.lora  # the critic is a regression: the one adapter that uses lora.dropout
        lora.add_lora(model, ["critic"], L.rank, L.alpha, L.dropout, L.targets, seed=cfg.trainer.seed + 1)
        self.head = torch.nn.Linear(model.config.hidden_size, 1).to(device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.cfg, self.device, self.opt = cfg, device, None

    def make_optimizer(self, model):  # after sharding: the adapter's parameters become DTensors
        self.params = lora.adapter_parameters(model, "critic") + list(self.head.parameters())
        self.opt = torch.optim.AdamW(self.params, lr=self.cfg.algo.critic_lr)

    def chunks(self, batch: AdapterBatch):
        """The critic's micro-batches: rows longest first, at most micro_batch_size (and micro_batch_tokens)."""
        order = by_length(batch, range(len(batch.samples)))
        return lockstep_chunks(order, self.cfg.algo.micro_batch_size, lengths=[batch.rows_len[i] for i in order],
                               max_tokens=self.cfg.algo.micro_batch_tokens)

    def forward(self, model, batch: AdapterBatch, rows):
        ids, _, T = batch.micro(rows)
        lora.set_adapter(model, "critic")
        out = model(input_ids=ids.to(self.device), output_hidden_states=True, logits_to_keep=1)  # right-padded: see learner.forward_logits
        return self.head(out.hidden_states[-1][:, :-1].float()).squeeze(-1), T  # (b, T)

    @torch.no_grad()
    def values(self, model, batch: AdapterBatch):
        model.eval()
        values = torch.zeros_like(batch.mask)
        for rows, w in self.chunks(batch):
            v, T = self.forward(model, batch, rows)
            if w:
                values[rows, :T] = v.cpu()
        return values

    def update(self, model, batch: AdapterBatch, returns, old_values):
        """ppo_epochs of clipped value regression on all rows (one optimizer step per epoch);
        returns the mean value loss and the explained variance of the values the advantages used."""
        a = self.cfg.algo
        model.train()  # the critic's adapter is the one that uses lora.dropout
        vf_loss = 0.0  # each chunk's share of the global token-mean loss, summed
        for _ in range(a.ppo_epochs):
            denom = max(all_sum(float(batch.mask.sum())), 1.0)
            for rows, w in self.chunks(batch):
                v, T = self.forward(model, batch, rows)
                loss, _ = ppo.value_loss(v, old_values[rows, :T].to(self.device), returns[rows, :T].to(self.device),
                                         batch.mask[rows, :T].to(self.device) * w, a.vf_clip, "token-mean", denom)
                backward(a.vf_coef * loss)
                vf_loss = vf_loss + loss.detach()  # on the device: read back once, after the loop
            average_grads(self.params)  # the head (and a replicated model's adapter): FSDP reduced the rest
            if math.isfinite(clip_grad(self.params, a.grad_clip)):
                self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        m, d = batch.mask, returns - old_values  # explained variance over every rank's tokens
        n, sr, sr2, sd, sd2 = all_sum([float(x) for x in (m.sum(), (returns * m).sum(), (returns ** 2 * m).sum(),
                                                           (d * m).sum(), (d ** 2 * m).sum())])
        var_r, var_d = sr2 / max(n, 1) - (sr / max(n, 1)) ** 2, sd2 / max(n, 1) - (sd / max(n, 1)) ** 2
        out = {"vf_loss": all_sum(float(vf_loss)) / a.ppo_epochs}
        if var_r > 1e-12:  # undefined when every return is equal
            out["explained_variance"] = 1 - var_d / var_r
        return out

    def state_dict(self):
        return {"head": self.head.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, d):
        self.head.load_state_dict(d["head"])
        self.opt.load_state_dict(d["opt"])
