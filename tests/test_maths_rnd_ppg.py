"""The pure maths of rnd_ppo.py and ppg_procgen.py against references written here from the definitions (plain loops
and numpy, none of the modules' helpers), over random cases with fixed seeds that reach every branch: the advantage
estimators (episodic GAE, RND's non-episodic intrinsic GAE), the clipped PPO losses with their values and gradients,
RND's reward filter, intrinsic reward scale and frame statistics, PPG's behaviour-cloning KL, auxiliary loss and
reward scale, the running moments, the masked statistics, and the mix of RND's two advantage streams inside main."""

import math

import numpy as np
import pytest
import torch

from conftest import load_algorithm, run_in_process

rnd = load_algorithm("rnd_ppo")
ppg = load_algorithm("ppg_procgen")
BOTH = pytest.mark.parametrize("module", [rnd, ppg], ids=["rnd_ppo", "ppg_procgen"])
SEEDS = pytest.mark.parametrize("seed", range(4))
RTOL64, RTOL32 = 1e-7, 1e-5  # float64 maths, float32 maths
CPU = torch.device("cpu")


def t64(x):
    return torch.tensor(np.asarray(x), dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------------
# References, from the definitions
# ---------------------------------------------------------------------------------------------------------------
def log_softmax(row):
    """log p_k = z_k - log sum_j exp z_j, with the largest logit taken out first (exact for logits of +-40)."""
    top = max(row)
    log_z = top + math.log(sum(math.exp(z - top) for z in row))
    return [z - log_z for z in row]


def ppo_terms(logits, actions, oldlogprob, adv, clip):
    """Per entry: the clipped surrogate loss -min(r A, clip(r, 1-c, 1+c) A) (Schulman et al. 2017, eq. 7), the entropy,
    the k3 approximation (r - 1) - log r of KL(old || new) and whether r lies outside [1-c, 1+c]."""
    out = []
    for i in range(len(actions)):
        logp = log_softmax(logits[i])
        r = math.exp(logp[actions[i]] - oldlogprob[i])
        clipped_r = min(max(r, 1 - clip), 1 + clip)
        pg = -min(r * adv[i], clipped_r * adv[i])
        entropy = -sum(math.exp(lp) * lp for lp in logp)
        out.append((pg, entropy, r - 1 - math.log(r), float(abs(r - 1) > clip)))
    return out


def ref_rnd_loss(logits, ext_v, int_v, data, args):
    """rnd_ppo_loss from the maths: the means over the minibatch's `count` valid entries of each term, and the loss
    pg - ent_coef entropy + vf_coef (0.5 (V_ext - R_ext)^2 + 0.5 (V_int - R_int)^2)."""
    terms = ppo_terms(logits, data["actions"], data["oldlogprob"], data["adv"], args.clip_coef)
    sums = [0.0] * 6
    for i, (pg, entropy, kl, clipped) in enumerate(terms):
        if data["mask"][i]:
            v_ext, v_int = 0.5 * (ext_v[i] - data["ext_ret"][i]) ** 2, 0.5 * (int_v[i] - data["int_ret"][i]) ** 2
            for k, x in enumerate((pg, v_ext, v_int, entropy, kl, clipped)):
                sums[k] += x
    sums = [s / data["count"] for s in sums]
    return sums[0] - args.ent_coef * sums[3] + args.vf_coef * (sums[1] + sums[2]), sums


def ref_ppg_loss(logits, value, data, clip, ent_coef, vf_coef):
    """policy_loss from the maths: pg - ent_coef entropy + vf_coef 0.5 (V - R)^2, means over `count`."""
    terms = ppo_terms(logits, data["actions"], data["oldlogprob"], data["adv"], clip)
    sums = [0.0] * 5
    for i, (pg, entropy, kl, clipped) in enumerate(terms):
        if data["mask"][i]:
            for k, x in enumerate((pg, 0.5 * (value[i] - data["ext_ret"][i]) ** 2, entropy, kl, clipped)):
                sums[k] += x
    sums = [s / data["count"] for s in sums]
    return sums[0] - ent_coef * sums[2] + vf_coef * sums[1], sums


def kl_old_new(old_row, new_row):
    """KL(old || new) = sum_k p_old(k) log(p_old(k) / p_new(k)), softmaxes in numpy."""
    p = np.exp(old_row - old_row.max())
    p /= p.sum()
    q = np.exp(new_row - new_row.max())
    q /= q.sum()
    return float(np.sum(p * (np.log(p) - np.log(q))))


def ref_aux_loss(logits, aux_value, value, old_logits, returns, mask, count, beta_clone, vf_true_weight):
    """Cobbe et al. 2021 eq. 2 and 4: 0.5 (V_aux - R)^2 + beta_clone KL(pi_old || pi) + vf_true_weight 0.5 (V - R)^2."""
    sums = [0.0, 0.0, 0.0]
    for i in range(len(returns)):
        if mask[i]:
            sums[0] += 0.5 * (aux_value[i] - returns[i]) ** 2
            sums[1] += kl_old_new(old_logits[i], logits[i])
            sums[2] += 0.5 * (value[i] - returns[i]) ** 2
    sums = [s / count for s in sums]
    return sums[0] + beta_clone * sums[1] + vf_true_weight * sums[2], sums


def finite_difference(f, arrays, h=1e-6):
    """Central differences of the scalar f(*arrays) with respect to every element of every array."""
    grads = []
    for k, a in enumerate(arrays):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            up, down = [x.copy() for x in arrays], [x.copy() for x in arrays]
            up[k][idx] += h
            down[k][idx] -= h
            g[idx] = (f(*up) - f(*down)) / (2 * h)
        grads.append(g)
    return grads


def pooled(prior_mean, prior_var, prior_count, samples):
    """Mean and (population) variance of a pseudo-sample of prior_count points with the given moments pooled with
    samples, from the raw sums: E[x] and E[x^2] weighted by count, var = E[x^2] - E[x]^2."""
    samples = np.asarray(samples, dtype=np.float64)
    total = prior_count + samples.shape[0]
    mean = (prior_count * prior_mean + samples.sum(0)) / total
    second = (prior_count * (prior_var + prior_mean**2) + (samples**2).sum(0)) / total
    return mean, second - mean**2, total


def gae_stream(rewards, values, next_values, not_last, gamma, lam):
    """A_t = sum_{l>=0} (gamma lam)^l delta_{t+l} over one stream, stopping after the first entry with not_last 0;
    delta_j = r_j + gamma next_values_j - values_j (next_values already zero where nothing is bootstrapped)."""
    n, out = len(rewards), []
    for i in range(n):
        total, weight = 0.0, 1.0
        for j in range(i, n):
            total += weight * (rewards[j] + gamma * next_values[j] - values[j])
            if not not_last[j]:
                break
            weight *= gamma * lam
        out.append(total)
    return out


def rollout(rng, T, N):
    """A consistent (T, N) rollout under next-step autoreset: a step after a done is a reset step (valid 0), a reset
    step is never a done, terminations are dones; step 0 may be a reset step (the last rollout ended in a done)."""
    done, term, valid = np.zeros((T, N)), np.zeros((T, N)), np.ones((T, N))
    valid[0] = rng.random(N) > 0.3
    for s in range(T):
        if s > 0:
            valid[s] = 1 - done[s - 1]
        done[s] = valid[s] * (rng.random(N) < 0.3)
        term[s] = done[s] * (rng.random(N) < 0.5)
    rewards, values, next_value = rng.normal(size=(T, N)), rng.normal(size=(T, N)), rng.normal(size=N)
    return rewards, values, next_value, term, done, valid


def ref_gae(rewards, values, next_value, term, done, valid, gamma, lam):
    """Episodic GAE per env: a valid step's advantage sums its episode's deltas up to the episode's done (or the end of
    the rollout); values[t + 1] is V of the observation after step t (the final frame after a truncation, bootstrapped;
    a termination bootstraps nothing); the reset step's advantage is 0."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        nxt = [values[s + 1, n] if s + 1 < T else next_value[n] for s in range(T)]
        nxt = [v * (1 - term[s, n]) for s, v in enumerate(nxt)]
        stream = gae_stream(rewards[:, n], values[:, n], nxt, [1 - d for d in done[:, n]], gamma, lam)
        adv[:, n] = np.where(valid[:, n] > 0, stream, 0.0)
    return adv


def ref_intrinsic_gae(rewards, values, next_value, valid, gamma, lam):
    """Non-episodic GAE per env: the reset steps taken out, the rest one unbroken stream that bootstraps from
    next_value at its end; reset steps get 0."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        kept = [s for s in range(T) if valid[s, n]]
        vals = [values[s, n] for s in kept]
        stream = gae_stream([rewards[s, n] for s in kept], vals, vals[1:] + [next_value[n]], [1] * len(kept), gamma, lam)
        for s, a in zip(kept, stream, strict=True):
            adv[s, n] = a
    return adv


# ---------------------------------------------------------------------------------------------------------------
# Advantage estimation
# ---------------------------------------------------------------------------------------------------------------
@BOTH
@SEEDS
def test_compute_gae_matches_the_episodic_sum_of_deltas(module, seed):
    """Fails if a termination bootstraps, a truncation does not, a done does not cut the sum, a reset step gets an
    advantage, gamma and lambda are misplaced, or the returns are not advantages + values."""
    rng = np.random.default_rng(seed)
    T, N, gamma, lam = 9, 5, rng.uniform(0.8, 0.99), rng.uniform(0.5, 0.97)
    rewards, values, next_value, term, done, valid = rollout(rng, T, N)
    assert ((done - term) > 0).any() and (term > 0).any() and (valid == 0).any()  # truncations, terminations, resets
    adv, returns = module.compute_gae(t64(rewards), t64(values), t64(next_value), t64(term), t64(done), t64(valid), gamma, lam)
    expected = ref_gae(rewards, values, next_value, term, done, valid, gamma, lam)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=RTOL64, atol=1e-12)
    np.testing.assert_allclose(returns.numpy(), expected + values, rtol=RTOL64, atol=1e-12)


