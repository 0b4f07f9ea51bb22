"""ppo.py against small examples computed by hand (the arithmetic is in the comments)."""
import math

import pytest
import torch

import ppo

M3 = torch.tensor([[1., 1., 1., 0.],    # length 3
                   [1., 1., 0., 0.],    # length 2
                   [1., 0., 1., 1.]])   # a masked hole at t=1 (tool output inside the response)


def close(a, b, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=tol, rtol=0)


# ---------------------------------------------------------------------------------- GRPO / RLOO


def test_grpo_by_hand():
    # group 0 = [2, 0, 1]: mean 1, unbiased std sqrt((1+1+0)/2) = 1 -> [1, -1, 0] / (1 + eps)
    # group 1 = [0.7] alone: mean 0, std 1 -> 0.7 / (1 + eps)
    # group 2 = [1, 1]: zero variance -> 0
    scores = torch.tensor([2., 0., 1., 0.7, 1., 1.])
    ids = torch.tensor([5, 5, 5, 9, 3, 3])
    mask = torch.ones(6, 2)
    mask[1, 1] = 0
    adv = ppo.grpo_advantages(scores, ids, mask)
    e = 1 / (1 + 1e-6)
    close(adv[:, 0], [e, -e, 0, 0.7 * e, 0, 0])
    assert adv[1, 1] == 0  # broadcast over masked tokens only
    dr = ppo.grpo_advantages(scores, ids, mask, norm_by_std=False)  # Dr. GRPO: centering only
    close(dr[:, 0], [1, -1, 0, 0.7, 0, 0])
    # string ids work too
    close(ppo.grpo_advantages(scores, ["a", "a", "a", "b", "c", "c"], mask), adv)


def test_grpo_zero_mean_per_group():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(40, generator=g)
    ids = torch.randint(0, 5, (40,), generator=g)
    adv = ppo.grpo_advantages(scores, ids, torch.ones(40, 3))[:, 0]
    for k in ids.unique():
        if (ids == k).sum() > 1:
            assert abs(adv[ids == k].mean().item()) < 1e-5


def test_rloo_by_hand_and_leave_one_out():
    # group [2, 0, 1], n = 3: 3/2 * (r - 1) = [1.5, -1.5, 0]; group of one keeps r
    scores = torch.tensor([2., 0., 1., 0.7])
    adv = ppo.rloo_advantages(scores, torch.tensor([0, 0, 0, 1]), torch.ones(4, 1))[:, 0]
    close(adv, [1.5, -1.5, 0, 0.7])
    g = torch.Generator().manual_seed(1)
    s = torch.rand(6, generator=g)
    a = ppo.rloo_advantages(s, torch.zeros(6, dtype=torch.long), torch.ones(6, 1))[:, 0]
    for i in range(6):
        others = torch.cat([s[:i], s[i + 1:]])
        assert abs(a[i] - (s[i] - others.mean())) < 1e-6


# ---------------------------------------------------------------------------------- REINFORCE++ / ReMax


def _whiten_by_hand(vals):
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in vals]


def test_reinforce_pp_discounted_with_hole_and_padding():
    gamma = 0.5
    rewards = torch.tensor([[0., 0., 1., 0.],
                            [0., 0., 0., 2.]])
    mask = torch.tensor([[1., 1., 1., 0.], [1., 0., 1., 1.]])
    # row 0: G = [0.25, 0.5, 1, -]; row 1 (hole at t=1 carried, not a discount step): [0.5, -, 1, 2]
    returns = ppo.discounted_returns(rewards, mask, gamma)
    close(returns[0, :3], [0.25, 0.5, 1.0])
    close(returns[1, [0, 2, 3]], [0.5, 1.0, 2.0])
    adv = ppo.reinforce_pp_advantages(rewards, mask, gamma)
    w = _whiten_by_hand([0.25, 0.5, 1.0, 0.5, 1.0, 2.0])
    close(adv[0, :3], w[:3])
    close(adv[1, [0, 2, 3]], w[3:])
    assert adv[0, 3] == 0 and adv[1, 1] == 0


