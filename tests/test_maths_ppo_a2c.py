"""The pure maths of ppo.py and a2c.py against references written here from the papers, not from the code.

Covered: ppo_loss (clipped surrogate of Schulman et al. 2017, clipped value loss, advantage normalisation, approx KL
k3, clip fraction, and the gradients), a2c_loss, compute_gae (as the lambda-return minus the value, Schulman et al.
2016, a different formula from the TD-error sum of test_ppo_logic.py), masked_mean, update_mean_var_count and
RunningMeanStd (with gymnasium's prior pseudo-count), normalize_obs, scale_reward, explained_variance and
annealed_lr. The two scripts carry their own copies of the shared helpers, so each shared test runs on both. Random
cases come from fixed seeds; the tests on random data assert that they reach the branches they are about, so a seed
that misses one fails loudly instead of passing vacuously. Losses and GAE run in float64, so the tolerances are rounding only.
"""

import math

import numpy as np
import pytest
import torch

from conftest import load_algorithm

ppo = load_algorithm("ppo")
a2c = load_algorithm("a2c")
MODULES = {"ppo": ppo, "a2c": a2c}
both = pytest.mark.parametrize("algo", list(MODULES))

F64 = dict(rtol=1e-9, atol=1e-10)  # float64 sums of at most a few hundred terms of size <= 1e4


def t64(x) -> torch.Tensor:
    return torch.tensor(np.asarray(x, dtype=np.float64))