@SEEDS
def test_intrinsic_gae_runs_on_across_episode_ends_without_the_reset_steps(seed):
    """Fails if the intrinsic stream stops (or its bootstrap is cut) at an episode end, if the reset step's reward or
    value enters the stream, or if a reset step gets an advantage."""
    rng = np.random.default_rng(seed)
    T, N, gamma, lam = 9, 5, rng.uniform(0.8, 0.99), rng.uniform(0.5, 0.97)
    rewards, values, next_value, _, done, valid = rollout(rng, T, N)
    valid[-1, 0], valid[-2, 0] = 0, 1  # env 0 ends the rollout on a reset step: its done step bootstraps next_value
    assert (done[:-1] > 0).any()  # episode ends inside the rollout, which the stream must cross
    adv, returns = rnd.intrinsic_gae(t64(rewards), t64(values), t64(next_value), t64(valid), gamma, lam)
    expected = ref_intrinsic_gae(rewards, values, next_value, valid, gamma, lam)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=RTOL64, atol=1e-12)
    np.testing.assert_allclose(returns.numpy(), expected + values, rtol=RTOL64, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Advantage normalisation
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "seed, valid_count, scale", [(0, 24, 1.0), (1, 15, 1.0), (2, 7, 1.0), (3, 1, 1.0), (4, 0, 1.0), (5, 2, 1.0), (6, 9, 1e-7)]
)
def test_rnd_standardize_is_the_sample_standardisation_of_the_valid_entries(seed, valid_count, scale):
    """CleanRL's norm_adv: (A - mean) / (sample std (n - 1) + 1e-8) over the valid entries, 0 on the others; one valid
    entry standardises to 0, none leaves all zeros; two divide by n - 1 = 1; with a spread of 1e-7 the 1e-8 counts.
    Fails with the variance for the std, the population std, another floor on n - 1, the epsilon subtracted, or
    statistics that count the masked entries."""
    rng = np.random.default_rng(seed)
    adv = rng.normal(1.5, 3.7, 24) * scale
    mask = np.zeros(24)
    mask[rng.permutation(24)[:valid_count]] = 1
    kept = adv[mask > 0]
    expected = np.zeros(24)
    if valid_count > 1:
        expected[mask > 0] = (kept - kept.mean()) / (kept.std(ddof=1) + 1e-8)
    out = rnd.standardize(t64(adv), t64(mask))
    np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL64, atol=1e-9)