def test_reinforce_pp_baseline():
    # scores [1, 0 | 3], groups {0,1} and {2}: centred [0.5, -0.5 | 3 (group of one: mean 0)]
    scores = torch.tensor([1., 0., 3.])
    mask = torch.tensor([[1., 1.], [1., 0.], [1., 1.]])
    adv = ppo.reinforce_pp_baseline_advantages(scores, torch.tensor([0, 0, 1]), mask)
    w = _whiten_by_hand([0.5, 0.5, -0.5, 3.0, 3.0])
    close(adv[mask.bool()], w)


def test_remax():
    rewards = torch.tensor([[0., 0., 1., 0.], [0., 0., 0., 2.]])
    mask = torch.tensor([[1., 1., 1., 0.], [1., 0., 1., 1.]])
    adv = ppo.remax_advantages(rewards, torch.tensor([0.4, 1.0]), mask)
    close(adv, [[0.6, 0.6, 0.6, 0.0], [1.0, 0.0, 1.0, 1.0]])


# ---------------------------------------------------------------------------------- GAE


def test_gae_by_hand_gamma_lambda():
    # gamma .9, lam .8, values [.5, .4, .3], reward 1 at the end:
    # t2: d = 1 - .3 = .7 ; t1: d = .9*.3 - .4 = -.13, A = -.13 + .72*.7 = .374
    # t0: d = .9*.4 - .5 = -.14, A = -.14 + .72*.374 = .12928 ; returns = A + V
    rewards = torch.tensor([[0., 0., 1.]])
    values = torch.tensor([[0.5, 0.4, 0.3]])
    adv, ret = ppo.gae_advantages(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.8)
    close(ret, [[0.62928, 0.774, 1.0]])
    close(adv, [_whiten_by_hand([0.12928, 0.374, 0.7])])


def test_gae_skips_masked_tokens():
    # hole at t1 (value 9.9 must be ignored): t2 A = .7 ; t0: d = .9*.3 - .5 = -.23, A = -.23 + .72*.7 = .274
    rewards = torch.tensor([[0., 0., 1.]])
    values = torch.tensor([[0.5, 9.9, 0.3]])
    _, ret = ppo.gae_advantages(rewards, values, torch.tensor([[1., 0., 1.]]), gamma=0.9, lam=0.8)
    close(ret[0, [0, 2]], [0.774, 1.0])


def test_gae_gamma_lambda_one_zero_values_is_reward_to_go():
    g = torch.Generator().manual_seed(2)
    r = torch.rand(3, 5, generator=g)
    _, ret = ppo.gae_advantages(r, torch.zeros(3, 5), M3[:, [0, 1, 2, 3, 3]].clone(), 1.0, 1.0)
    mask = M3[:, [0, 1, 2, 3, 3]]
    for b in range(3):
        for t in range(5):
            if mask[b, t]:
                want = sum(r[b, u].item() for u in range(t, 5) if mask[b, u])
                assert abs(ret[b, t].item() - want) < 1e-5


# ---------------------------------------------------------------------------------- KL


def test_kl_kinds_by_hand():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    close(ppo.kl_penalty(logp, ref, "kl"), [1.0])
    close(ppo.kl_penalty(logp, ref, "abs"), [1.0])
    close(ppo.kl_penalty(logp, ref, "mse"), [0.5])
    close(ppo.kl_penalty(logp, ref, "low_var_kl"), [math.exp(-1) + 1 - 1])  # e^k - k - 1, k = ref - logp = -1
    # clamps: k = -50 -> -20 gives 19 -> 10; k = +50 -> 20 gives e^20 - 21 -> 10
    close(ppo.kl_penalty(torch.tensor([0., -50.]), torch.tensor([-50., 0.]), "low_var_kl"), [10.0, 10.0])
    with pytest.raises(ValueError, match="unknown kl kind"):
        ppo.kl_penalty(logp, ref, "k9")


@pytest.mark.parametrize("kind", ["kl", "abs", "mse", "low_var_kl", "k3+"])
def test_kl_zero_when_equal_and_k3_nonnegative(kind):
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(4, 7, generator=g) * 5
    assert torch.all(ppo.kl_penalty(lp, lp, kind) == 0)
    ref = -torch.rand(4, 7, generator=g) * 5
    assert torch.all(ppo.kl_penalty(lp, ref, "low_var_kl") >= 0)