def normalised(adv: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Huang et al. 2022, detail 7: standardise with the valid entries' mean and sample std (torch.std, n - 1);
    with fewer than two valid entries the spread is taken as 0, so every advantage becomes (A - mean) / 1e-8."""
    a = adv[valid]
    mean = a.mean() if len(a) else 0.0
    std = a.std(ddof=1) if len(a) > 1 else 0.0
    return (adv - mean) / (std + 1e-8)


def make_mask(rng, kind: str, n: int, p_valid: float) -> np.ndarray:
    """Valid (non-reset-step) entries: each with probability p_valid, all, only one, only two (the smallest sample
    whose n - 1 is not clamped), or none."""
    if kind == "random":
        return rng.random(n) < p_valid
    two = (np.arange(n) == n // 3) | (np.arange(n) == 2 * n // 3)
    return {"all": np.ones(n, bool), "one": np.arange(n) == n // 3, "two": two, "none": np.zeros(n, bool)}[kind]


# ---------------------------------------------------------------------------------------------------------------
# masked_mean
# ---------------------------------------------------------------------------------------------------------------
@both
@pytest.mark.parametrize("kind", ["random", "all", "one", "none"])
def test_masked_mean_is_the_mean_of_the_valid_entries(algo, kind):
    """Fails if masked entries leak into the sum or the count, or if an all-masked batch gives NaN instead of 0."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=50)
    mask = make_mask(rng, kind, 50, 0.6)
    x = np.where(mask, x, 1e4)  # masked entries are wild
    expected = x[mask].mean() if mask.any() else 0.0
    got = MODULES[algo].masked_mean(t64(x), t64(mask))
    np.testing.assert_allclose(got.item(), expected, **F64)


# ---------------------------------------------------------------------------------------------------------------
# Running statistics
# ---------------------------------------------------------------------------------------------------------------
@both
@pytest.mark.parametrize("seed", range(3))
def test_merging_moments_equals_the_moments_of_the_concatenation(algo, seed):
    """Chan et al.'s merge of (mean, population var, count) of batches, chained: fails if the cross term
    delta^2 * n_a * n_b / n, a count weight or the running mean's update is wrong."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 40, size=5)
    batches = [rng.normal(loc=rng.normal(size=3) * 4, scale=rng.uniform(0.1, 3, 3), size=(n, 3)) for n in sizes]
    mean, var, count = t64(batches[0].mean(0)), t64(batches[0].var(0)), float(sizes[0])
    for i, b in enumerate(batches[1:], start=2):
        mean, var, count = MODULES[algo].update_mean_var_count(mean, var, count, t64(b.mean(0)), t64(b.var(0)), len(b))
        data = np.concatenate(batches[:i])
        np.testing.assert_allclose(mean.numpy(), data.mean(0), **F64)
        np.testing.assert_allclose(var.numpy(), data.var(0), **F64)
        assert count == len(data)


def prior_moments(samples: np.ndarray, prior_count: float = 1e-4):
    """Mean and variance of the samples pooled with gymnasium's starting point: a pseudo-sample of weight 1e-4 with
    mean 0 and variance 1 (so the statistics are defined before any data)."""
    total = prior_count + len(samples)
    mean = samples.sum(0) / total  # the prior's mean is 0
    var = (prior_count * (1.0 + mean**2) + ((samples - mean) ** 2).sum(0)) / total
    return mean, var, total


@both
@pytest.mark.parametrize("shape", [(1,), (3,), (2, 2)])
def test_running_mean_std_pools_every_update_with_the_prior(algo, shape):
    """RunningMeanStd after several updates of different sizes: the moments of all the data so far, pooled with the
    1e-4 prior (exactly, not only to 1e-4). Fails if update() uses the sample variance, drops a batch, or starts from
    other statistics."""
    rng = np.random.default_rng(1)
    rms = MODULES[algo].RunningMeanStd(shape, torch.device("cpu"))
    seen = np.zeros((0, *shape))
    for n in (1, 5, 1, 64, 9):
        b = rng.normal(loc=2.0, scale=3.0, size=(n, *shape))
        rms.update(b.astype(np.float32))  # a float32 batch is promoted to float64
        seen = np.concatenate([seen, b.astype(np.float32).astype(np.float64)])
        mean, var, count = prior_moments(seen)
        assert rms.mean.dtype == rms.var.dtype == np.float64
        np.testing.assert_allclose(rms.mean, mean, **F64)
        np.testing.assert_allclose(rms.var, var, **F64)
        assert rms.count == pytest.approx(count, rel=1e-12)
    state = rms.state_dict()  # the checkpoint's tensors, float64, read back the same
    assert state["mean"].dtype == state["var"].dtype == state["count"].dtype == torch.float64
    again = MODULES[algo].RunningMeanStd(shape, torch.device("cpu"))
    again.load_state_dict(state)
    np.testing.assert_array_equal(again.mean, rms.mean)
    np.testing.assert_array_equal(again.var, rms.var)
    assert again.count == rms.count


@both
@pytest.mark.parametrize("clip", [None, 0.7])
def test_normalize_obs_standardises_with_eps_inside_the_root_and_clips(algo, clip):
    """(obs - mean) / sqrt(var + 1e-8) clipped to [-clip, clip] (default 10), as float32; no statistics: float32 vectors
    and uint8 frames as they are, float64 vectors (envpool's MuJoCo) as float32. A dimension with variance 0 tells
    sqrt(var + eps) from sqrt(var) + eps; wild observations reach both clip ends."""
    module = MODULES[algo]
    rng = np.random.default_rng(2)
    rms = module.RunningMeanStd((4,), torch.device("cpu"))
    mean, var = np.array([0.5, -3.0, 0.0, 10.0]), np.array([4.0, 0.25, 0.0, 1e-3])
    rms.mean, rms.var = mean, var
    obs = rng.normal(size=(40, 4)) * np.array([2.0, 1.0, 1e-4, 0.3]) + mean
    obs = obs.astype(np.float32)
    kwargs = {} if clip is None else {"clip": clip}
    bound = 10.0 if clip is None else clip
    got = module.normalize_obs(obs, rms, **kwargs)
    raw = np.empty_like(obs, dtype=np.float64)
    for i in range(obs.shape[0]):
        for j in range(4):
            raw[i, j] = (float(obs[i, j]) - mean[j]) / math.sqrt(var[j] + 1e-8)
    assert (raw > bound).any() and (raw < -bound).any() and (np.abs(raw) < bound).any()  # both ends and the middle
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.clip(raw, -bound, bound), rtol=1e-6, atol=1e-6)
    frames = rng.integers(0, 256, (2, 4, 8, 8), dtype=np.uint8)
    assert module.normalize_obs(obs, None) is obs and module.normalize_obs(frames, None) is frames
    wide = module.normalize_obs(obs.astype(np.float64), None)
    assert wide.dtype == np.float32
    np.testing.assert_array_equal(wide, obs)


@both
@pytest.mark.parametrize("clip", [None, 0.5])
def test_scale_reward_divides_by_the_running_std_of_the_discounted_return(algo, clip):
    """Huang et al. 2022 continuous detail 8 (gymnasium/SB3 NormalizeReward): G <- gamma * G + r, every env's G a
    sample of the running statistics (prior included), reward / sqrt(var + 1e-8) clipped (default 10), G reset to 0
    after a done. Spikes of +-100 after 400 small rewards cross both ends of the default clip. Fails if the mean is
    subtracted, the reward's own variance is used, G is not reset or reset before it is counted, or the clip is off."""
    module = MODULES[algo]
    rng = np.random.default_rng(4)
    gamma, num_steps, num_envs = 0.9, 120, 4
    rewards = rng.normal(scale=0.01, size=(num_steps, num_envs))
    rewards[100, 0], rewards[100, 1] = 100.0, -100.0
    dones = rng.random((num_steps, num_envs)) < 0.1
    bound = 10.0 if clip is None else clip
    kwargs = {} if clip is None else {"clip": clip}
    rms = module.RunningMeanStd((), torch.device("cpu"))
    ret_t = np.zeros(num_envs)
    ret, seen, raw_all = [0.0] * num_envs, [], []
    for t in range(num_steps):
        scaled, ret_t = module.scale_reward(rewards[t], ret_t, dones[t], rms, gamma, **kwargs)
        ret = [gamma * g + r for g, r in zip(ret, rewards[t], strict=True)]
        seen.extend(ret)
        _, var, _ = prior_moments(np.array(seen))
        raw = rewards[t] / math.sqrt(var + 1e-8)
        raw_all.extend(raw)
        np.testing.assert_allclose(scaled, np.clip(raw, -bound, bound), rtol=1e-12, atol=1e-15)
        ret = [0.0 if d else g for g, d in zip(ret, dones[t], strict=True)]
        np.testing.assert_allclose(ret_t, ret, rtol=1e-12, atol=1e-15)
    raw_all = np.array(raw_all)
    assert (raw_all > bound).any() and (raw_all < -bound).any() and dones.any()


@both
@pytest.mark.parametrize("num_iterations", [1, 7, 100])
def test_annealed_lr_decays_linearly_from_the_rate_to_one_step_above_zero(algo, num_iterations):
    """Huang et al. 2022 detail 4: iteration i of N (from 1) trains at lr * (N - i + 1) / N; off, always lr. Fails on
    an off-by-one (first rate not lr, or the last 0) or a decay that is not linear."""
    module, lr = MODULES[algo], 3e-4
    for i in range(1, num_iterations + 1):
        assert module.annealed_lr(lr, i, num_iterations, True) == pytest.approx(
            lr * (num_iterations - i + 1) / num_iterations, rel=1e-12
        )
        assert module.annealed_lr(lr, i, num_iterations, False) == lr


# ---------------------------------------------------------------------------------------------------------------
# explained_variance
# ---------------------------------------------------------------------------------------------------------------
@both
@pytest.mark.parametrize("seed", range(3))
def test_explained_variance_on_the_valid_entries(algo, seed):
    """1 - Var[returns - values] / Var[returns] over the valid entries (population variances); NaN when the valid
    returns are constant; 1 for a perfect critic. Masked entries are wild: fails if they leak into either variance."""
    module = MODULES[algo]
    rng = np.random.default_rng(seed)
    n = 80
    mask = rng.random(n) < 0.7
    returns = np.where(mask, rng.normal(1.0, 2.0, n), 1e3)
    values = np.where(mask, returns + rng.normal(0.3, 1.0, n), -1e3)
    y, p = returns[mask], values[mask]
    expected = 1.0 - np.var(y - p) / np.var(y)
    np.testing.assert_allclose(module.explained_variance(t64(values), t64(returns), t64(mask)).item(), expected, **F64)
    np.testing.assert_allclose(module.explained_variance(t64(returns), t64(returns), t64(mask)).item(), 1.0, **F64)
    small = np.where(mask, returns / 20, returns)  # a spread below 1: the check is var > 0, not var > 1
    y = small[mask]
    expected = 1.0 - np.var(y - p / 20) / np.var(y)
    assert np.var(y) < 1
    np.testing.assert_allclose(module.explained_variance(t64(values / 20), t64(small), t64(mask)).item(), expected, **F64)
    constant = np.where(mask, 3.0, returns)  # integers: the valid returns' mean and spread are exact
    assert math.isnan(module.explained_variance(t64(values), t64(constant), t64(mask)).item())


# ---------------------------------------------------------------------------------------------------------------
# compute_gae, as the lambda-return
# ---------------------------------------------------------------------------------------------------------------
def reference_lambda_return(rewards, values, next_value, terms, truncs, valid, gamma, lam):
    """Advantage = G^lambda_t - V(s_t), with G^lambda the (1 - lambda)-weighted average of the n-step returns up to the
    episode's end or the rollout's (Sutton & Barto 12.1; Schulman et al. 2016, eq. 16), the last one taking the rest of
    the weight. The state after step k is values[k + 1] (next_value after the last step); after a truncation that is
    the real final observation, so it bootstraps; after a termination nothing does. An invalid (reset) step gets 0."""
    num_steps, num_envs = rewards.shape
    adv = np.zeros((num_steps, num_envs))
    for e in range(num_envs):
        for t in range(num_steps):
            if not valid[t, e]:
                continue
            end = t
            while end < num_steps - 1 and not (terms[end, e] or truncs[end, e]):
                end += 1
            horizon = end - t + 1
            n_step = []  # G^(n), n = 1..horizon
            for n in range(1, horizon + 1):
                k = t + n - 1  # the last step the n-step return uses
                after = next_value[e] if k == num_steps - 1 else values[k + 1, e]
                bootstrap = 0.0 if terms[k, e] else after
                g = sum(gamma**i * rewards[t + i, e] for i in range(n)) + gamma**n * bootstrap
                n_step.append(g)
            weights = [(1 - lam) * lam ** (n - 1) for n in range(1, horizon)] + [lam ** (horizon - 1)]
            adv[t, e] = sum(w * g for w, g in zip(weights, n_step, strict=True)) - values[t, e]
    return adv


def gae_case(seed, reset_steps):
    """A (32, 6) rollout: env 0 terminates on the last step, env 1 truncates on it, env 2 never ends, env 3 starts on
    a reset step, the others end at random. With reset_steps, each done is followed by a reset step (valid 0) whose
    reward is not 0, so only the mask can zero its advantage; without, every step is valid and only `dones` cuts the
    recursion (the docstring's contract)."""
    rng = np.random.default_rng(seed)
    num_steps, num_envs = 32, 6
    terms = rng.random((num_steps, num_envs)) < 0.1
    truncs = (rng.random((num_steps, num_envs)) < 0.1) & ~terms
    terms[:, :3], truncs[:, :3] = False, False
    terms[-1, 0], truncs[-1, 1] = True, True
    valid = np.ones((num_steps, num_envs), dtype=bool)
    if reset_steps:
        valid[1:] = ~(terms | truncs)[:-1]
        valid[0, 3] = False
        terms[0, 3] = truncs[0, 3] = False
    rewards = rng.normal(size=(num_steps, num_envs))
    values = rng.normal(size=(num_steps, num_envs))
    next_value = rng.normal(size=num_envs)
    return rewards, values, next_value, terms, truncs, valid


@both
@pytest.mark.parametrize("reset_steps", [True, False])
@pytest.mark.parametrize("gamma, lam", [(0.99, 0.95), (0.9, 0.0), (0.97, 1.0), (0.0, 0.5)])
@pytest.mark.parametrize("seed", range(2))
def test_gae_is_the_lambda_return_minus_the_value(algo, reset_steps, gamma, lam, seed):
    """Fails if a termination bootstraps (or a truncation does not), the recursion crosses a done, the reset step's
    advantage is not 0, the last step does not bootstrap from next_value, lambda or gamma enter in the wrong place
    (lambda 0 is one-step TD, lambda 1 the n-step return that a2c.py uses), or returns != advantages + values."""
    rewards, values, next_value, terms, truncs, valid = case = gae_case(seed, reset_steps)
    assert terms.any() and truncs[:-1].any() and (~valid).any() == reset_steps
    expected = reference_lambda_return(*case, gamma, lam)
    terms_t, dones_t = t64(terms), t64(terms | truncs)
    adv, ret = MODULES[algo].compute_gae(t64(rewards), t64(values), t64(next_value), terms_t, dones_t, t64(valid), gamma, lam)
    np.testing.assert_allclose(adv.numpy(), expected, **F64)
    np.testing.assert_allclose(ret.numpy(), expected + values, **F64)
    assert (adv.numpy()[~valid] == 0).all()


# ---------------------------------------------------------------------------------------------------------------
# ppo_loss
# ---------------------------------------------------------------------------------------------------------------
def reference_ppo(newlogp, oldlogp, ent, newv, oldv, adv, ret, valid, clip, clip_vloss, ent_coef, vf_coef, norm_adv):
    """PPO's loss per sample in plain Python, and its gradients by hand (Schulman et al. 2017; Huang et al. 2022).

    Policy: -L^CLIP as in the paper's figure 1: for A > 0 the objective r * A stops growing at r = 1 + clip, for A < 0
    at r = 1 - clip; where it is capped its gradient is 0, elsewhere d(r * A)/d log pi = r * A.
    Value (detail 9): with clipping, the worse of the new prediction's error and that of the old prediction moved at
    most clip towards it; when the moved one is worse the loss does not depend on the new value (gradient 0).
    Returns (loss, stats, d/d newlogprob, d/d newvalue, d/d entropy, which branches the data reached)."""
    n = int(valid.sum())
    a = normalised(adv, valid) if norm_adv else adv
    pg = vl = en = kl = cf = 0.0
    g_logp, g_v, g_ent = np.zeros(len(adv)), np.zeros(len(adv)), np.zeros(len(adv))
    seen = set()
    for i in np.flatnonzero(valid):
        r = math.exp(newlogp[i] - oldlogp[i])
        region = "below" if r < 1 - clip else "above" if r > 1 + clip else "inside"
        capped = (a[i] > 0 and r > 1 + clip) or (a[i] < 0 and r < 1 - clip)
        seen.add(("A>0" if a[i] > 0 else "A<0", region))
        objective = (min(r, 1 + clip) if a[i] > 0 else max(r, 1 - clip)) * a[i]
        pg -= objective / n
        g_logp[i] = 0.0 if capped else -r * a[i] / n
        err = newv[i] - ret[i]
        if clip_vloss:
            moved = oldv[i] + min(max(newv[i] - oldv[i], -clip), clip)
            if abs(moved - ret[i]) > abs(err):
                vl += 0.5 * (moved - ret[i]) ** 2 / n
                seen.add("value: clipped worse")
            else:
                vl += 0.5 * err**2 / n
                g_v[i] = vf_coef * err / n
                seen.add("value: new worse" if abs(newv[i] - oldv[i]) > clip else "value: inside")
        else:
            vl += 0.5 * err**2 / n
            g_v[i] = vf_coef * err / n
        en += ent[i] / n
        g_ent[i] = -ent_coef / n
        kl += (r - 1 - math.log(r)) / n  # k3 = E_old[r - 1 - log r], http://joschu.net/blog/kl-approx.html
        cf += float(abs(r - 1) > clip) / n
    loss = pg - ent_coef * en + vf_coef * vl
    return loss, [pg, vl, en, kl, cf], g_logp, g_v, g_ent, seen


def ppo_batch(seed, mask_kind="random", n=64):
    """Valid samples: ratios e^U(-0.7, 0.7) (below, inside and above any clip in [0.1, 0.3]), advantages of both
    signs with mean 0.3 and std 2 (so std != var), new values N(0, 1) away from the old ones. Masked samples are
    wild: ratio e^+-3, advantage 50, value 100, entropy 10."""
    rng = np.random.default_rng(seed)
    valid = make_mask(rng, mask_kind, n, 0.75)
    oldlogp = rng.normal(-1.0, 0.5, n)
    newlogp = oldlogp + np.where(valid, rng.uniform(-0.7, 0.7, n), rng.choice([-3.0, 3.0], n))
    adv = np.where(valid, rng.normal(0.3, 2.0, n), 50.0)
    oldv = rng.normal(0.0, 1.0, n)
    newv = np.where(valid, oldv + rng.normal(0.0, 1.0, n), 100.0)
    ret = rng.normal(0.0, 1.5, n)
    ent = np.where(valid, rng.uniform(0.1, 2.0, n), 10.0)
    return newlogp, oldlogp, ent, newv, oldv, adv, ret, valid


def check_ppo_loss(batch, clip, clip_vloss, ent_coef, vf_coef, norm_adv):
    newlogp, oldlogp, ent, newv, oldv, adv, ret, valid = batch
    inputs = [t64(x) for x in batch]
    for i in (0, 2, 3):  # newlogprob, entropy, newvalue
        inputs[i].requires_grad_(True)
    kwargs = dict(clip_coef=clip, clip_vloss=clip_vloss, ent_coef=ent_coef, vf_coef=vf_coef, norm_adv=norm_adv)
    loss, stats = ppo.ppo_loss(*inputs, **kwargs)
    loss.backward()
    exp_loss, exp_stats, g_logp, g_v, g_ent, seen = reference_ppo(*batch, clip, clip_vloss, ent_coef, vf_coef, norm_adv)
    np.testing.assert_allclose(loss.item(), exp_loss, **F64)
    assert list(stats) == ["policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac"]
    assert not any(term.requires_grad for term in stats.values())
    np.testing.assert_allclose(torch.stack(list(stats.values())).numpy(), exp_stats, **F64)
    np.testing.assert_allclose(inputs[0].grad.numpy(), g_logp, **F64)
    np.testing.assert_allclose(inputs[3].grad.numpy(), g_v, **F64)
    np.testing.assert_allclose(inputs[2].grad.numpy(), g_ent, **F64)
    return seen


@pytest.mark.parametrize("norm_adv", [False, True])
@pytest.mark.parametrize("clip_vloss", [False, True])
@pytest.mark.parametrize("seed, clip", [(0, 0.1), (1, 0.2), (2, 0.3)])
def test_ppo_loss_matches_the_clipped_surrogate_reference(seed, clip, clip_vloss, norm_adv):
    """The total loss, all five stats and the gradients w.r.t. newlogprob, newvalue and entropy. Fails if either clip
    bound of the ratio is dropped or moved, min/max are swapped in the surrogate or the value loss, the value is
    clipped around the wrong centre or by the wrong width, the advantages are normalised with the variance, the
    population std or masked entries, approx KL is not k3, the clip fraction counts the wrong samples, a coefficient's
    sign flips, or a masked sample gets any gradient. Every (advantage sign, ratio region) pair is reached, and with
    value clipping the three value cases (inside the band, clipped error larger, new error larger)."""
    rng = np.random.default_rng(100 + seed)
    ent_coef, vf_coef = rng.uniform(0.005, 0.05), rng.uniform(0.25, 1.0)
    seen = check_ppo_loss(ppo_batch(seed), clip, clip_vloss, ent_coef, vf_coef, norm_adv)
    assert {(s, r) for s in ("A>0", "A<0") for r in ("below", "inside", "above")} <= seen
    if clip_vloss:
        assert {"value: clipped worse", "value: new worse", "value: inside"} <= seen


@pytest.mark.parametrize("norm_adv", [False, True])
@pytest.mark.parametrize("mask_kind", ["all", "one", "two", "none"])
def test_ppo_loss_with_every_one_or_no_valid_sample(mask_kind, norm_adv):
    """Minibatches with no reset step, or made of reset steps but one, or only of them (tiny minibatches): the same
    reference; a single valid advantage normalises to 0, an empty minibatch gives loss 0 and no gradient, not NaN."""
    check_ppo_loss(ppo_batch(7, mask_kind), clip=0.2, clip_vloss=True, ent_coef=0.01, vf_coef=0.5, norm_adv=norm_adv)


# ---------------------------------------------------------------------------------------------------------------
# a2c_loss
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_adv", [False, True])
@pytest.mark.parametrize("mask_kind", ["random", "all", "one", "two", "none"])
@pytest.mark.parametrize("ent_coef, vf_coef", [(0.0, 0.5), (0.01, 0.25)])
def test_a2c_loss_matches_the_policy_gradient_reference(norm_adv, mask_kind, ent_coef, vf_coef):
    """Mnih et al. 2016: -mean(A * log pi) with A a constant, + vf_coef * mean((V - R)^2) (not halved, as SB3 and
    Baselines), - ent_coef * mean(entropy), over the valid entries. Checks the loss, the three stats and the gradients:
    d/d log pi = -A / n, d/dV = 2 vf_coef (V - R) / n, d/d entropy = -ent_coef / n, 0 on masked entries, none into
    the advantages. Fails if the entropy sign flips, the value loss is halved, the advantages are normalised with the
    variance, the population std or masked entries, or gradient flows into them."""
    rng = np.random.default_rng(11)
    n = 48
    valid = make_mask(rng, mask_kind, n, 0.7)
    logp = np.where(valid, rng.normal(-1.0, 0.7, n), -20.0)
    ent = np.where(valid, rng.uniform(0.1, 2.0, n), 10.0)
    value = np.where(valid, rng.normal(size=n), 100.0)
    adv = np.where(valid, rng.normal(0.3, 2.0, n), 50.0)
    ret = rng.normal(size=n)
    k = int(valid.sum())
    a = normalised(adv, valid) if norm_adv else adv
    w = valid / max(k, 1)  # the weight of each sample in a mean over the valid ones
    pg, vl, en = -np.sum(w * a * logp), np.sum(w * (value - ret) ** 2), np.sum(w * ent)
    inputs = [t64(x).requires_grad_(True) for x in (logp, ent, value, adv)]
    loss, stats = a2c.a2c_loss(*inputs[:3], inputs[3], t64(ret), t64(valid), ent_coef, vf_coef, norm_adv)
    loss.backward()
    np.testing.assert_allclose(loss.item(), pg - ent_coef * en + vf_coef * vl, **F64)
    assert list(stats) == ["policy_loss", "value_loss", "entropy"] and not any(v.requires_grad for v in stats.values())
    np.testing.assert_allclose(torch.stack(list(stats.values())).numpy(), [pg, vl, en], **F64)
    np.testing.assert_allclose(inputs[0].grad.numpy(), -w * a, **F64)
    np.testing.assert_allclose(inputs[1].grad.numpy(), -ent_coef * w, **F64)
    np.testing.assert_allclose(inputs[2].grad.numpy(), 2 * vf_coef * w * (value - ret), **F64)
    assert inputs[3].grad is None or not inputs[3].grad.any()