@pytest.mark.parametrize("seed, scale", [(0, 1.0), (1, 1.0), (2, 1.0), (3, 1e-7)])
def test_ppg_normalize_advantages_uses_the_population_moments_of_the_valid_entries(seed, scale):
    """The reference's compute_advantage: (A - mean) / (sqrt(population variance) + 1e-8) over the whole batch's
    valid entries (tu.mpi_moments), 0 on reset steps; with a spread of 1e-7 the 1e-8 counts. Fails with the variance
    for the std, n - 1, the epsilon subtracted, or reset steps counted."""
    rng = np.random.default_rng(seed)
    adv = rng.normal(-0.7, 4.2, (8, 6)) * scale
    valid = (rng.random((8, 6)) > 0.25).astype(float)
    kept = adv[valid > 0]
    expected = np.where(valid > 0, (adv - kept.mean()) / (kept.std(ddof=0) + 1e-8), 0.0)
    out = ppg.normalize_advantages(t64(adv), t64(valid))
    np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL64, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# The clipped PPO losses
# ---------------------------------------------------------------------------------------------------------------
def ppo_case(seed, n=14, actions_n=5):
    """Random entries whose probability ratios lie below 1-c, inside and above 1+c (never within 0.3 c of a boundary)
    with advantages of both signs: the first four entries are (below, A > 0), (below, A < 0), (above, A > 0),
    (above, A < 0), all valid; `count` exceeds the chunk's valid entries, as for a chunk of a larger minibatch."""
    rng = np.random.default_rng(seed)
    clip = [0.1, 0.2, 0.3, 0.15][seed % 4]
    k = rng.choice([-2.5, -1.6, -0.6, 0.0, 0.5, 1.5, 2.8], n)
    k[:4] = [-2.0, -1.5, 1.5, 2.2]
    sign = rng.choice([-1.0, 1.0], n)
    sign[:4] = [1, -1, 1, -1]
    mask = (rng.random(n) > 0.25).astype(float)
    mask[:4] = 1
    logits = rng.normal(0, 1.5, (n, actions_n))
    actions = rng.integers(0, actions_n, n)
    ratio = 1 + clip * k
    oldlogprob = np.array([log_softmax(logits[i])[actions[i]] for i in range(n)]) - np.log(ratio)
    data = dict(
        actions=actions, oldlogprob=oldlogprob, adv=sign * (np.abs(rng.normal(size=n)) + 0.1), mask=mask,
        count=mask.sum() + rng.integers(0, 4), ext_ret=rng.normal(size=n), int_ret=rng.normal(size=n),
    )  # fmt: skip
    return rng, clip, logits, data