def test_straight_through_kl_gradient_is_k2():
    logp = torch.tensor([-1.0, -3.0], requires_grad=True)
    ref = torch.tensor([-2.0, -1.0])
    v = ppo.kl_penalty(logp, ref, "low_var_kl+")
    close(v.detach(), ppo.kl_penalty(logp.detach(), ref, "low_var_kl"))  # the value of k3
    v.sum().backward()
    close(logp.grad, [1.0, -2.0])  # k2's gradient (logp - ref), not k1's [1, 1]


@pytest.mark.parametrize("kind", ["kl+", "abs+", "mse+", "low_var_kl+", "k3+"])
def test_straight_through_kl_gradient_is_unbiased_for_reverse_kl(kind):
    """The exact on-policy expectation of the `+` gradient over a 7-way categorical equals autograd's
    gradient of KL(pi || ref) = sum_a pi(a) (log pi(a) - log ref(a)); k1's gradient averages to 0."""
    g = torch.Generator().manual_seed(7)
    theta = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.randn(7, generator=g, dtype=torch.float64), -1)
    logp = torch.log_softmax(theta, -1)
    pi = logp.exp().detach()
    (pi * ppo.kl_penalty(logp, ref, kind)).sum().backward()  # E_{a ~ pi}[grad of the estimate at a]
    want_theta = theta.detach().clone().requires_grad_(True)
    lp = torch.log_softmax(want_theta, -1)
    (lp.exp() * (lp - ref)).sum().backward()
    assert want_theta.grad.abs().max() > 0.05  # a real gradient to match
    close(theta.grad, want_theta.grad, tol=1e-10)
    k1 = theta.detach().clone().requires_grad_(True)  # what `+` used to take: k1's gradient
    lp1 = torch.log_softmax(k1, -1)
    (lp1.exp().detach() * ppo.kl_penalty(lp1, ref, "kl")).sum().backward()
    close(k1.grad, torch.zeros(7), tol=1e-12)


def test_full_kl_equals_torch_distributions():
    g = torch.Generator().manual_seed(4)
    a = torch.randn(3, 5, 11, generator=g, dtype=torch.float64)
    b = torch.randn(3, 5, 11, generator=g, dtype=torch.float64)
    want = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=a),
                                             torch.distributions.Categorical(logits=b))
    close(ppo.full_kl(a, b), want)
    close(ppo.full_kl(a, b, chunk_rows=4), want)  # chunked over rows
    a.requires_grad_(True)
    ppo.full_kl(a, b, chunk_rows=4).sum().backward()  # checkpointed chunks still give gradients
    a2 = a.detach().clone().requires_grad_(True)
    torch.distributions.kl_divergence(torch.distributions.Categorical(logits=a2),
                                      torch.distributions.Categorical(logits=b)).sum().backward()
    close(a.grad, a2.grad)
    close(ppo.full_kl(a.detach(), a.detach()), torch.zeros(3, 5))


def test_adaptive_kl_controller():
    c = ppo.AdaptiveKLController(init=0.1, target=6.0, horizon=10000)
    c.update(9.0, 64)   # 9/6 - 1 = .5 -> clipped to .2
    close(c.value, 0.1 * (1 + 0.2 * 64 / 10000))
    v = c.value
    c.update(6.6, 64)   # 6.6/6 - 1 = .1
    close(c.value, v * (1 + 0.1 * 64 / 10000), tol=1e-12)
    v = c.value
    c.update(0.0, 10)   # -1 -> -.2
    close(c.value, v * (1 - 0.2 * 10 / 10000), tol=1e-12)
    f = ppo.FixedKLController(0.05)
    f.update(100, 10)
    assert f.value == 0.05
    c2 = ppo.AdaptiveKLController(1, 1, 1)
    c2.load_state_dict(c.state_dict())
    assert c2.value == c.value


def test_adaptive_kl_is_fed_the_per_sequence_mean_over_sequences():
    """12 turns of 4 episodes, lengths 2/10/30, KL 0.5 on the short turns and 0.05 elsewhere: verl's
    current_kl is 0.200 (mean of per-sequence means) with n_steps = 12 sequences, and beta rises
    0.1 -> 0.1024 at target 0.1, horizon 100. A token mean (0.071) would lower it."""
    lens, T = [2, 10, 30] * 4, 30
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lens])
    kl = torch.tensor([[0.5 if n == 2 else 0.05] * T for n in lens]) * mask
    cur, n = ppo.sequence_mean_kl(kl, mask)
    assert n == 12 and cur == pytest.approx(0.2)
    assert float(ppo.masked_mean(kl, mask)) == pytest.approx(12 / 168)  # the token mean it used to get
    c = ppo.AdaptiveKLController(0.1, 0.1, 100)
    c.update(cur, n)
    assert c.value == pytest.approx(0.1024)
    empty = torch.cat([mask, torch.zeros(1, T)])  # a row with no policy token is no sequence
    assert ppo.sequence_mean_kl(torch.cat([kl, torch.ones(1, T)]), empty) == (pytest.approx(0.2), 12)


# ---------------------------------------------------------------------------------- losses


def test_agg_loss_modes_on_ragged_mask():
    v = torch.tensor([[1., 2., 3., 4.], [5., 6., 7., 8.], [9., 9., 9., 9.]])
    m = torch.tensor([[1., 1., 0., 0.], [1., 1., 1., 1.], [0., 0., 0., 0.]])  # last row has no token
    close(ppo.agg_loss(v, m, "token-mean"), 29 / 6)
    close(ppo.agg_loss(v, m, "seq-mean-token-sum"), (3 + 26) / 2)
    close(ppo.agg_loss(v, m, "seq-mean-token-mean"), (1.5 + 6.5) / 2)
    close(ppo.agg_loss(v, m, "seq-mean-token-sum-norm"), (3 / 4 + 26 / 4) / 2)
    close(ppo.agg_loss(v, m, "token-mean", denom=12), 29 / 12)  # global token count
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        ppo.agg_loss(v, m, "mean")


def test_policy_loss_by_hand_clip_higher():
    # eps_low .2, eps_high .28
    # A=+1, r=1.25 -> unclipped: -1.25 ; A=+1, r=1.3 -> clipped at 1.28: -1.28
    # A=-1, r=.75 -> clipped at .8: +.8 ; A=-1, r=.85 -> unclipped: +.85 ; A=+1, r=.5 -> unclipped (min side): -.5
    ratios = torch.tensor([[1.25, 1.3, 0.75, 0.85, 0.5]])
    adv = torch.tensor([[1., 1., -1., -1., 1.]])
    old = torch.zeros(1, 5)
    loss, m = ppo.policy_loss(ratios.log(), old, adv, torch.ones(1, 5), clip_low=0.2, clip_high=0.28)
    close(loss, (-1.25 - 1.28 + 0.8 + 0.85 - 0.5) / 5)
    close(m["clipfrac"], 2 / 5)
    close(m["clipfrac_high"], 1 / 5)
    close(m["clipfrac_low"], 1 / 5)
    close(m["ratio_max"], 1.3)
    close(m["ratio_min"], 0.5)
    close(m["approx_kl"], -sum(math.log(r) for r in [1.25, 1.3, 0.75, 0.85, 0.5]) / 5)


def test_dual_clip_caps_negative_advantage_loss():
    # A=-2, r=e^5 ~ 148: the clipped loss would be 2*148; dual-clip caps it at -A*c = 6
    loss, m = ppo.policy_loss(torch.tensor([[5.0]]), torch.zeros(1, 1), torch.tensor([[-2.0]]), torch.ones(1, 1),
                              dual_clip=3.0)
    close(loss, 6.0)
    close(m["clipfrac_dual"], 1.0)
    loss, _ = ppo.policy_loss(torch.tensor([[5.0]]), torch.zeros(1, 1), torch.tensor([[-2.0]]), torch.ones(1, 1),
                              dual_clip=None)
    close(loss, 2 * math.exp(5), tol=1e-3)


def test_policy_gradient_direction():
    logp = torch.tensor([[-1.0, -1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 0.5]])
    loss, _ = ppo.policy_loss(logp, logp.detach() + 0.01, adv, torch.ones(1, 3))
    loss.backward()
    assert logp.grad[0, 0] < 0 and logp.grad[0, 2] < 0  # descent raises logp where A > 0
    assert logp.grad[0, 1] > 0