@SEEDS
def test_rnd_ppo_loss_matches_the_clipped_surrogate_and_both_value_losses(seed):
    """Terms, loss and gradient (logits and both value heads, against central differences of the reference). Fails if
    either clip is dropped or one-sided in the wrong place, an advantage sign is mishandled, a value loss is missing
    or weighed wrongly, masked entries count, the means are not over `count`, or a term is cut from the gradient."""
    rng, clip, logits, data = ppo_case(seed)
    n = len(data["actions"])
    ext_v, int_v = rng.normal(size=n), rng.normal(size=n)
    args = rnd.Args(clip_coef=clip, ent_coef=rng.uniform(0.001, 0.1), vf_coef=rng.uniform(0.3, 2.0))
    inputs = [t64(x).requires_grad_() for x in (logits, ext_v, int_v)]
    loss, sums = rnd.rnd_ppo_loss(
        inputs[0], torch.as_tensor(data["actions"]), t64(data["oldlogprob"]), t64(data["adv"]), inputs[1], inputs[2],
        t64(data["ext_ret"]), t64(data["int_ret"]), t64(data["mask"]), float(data["count"]), args,
    )  # fmt: skip
    expected_loss, expected_sums = ref_rnd_loss(logits, ext_v, int_v, data, args)
    np.testing.assert_allclose(sums.numpy(), expected_sums, rtol=RTOL64, atol=1e-12)
    assert loss.item() == pytest.approx(expected_loss, rel=RTOL64)
    loss.backward()
    numeric = finite_difference(lambda *a: ref_rnd_loss(*a, data, args)[0], [logits, ext_v, int_v])
    for x, g in zip(inputs, numeric, strict=True):
        np.testing.assert_allclose(x.grad.numpy(), g, rtol=1e-5, atol=1e-8)


@SEEDS
def test_ppg_policy_loss_matches_the_clipped_surrogate_and_the_value_loss(seed):
    """As for RND's loss, with one value head and the coefficients passed as arguments. Fails if either clip is dropped,
    an advantage sign is mishandled, the value loss or entropy is weighed wrongly, masked entries count, the means are
    not over `count`, or a term is cut from the gradient."""
    rng, clip, logits, data = ppo_case(seed + 10)
    value = rng.normal(size=len(data["actions"]))
    ent_coef, vf_coef = rng.uniform(0.001, 0.1), rng.uniform(0.3, 2.0)
    inputs = [t64(x).requires_grad_() for x in (logits, value)]
    loss, sums = ppg.policy_loss(
        inputs[0], torch.as_tensor(data["actions"]), t64(data["oldlogprob"]), t64(data["adv"]), inputs[1],
        t64(data["ext_ret"]), t64(data["mask"]), float(data["count"]), clip, ent_coef, vf_coef,
    )  # fmt: skip
    expected_loss, expected_sums = ref_ppg_loss(logits, value, data, clip, ent_coef, vf_coef)
    np.testing.assert_allclose(sums.numpy(), expected_sums, rtol=RTOL64, atol=1e-12)
    assert loss.item() == pytest.approx(expected_loss, rel=RTOL64)
    loss.backward()
    numeric = finite_difference(lambda *a: ref_ppg_loss(*a, data, clip, ent_coef, vf_coef)[0], [logits, value])
    for x, g in zip(inputs, numeric, strict=True):
        np.testing.assert_allclose(x.grad.numpy(), g, rtol=1e-5, atol=1e-8)