def test_masked_tokens_get_no_gradient():
    logp = torch.randn(2, 4, requires_grad=True)
    loss, _ = ppo.policy_loss(logp, logp.detach(), torch.ones(2, 4), M3[:2])
    loss.backward()
    assert torch.all(logp.grad[M3[:2] == 0] == 0) and torch.all(logp.grad[M3[:2] == 1] != 0)


def test_gradcheck_policy_and_gspo():
    g = torch.Generator().manual_seed(5)
    old = -torch.rand(3, 4, generator=g, dtype=torch.float64) * 3
    logp = (old + (torch.rand(3, 4, generator=g, dtype=torch.float64) - 0.5) * 0.1).requires_grad_(True)
    adv = torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = M3.double()
    for agg in ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]:
        assert torch.autograd.gradcheck(lambda lp: ppo.policy_loss(lp, old, adv, mask, agg=agg)[0], (logp,))
    # GSPO's advantages are per sequence (constant along a row); with them the token-path
    # gradient equals the gradient of the sequence-level objective, which gradcheck verifies
    seq_adv = adv[:, :1].expand_as(adv)
    assert torch.autograd.gradcheck(lambda lp: ppo.gspo_loss(lp, old, seq_adv, mask, clip_low=0.2, clip_high=0.2)[0],
                                    (logp,))


def test_gspo_sequence_ratio_by_hand():
    # one row, log-ratios [.1, .3] -> s = exp(.2); A = 1, clip_high .1 -> min(s, 1.1) = 1.1 (clipped)
    old = torch.zeros(1, 2)
    loss, m = ppo.gspo_loss(torch.tensor([[0.1, 0.3]]), old, torch.ones(1, 2), torch.ones(1, 2),
                            clip_low=0.1, clip_high=0.1)
    close(loss, -1.1)
    close(m["ratio_mean"], math.exp(0.2))
    close(m["clipfrac_high"], 1.0)
    loss, _ = ppo.gspo_loss(torch.tensor([[0.01, 0.03]]), old, torch.ones(1, 2), torch.ones(1, 2), 0.1, 0.1)
    close(loss, -math.exp(0.02))


def test_value_loss_by_hand():
    # v=1, v_old=.5, R=2, clip .2: clipped v = .7; max((1-2)^2, (.7-2)^2) = 1.69; loss = .845
    loss, m = ppo.value_loss(torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.tensor([[2.0]]), torch.ones(1, 1), 0.2)
    close(loss, 0.845)
    close(m["vf_clipfrac"], 1.0)
    loss, _ = ppo.value_loss(torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.tensor([[2.0]]), torch.ones(1, 1), None)
    close(loss, 0.5)


def test_entropy_and_token_logprobs():
    V = 8
    ent = ppo.entropy(torch.zeros(2, 3, V), M3[:2, :3])
    close(ent, M3[:2, :3] * math.log(V))
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 3, V, generator=g, requires_grad=True)
    p = torch.softmax(logits, -1)
    close(ppo.entropy(logits, torch.ones(2, 3), chunk_rows=2), -(p * p.log()).sum(-1))
    ppo.entropy(logits, torch.ones(2, 3), chunk_rows=2).sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    tgt = torch.randint(0, V, (2, 3), generator=g)
    want = torch.log_softmax(logits.detach() / 0.7, -1).gather(-1, tgt[..., None])[..., 0]
    close(ppo.token_logprobs(logits.detach(), tgt, temperature=0.7, chunk_rows=4), want)