def test_the_losses_do_not_validate_their_inputs():
    """Both losses build their Categorical without argument validation, which would check every logit and action on
    each call (on a GPU, a wait for the device every chunk): a NaN logit gives a NaN loss instead of an exception. Fails
    if validation is switched on (validate_args True, or left to torch's default)."""
    _, clip, logits, data = ppo_case(0)
    logits[1, 2] = np.nan
    n = len(data["actions"])
    common = (torch.as_tensor(data["actions"]), t64(data["oldlogprob"]), t64(data["adv"]))
    loss, _ = rnd.rnd_ppo_loss(
        t64(logits), *common, t64(np.zeros(n)), t64(np.zeros(n)), t64(data["ext_ret"]), t64(data["int_ret"]),
        t64(data["mask"]), float(data["count"]), rnd.Args(clip_coef=clip),
    )  # fmt: skip
    assert math.isnan(loss.item())
    loss, _ = ppg.policy_loss(
        t64(logits), *common, t64(np.zeros(n)), t64(data["ext_ret"]), t64(data["mask"]), float(data["count"]), clip, 0.01, 0.5
    )
    assert math.isnan(loss.item())


@pytest.mark.parametrize("seed", range(3))
def test_predictor_loss_is_the_mean_error_of_the_chosen_valid_frames_over_count(seed):
    """Fails if masked frames count or the sum is divided by anything but `count`."""
    rng = np.random.default_rng(seed)
    errors, mask = rng.random(11) * 3, (rng.random(11) > 0.3).astype(float)
    count = mask.sum() + seed
    expected = sum(e for e, m in zip(errors, mask, strict=True) if m) / count
    assert rnd.predictor_loss(t64(errors), t64(mask), t64(count)).item() == pytest.approx(expected, rel=RTOL64)


# ---------------------------------------------------------------------------------------------------------------
# PPG's auxiliary phase
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed, scale", [(0, 1.0), (1, 3.0), (2, 40.0)])
def test_categorical_kl_is_kl_from_the_old_policy_to_the_new(seed, scale):
    """KL(old || new) against numpy's softmaxes, including logits of +-40*N(0,1) (overflow without the max taken out),
    and its gradient in the new logits, softmax(new) - softmax(old). Fails with the direction reversed, a wrong
    normalisation, or an unstable softmax."""
    rng = np.random.default_rng(seed)
    old, new = rng.normal(0, scale, (7, 6)), rng.normal(0, scale, (7, 6))
    new_t = t64(new).requires_grad_()
    kl = ppg.categorical_kl(t64(old), new_t)
    np.testing.assert_allclose(kl.detach().numpy(), [kl_old_new(o, w) for o, w in zip(old, new, strict=True)], rtol=RTOL64)
    kl.sum().backward()
    p, q = (np.exp(x - x.max(1, keepdims=True)) for x in (old, new))
    np.testing.assert_allclose(new_t.grad.numpy(), q / q.sum(1, keepdims=True) - p / p.sum(1, keepdims=True), atol=1e-12)


@pytest.mark.parametrize("seed, beta_clone, vf_true_weight", [(0, 0.37, 2.3), (1, 1.9, 0.0), (2, 0.0, 0.61), (3, 1.0, 1.0)])
def test_aux_loss_weighs_the_aux_value_the_clone_kl_and_the_true_value(seed, beta_clone, vf_true_weight):
    """Terms, loss and gradient (logits, aux value, value). Fails if beta_clone or vf_true_weight is dropped or
    misplaced, the KL is reversed, masked entries count, the means are not over `count`, or a head gets no gradient."""
    rng = np.random.default_rng(seed)
    n, a = 9, 4
    logits, old_logits = rng.normal(0, 1.5, (n, a)), rng.normal(0, 1.5, (n, a))
    aux_value, value, returns = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
    mask = (rng.random(n) > 0.3).astype(float)
    count = mask.sum() + 2
    inputs = [t64(x).requires_grad_() for x in (logits, aux_value, value)]
    loss, sums = ppg.aux_loss(
        inputs[0], t64(old_logits), inputs[1], inputs[2], t64(returns), t64(mask), count, beta_clone, vf_true_weight
    )

    def ref(lg, av, v):
        return ref_aux_loss(lg, av, v, old_logits, returns, mask, count, beta_clone, vf_true_weight)

    expected_loss, expected_sums = ref(logits, aux_value, value)
    np.testing.assert_allclose(sums.numpy(), expected_sums, rtol=RTOL64)
    assert loss.item() == pytest.approx(expected_loss, rel=RTOL64)
    loss.backward()
    numeric = finite_difference(lambda *x: ref(*x)[0], [logits, aux_value, value])
    for x, g in zip(inputs, numeric, strict=True):
        np.testing.assert_allclose(x.grad.numpy(), g, rtol=1e-5, atol=1e-8)