def test_head_logprobs_equal_the_whole_logits_and_their_hand_written_gradient_is_autograds():
    """ppo.head_logprobs / HeadLogprobs, by chunks of 3 tokens (7 tokens: a short last chunk), against
    log_softmax and the entropy on the whole logits h W^T / temperature, per-row temperatures; its backward
    (written by hand, recomputing each chunk) checked by torch.autograd.gradcheck in float64 with weights on
    both outputs, the logprob and the entropy."""
    g = torch.Generator().manual_seed(3)
    b, n, d, V = 2, 4, 5, 11
    h = torch.randn(b, n, d, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(V, d, generator=g, dtype=torch.float64)
    tgt = torch.randint(0, V, (b, n), generator=g)
    temps = torch.tensor([1.0, 0.7], dtype=torch.float64)
    lp, ent = ppo.head_logprobs(h, W, tgt, temps, 3)
    z = (h @ W.T) / temps[:, None, None]
    logp = torch.log_softmax(z, -1)
    close(lp.double(), logp.gather(-1, tgt[..., None])[..., 0])
    close(ent.double(), -(logp.exp() * logp).sum(-1))
    wl, we = torch.randn(b * n, generator=g, dtype=torch.float64), torch.randn(b * n, generator=g, dtype=torch.float64)

    def f(x):  # in float64 throughout: HeadLogprobs computes in float64 for a float64 input
        lp, ent = ppo.HeadLogprobs.apply(x, W, tgt.reshape(-1), temps[:, None].expand(b, n).reshape(-1), 3)
        return (lp * wl).sum() + (ent * we).sum()
    assert torch.autograd.gradcheck(f, (h.detach().reshape(-1, d).requires_grad_(),), eps=1e-6, atol=1e-5)


def test_explained_variance():
    r = torch.tensor([[1., 2., 3., 4.]])
    assert ppo.explained_variance(r, r, torch.ones(1, 4)) == 1.0
    assert abs(ppo.explained_variance(torch.zeros(1, 4), r, torch.ones(1, 4))) < 1e-6


def test_seq_mean_token_sum_norm_divides_by_the_constant_not_the_width():
    # Dr. GRPO: a row's masked sum / norm_len; padding the batch wider must not change it
    v = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    got = ppo.agg_loss(v, m, "seq-mean-token-sum-norm", norm_len=10)
    assert got.item() == pytest.approx(((1 + 2) / 10 + 3 / 10) / 2)
    wide_v, wide_m = torch.nn.functional.pad(v, (0, 7)), torch.nn.functional.pad(m, (0, 7))
    assert ppo.agg_loss(wide_v, wide_m, "seq-mean-token-sum-norm", norm_len=10).item() == pytest.approx(got.item())


def test_gspo_dual_clip_caps_negative_advantage_sequences():
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-3.0, -3.0]])  # sequence ratio e^3 ~ 20 > c = 3
    adv, mask = torch.full((1, 2), -1.0), torch.ones(1, 2)
    capped, m = ppo.gspo_loss(logp, old, adv, mask, 0.2, 0.2, dual_clip=3.0)
    free, _ = ppo.gspo_loss(logp, old, adv, mask, 0.2, 0.2, dual_clip=None)
    assert capped.item() == pytest.approx(3.0) and free.item() > 19 and m["clipfrac_dual"] == 1.0


def test_grouping_by_turn_only_rescales_grpo_when_a_chains_turns_share_one_reward():
    """docs/training.md's claim on algo.group_by_turn: where every turn of a role in a chain earns the same reward
    (split_info's defaults: message and answer both paid the team's correctness), (task, role) groups of 4 chains x 2
    turns give each turn the (task, role, turn) advantage times sqrt(7/6) (unbiased std over 8 duplicated values vs
    over 4), one constant for every non-flat group, which Adam's update does not see. With rewards that differ
    between a chain's turns they differ beyond a scale: messages all paid 1 are a flat group by turn (advantage 0),
    but above the role's mean by role."""
    same = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])  # 2 tasks, chain c's turns 2c, 2c+1
    task = [i // 8 for i in range(16)]
    by_role = [(t,) for t in task]
    by_turn = [(t, i % 2) for i, t in enumerate(task)]
    mask = torch.ones(16, 1)
    off, on = (ppo.grpo_advantages(same, g, mask, eps=0.0)[:, 0] for g in (by_role, by_turn))
    assert torch.allclose(off, on * math.sqrt(7 / 6)) and on.abs().min() > 0
    differ = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0] * 2)  # every message right, one answer right
    off, on = (ppo.grpo_advantages(differ, g, mask)[:, 0] for g in (by_role, by_turn))
    assert (on[0::2] == 0).all() and (off[0::2] > 0).all()