# ---------------------------------------------------------------------------------------------------------------
# Running statistics and reward scales
# ---------------------------------------------------------------------------------------------------------------
@BOTH
@SEEDS
def test_update_mean_var_count_gives_the_moments_of_the_pooled_samples(module, seed):
    """Two sample sets merged give the mean and population variance of their union; from the initial state (mean 0,
    var 1, count 1e-4) the pseudo-sample is pooled in too. Fails with a wrong cross term or weighting."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(2.0, 3.0, (5 + seed, 3)), rng.normal(-1.0, 0.5, (3 + 2 * seed, 3))
    mean, var, count = module.update_mean_var_count(
        t64(a.mean(0)), t64(a.var(0)), a.shape[0], t64(b.mean(0)), t64(b.var(0)), b.shape[0]
    )
    union = np.concatenate([a, b])
    np.testing.assert_allclose(mean.numpy(), union.mean(0), rtol=RTOL64)
    np.testing.assert_allclose(var.numpy(), union.var(0), rtol=RTOL64)
    assert count == a.shape[0] + b.shape[0]
    mean, var, count = module.update_mean_var_count(t64(0.0), t64(1.0), t64(1e-4), t64(b.mean(0)), t64(b.var(0)), len(b))
    exp_mean, exp_var, exp_count = pooled(0.0, 1.0, 1e-4, b)
    np.testing.assert_allclose(mean.numpy(), exp_mean, rtol=RTOL64)
    np.testing.assert_allclose(var.numpy(), exp_var, rtol=RTOL64)
    assert count.item() == pytest.approx(exp_count, rel=1e-12)


@pytest.mark.parametrize("seed, chunk", [(0, 1), (1, 3), (2, 64)])
def test_frame_statistics_and_normalised_frames_against_numpy(seed, chunk):
    """Per-pixel statistics of uint8 frames over two updates (chunks that do not divide the batch, or exceed it; some
    pixels constant) equal numpy's pooled moments with the initial pseudo-count; the normalised frames are
    (x - mean) / std clipped to [-5, 5], both clips reached. Fails with a wrong merge, var for std, or another clip."""
    rng = np.random.default_rng(seed)
    batches = [rng.integers(0, 256, (n, 1, 5, 6), dtype=np.uint8) for n in (7, 10)]
    batches[1][:, :, 0] = 200
    stats = rnd.RunningMeanStd((1, 5, 6), CPU)
    mean, var, count = np.zeros((1, 5, 6)), np.ones((1, 5, 6)), 1e-4
    seen = []
    for batch in batches:
        rnd.update_frame_stats(stats, torch.as_tensor(batch), chunk=chunk)
        seen.append(batch)
        mean, var, count = pooled(0.0, 1.0, 1e-4, np.concatenate(seen).astype(np.float64))
    np.testing.assert_allclose(stats.mean.numpy(), mean, rtol=1e-9)
    np.testing.assert_allclose(stats.var.numpy(), var, rtol=1e-9)
    assert stats.count.item() == pytest.approx(count, rel=1e-12)

    stats.var[0, 1] = 0.01  # a few pixels almost never change: their frames land far outside +-5 std
    frames = rng.integers(0, 256, (4, 1, 5, 6), dtype=np.uint8)
    expected = np.clip((frames - stats.mean.numpy()) / np.sqrt(stats.var.numpy()), -5.0, 5.0)
    assert (expected == 5.0).any() and (expected == -5.0).any() and (np.abs(expected) < 5).any()
    out = rnd.normalize_frames(torch.as_tensor(frames), stats)
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL32, atol=1e-5)


def test_frame_statistics_are_computed_on_the_frames_device():
    """The sums are accumulated where the frames are (a GPU in training; here torch's meta device, which has no data
    but checks devices as a GPU does). Fails if the accumulators are made on the CPU: adding the frames' sums to them
    or merging them into the statistics then raises."""
    meta = torch.device("meta")
    stats = rnd.RunningMeanStd((1, 5, 6), meta)
    rnd.update_frame_stats(stats, torch.zeros((7, 1, 5, 6), dtype=torch.uint8, device=meta), chunk=3)
    assert stats.mean.device == stats.var.device == stats.count.device == meta
    assert stats.mean.shape == stats.var.shape == (1, 5, 6)


def ref_forward_filter(rewards, rewems, valid, gamma):
    """RewardForwardFilter per env: rewems <- gamma rewems + r on valid steps, unchanged on reset steps."""
    filtered, rewems = np.zeros_like(rewards), np.array(rewems, dtype=np.float64)
    for s in range(rewards.shape[0]):
        for n in range(rewards.shape[1]):
            if valid[s, n]:
                rewems[n] = gamma * rewems[n] + rewards[s, n]
            filtered[s, n] = rewems[n]
    return filtered, rewems


@pytest.mark.parametrize("seed, p_valid", [(0, 0.8), (1, 0.5), (2, 1.0), (3, 0.0)])
def test_forward_filter_and_the_intrinsic_reward_scale(seed, p_valid):
    """The filter per env over two rollouts (its last value carried), then the running statistics of the filtered values
    of valid steps (pooled with a prior state: numpy's moments of everything seen) and the rewards divided by the
    running std. Fails if a reset step adds to the filter or counts in the variance, the filter is reset or not
    carried, the discount is misplaced, or the rewards are divided by the variance."""
    rng = np.random.default_rng(seed)
    T, N, gamma = 6, 4, rng.uniform(0.9, 0.999)
    stats = rnd.RunningMeanStd((), CPU)
    stats.mean, stats.var, stats.count = t64(0.4), t64(2.5), t64(3.0)
    mean, var, count, kept = 0.4, 2.5, 3.0, []
    rewems = rng.random(N).astype(np.float32)
    for _ in range(2):
        rewards = rng.random((T, N)).astype(np.float32) * 2
        valid = (rng.random((T, N)) < p_valid).astype(np.float32)
        filtered, new_rewems = ref_forward_filter(rewards.astype(np.float64), rewems, valid, gamma)
        got, got_rewems = rnd.forward_filter(torch.as_tensor(rewards), torch.as_tensor(rewems), torch.as_tensor(valid), gamma)
        np.testing.assert_allclose(got.numpy(), filtered, rtol=RTOL32)
        np.testing.assert_allclose(got_rewems.numpy(), new_rewems, rtol=RTOL32)
        kept += list(filtered[valid > 0])
        if kept:
            mean, var, count = pooled(0.4, 2.5, 3.0, kept)
        scaled, got_rewems = rnd.normalize_intrinsic(
            torch.as_tensor(rewards), torch.as_tensor(rewems), torch.as_tensor(valid), stats, gamma
        )
        assert scaled.dtype == torch.float32
        assert stats.mean.item() == pytest.approx(mean, rel=RTOL32) and stats.var.item() == pytest.approx(var, rel=RTOL32)
        assert stats.count.item() == pytest.approx(count, rel=1e-12)
        np.testing.assert_allclose(scaled.numpy(), rewards / np.sqrt(var), rtol=RTOL32)
        np.testing.assert_allclose(got_rewems.numpy(), new_rewems, rtol=RTOL32)
        rewems = new_rewems.astype(np.float32)


@pytest.mark.parametrize("seed, clip, scale", [(0, 10.0, 1.0), (1, 0.8, 1.0), (2, 0.5, 1.0), (3, 10.0, 1e-4)])
def test_scale_reward_divides_by_the_running_std_of_the_discounted_return(seed, clip, scale):
    """Step by step: each env's discounted return G <- gamma G + r (0 again after a done), every step's G pooled into the
    running variance (prior mean 0, var 1, count 1e-4), the reward divided by sqrt(var + 1e-8) and clipped to
    [-clip, clip] (both sides reached with the small clips); with rewards of 1e-4 the variance is about 1e-6 and the
    1e-8 counts. Fails if G is not reset at dones (or reset before it is counted), the std is the variance, the 1e-8
    is subtracted, or the clip is one-sided."""
    rng = np.random.default_rng(seed)
    T, N, gamma = 12, 6, 0.95
    rewards, dones = rng.normal(0, scale, (T, N)), rng.random((T, N)) < 0.2
    stats, ret = ppg.RunningMeanStd((), CPU), np.zeros(N)
    ref_ret, seen, clipped = np.zeros(N), [], set()
    for s in range(T):
        kw = {} if clip == 10.0 else dict(clip=clip)
        scaled, ret = ppg.scale_reward(rewards[s], ret, dones[s], stats, gamma, **kw)
        ref_ret = gamma * ref_ret + rewards[s]
        seen += list(ref_ret)
        var = pooled(0.0, 1.0, 1e-4, seen)[1]
        raw = rewards[s] / math.sqrt(var + 1e-8)
        clipped |= {int(np.sign(x)) for x in raw if abs(x) > clip}
        np.testing.assert_allclose(scaled, np.clip(raw, -clip, clip), rtol=RTOL64)
        ref_ret = np.where(dones[s], 0.0, ref_ret)
        np.testing.assert_allclose(ret, ref_ret, rtol=RTOL64, atol=1e-12)
    assert clipped == (set() if clip == 10.0 else {-1, 1})


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_scale_reward_clips_to_10_by_default(sign):
    """The training loop passes no clip: the first step's equal rewards give a discounted return of almost no variance
    (only the prior's pseudo-count), so reward / std is about 170 and is clipped to +-10. Fails with another default."""
    N = 6
    seen = list(np.full(N, sign))
    raw = sign / math.sqrt(pooled(0.0, 1.0, 1e-4, seen)[1] + 1e-8)
    assert abs(raw) > 100
    stats = ppg.RunningMeanStd((), CPU)
    scaled, _ = ppg.scale_reward(np.array(seen), np.zeros(N), np.zeros(N, dtype=bool), stats, 0.99)
    np.testing.assert_array_equal(scaled, np.full(N, 10.0 * sign))


# ---------------------------------------------------------------------------------------------------------------
# Masked statistics and the learning rate
# ---------------------------------------------------------------------------------------------------------------
@BOTH
@pytest.mark.parametrize("case", ["random", "constant_returns", "no_valid"])
def test_masked_mean_and_explained_variance(module, case):
    """masked_mean is the mean of the valid entries (0 with none); explained variance 1 - Var(R - V) / Var(R) with
    population variances over the valid entries, NaN where the valid returns do not vary. Fails if masked entries
    count, the ratio is inverted, or the NaN case returns a number."""
    rng = np.random.default_rng(7)
    values, returns = rng.normal(size=20), rng.normal(1.0, 2.0, 20)
    mask = (rng.random(20) > 0.3).astype(float) if case != "no_valid" else np.zeros(20)
    if case == "constant_returns":
        returns = np.where(mask > 0, 3.25, returns)
    kept = mask > 0
    mean = returns[kept].mean() if kept.any() else 0.0
    assert module.masked_mean(t64(returns), t64(mask)).item() == pytest.approx(mean, rel=RTOL64, abs=1e-12)
    ev = module.explained_variance(t64(values), t64(returns), t64(mask)).item()
    if case == "random":
        r, v = returns[kept], values[kept]
        assert ev == pytest.approx(1 - np.var(r - v) / np.var(r), rel=RTOL64)
    else:
        assert math.isnan(ev)


@BOTH
def test_annealed_lr_decays_linearly_from_the_rate_at_iteration_1(module):
    """Fails if the first iteration does not get the full rate, the decay is not linear in the iteration, or the
    flag is ignored."""
    for i in (1, 2, 7, 10):
        assert module.annealed_lr(3e-4, i, 10, True) == pytest.approx(3e-4 * (1 - (i - 1) / 10), rel=1e-12)
        assert module.annealed_lr(3e-4, i, 10, False) == 3e-4


# ---------------------------------------------------------------------------------------------------------------
# RND's two advantage streams, mixed in main
# ---------------------------------------------------------------------------------------------------------------
def test_main_mixes_ext_coef_times_the_extrinsic_advantage_with_int_coef_times_the_intrinsic_one(tmp_path, monkeypatch):
    """One iteration of main (1 env x 4 steps, no statistics rollouts) with both advantage estimators replaced by
    known random streams: the batch's advantages are ext_coef A_ext + int_coef A_int, its returns each estimator's, and
    each estimator gets its own discount. Fails if the coefficients are swapped or dropped, or the discounts or the
    returns are swapped."""
    T, N = 4, 1
    gen = torch.Generator().manual_seed(0)
    ext_adv, ext_ret, int_adv, int_ret = (torch.randn(T, N, generator=gen) for _ in range(4))
    seen = {}

    def fake_gae(*a):
        seen["gamma"] = a[-2]
        return ext_adv.clone(), ext_ret.clone()

    def fake_intrinsic_gae(*a):
        seen["int_gamma"] = a[-2]
        return int_adv.clone(), int_ret.clone()

    def fake_update(steps, batch, obs_rms, args, memory=None):
        seen["batch"] = {k: v.clone() for k, v in batch.items()}
        return {"rnd_loss": torch.zeros(())}  # the loss terms by name

    monkeypatch.setattr(rnd, "compute_gae", fake_gae)
    monkeypatch.setattr(rnd, "intrinsic_gae", fake_intrinsic_gae)
    monkeypatch.setattr(rnd, "rnd_ppo_update", fake_update)
    args = rnd.Args(
        num_envs=N, num_steps=T, num_minibatches=1, total_timesteps=T * N, num_iterations_obs_norm_init=0, cuda=False,
        ext_coef=0.3, int_coef=1.7, gamma=0.97, int_gamma=0.91, progress_interval=1e9,
    )  # fmt: skip
    proc = run_in_process("rnd_ppo", lambda module: module.main(args), tmp_path)
    assert proc.returncode == 0, proc.stderr
    batch = seen["batch"]
    np.testing.assert_allclose(batch["advantages"].numpy(), (0.3 * ext_adv + 1.7 * int_adv).flatten().numpy(), rtol=RTOL32)
    np.testing.assert_allclose(batch["ext_returns"].numpy(), ext_ret.flatten().numpy())
    np.testing.assert_allclose(batch["int_returns"].numpy(), int_ret.flatten().numpy())
    assert seen["gamma"] == 0.97 and seen["int_gamma"] == 0.91
