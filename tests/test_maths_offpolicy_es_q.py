"""The pure maths of dqn.py, ddpg_td3.py, es.py and qlearning.py against references written here from the maths
(plain Python loops or numpy, never the modules' own helpers), over seeded random cases that reach every branch:

- dqn.py: td_target (max, Double DQN, terminations), q_loss (mse, huber; value, mean Q, gradient), soft_update,
  linear_schedule;
- ddpg_td3.py: smoothed_target_actions, td_target (minimum over 1-3 critics), soft_update, exploration_actions;
- es.py: centered_ranks (ties share their mean rank; made on the fitness's device), perturb, es_gradient,
  update_mean_var_count, update_from_sums (down to one observation), normalize_frozen, stack_layers +
  population_forward (both of its branches);
- qlearning.py: discretise (float64 bounds; on the observations' device), q_update (duplicates, terminations, reset
  steps, the TD error of a single valid transition), linear_interp, greedy_actions, exact_return (brute-force
  enumeration on a hand-made MDP).
"""

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch

from conftest import load_algorithm

dqn = load_algorithm("dqn")
td3 = load_algorithm("ddpg_td3")
es = load_algorithm("es")
qlearning = load_algorithm("qlearning")

SEEDS = range(4)


def f64(x) -> torch.Tensor:
    return torch.tensor(np.asarray(x, dtype=np.float64))


def close(got: torch.Tensor, expected, tol: float = 1e-12) -> None:
    np.testing.assert_allclose(got.detach().numpy(), np.asarray(expected, dtype=np.float64), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------------------------
# dqn.py
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("double", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_dqn_td_target_matches_a_loop(seed, double):
    """y = r + gamma * (1 - done) * Q_target(s', a*), a* the target's own argmax (DQN) or the online net's (Double
    DQN). Fails if Double DQN picks a* with the target net, if a terminated step bootstraps, or if gamma is misplaced."""
    rng = np.random.default_rng(seed)
    batch, n_actions, gamma = 40, 5, rng.uniform(0.5, 0.999)
    rewards, terms = rng.normal(size=batch), (rng.random(batch) < 0.3).astype(float)
    q_target, q_online = rng.normal(size=(batch, n_actions)), rng.normal(size=(batch, n_actions))
    assert 0 < terms.sum() < batch and (q_target.argmax(1) != q_online.argmax(1)).any()  # every branch matters
    expected = []
    for i in range(batch):
        chooser = q_online[i] if double else q_target[i]
        best = max(range(n_actions), key=lambda a, c=chooser: c[a])  # continuous draws: no ties
        expected.append(rewards[i] + (0.0 if terms[i] else gamma * q_target[i][best]))
    got = dqn.td_target(f64(rewards), f64(terms), f64(q_target), gamma, f64(q_online) if double else None)
    close(got, expected)


@pytest.mark.parametrize("loss", ["mse", "huber"])
@pytest.mark.parametrize("seed", SEEDS)
def test_dqn_q_loss_value_mean_q_and_gradient(seed, loss):
    """Mean over the batch of (Q(s, a) - y)^2 (mse) or of the Huber loss with threshold 1 (0.5 e^2 below, |e| - 0.5
    above); the mean Q of the taken actions; the gradient reaches only the taken actions. Fails if the loss reads
    other actions' Q-values, uses another Huber threshold or scale, or swaps the two kinds."""
    rng = np.random.default_rng(seed)
    batch, n_actions = 32, 4
    q = rng.normal(scale=2.0, size=(batch, n_actions))
    actions = rng.integers(0, n_actions, batch)
    targets = q[np.arange(batch), actions] + rng.normal(scale=1.5, size=batch)
    errors = [q[i][actions[i]] - targets[i] for i in range(batch)]
    assert min(map(abs, errors)) < 1 < max(map(abs, errors))  # both sides of the Huber threshold
    per_item, grad = [], np.zeros((batch, n_actions))
    for i, e in enumerate(errors):
        if loss == "mse":
            per_item.append(e * e)
            grad[i][actions[i]] = 2 * e / batch
        else:
            per_item.append(0.5 * e * e if abs(e) < 1 else abs(e) - 0.5)
            grad[i][actions[i]] = (e if abs(e) < 1 else np.sign(e)) / batch
    q_tensor = f64(q).requires_grad_(True)
    value, q_mean = dqn.q_loss(q_tensor, torch.tensor(actions), f64(targets), loss)
    assert value.item() == pytest.approx(sum(per_item) / batch, rel=1e-12)
    assert q_mean.item() == pytest.approx(sum(q[i][actions[i]] for i in range(batch)) / batch, rel=1e-12)
    value.backward()
    close(q_tensor.grad, grad)


def small_nets(module, seed):
    """(online, target): two networks of module's kind with different random weights."""
    torch.manual_seed(seed)
    if module is td3:
        return td3.Critics(3, 2, 5, 2), td3.Critics(3, 2, 5, 2)
    return tuple(torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2)) for _ in range(2))


@pytest.mark.parametrize("tau", [1.0, 0.3, 0.005])
@pytest.mark.parametrize("module", [dqn, td3], ids=["dqn", "ddpg_td3"])
def test_soft_update_is_polyak_averaging_and_tau_1_a_copy(module, tau):
    """target <- tau * online + (1 - tau) * target for every parameter, online untouched; tau = 1 copies exactly.
    Fails if tau weighs the wrong network, a parameter is skipped, or the hard copy is off by rounding."""
    online, target = small_nets(module, seed=int(tau * 1000))
    before = [p.detach().double().numpy().copy() for p in target.parameters()]
    online_before = [p.detach().clone() for p in online.parameters()]
    module.soft_update(target, online, tau)
    for t, o, b, o0 in zip(target.parameters(), online.parameters(), before, online_before, strict=True):
        assert torch.equal(o, o0)
        if tau == 1.0:
            assert torch.equal(t, o)
        else:
            np.testing.assert_allclose(t.detach().double().numpy(), tau * o.detach().double().numpy() + (1 - tau) * b,
                                       rtol=1e-6, atol=1e-7)  # fmt: skip


@pytest.mark.parametrize("start, end, duration", [(1.0, 0.05, 100), (1.0, 0.01, 1e4), (0.4, 0.4, 7), (0.8, 0.0, 3)])
def test_dqn_linear_schedule_before_during_after(start, end, duration):
    """From start at t = 0 straight down to end at t = duration, then end for ever (check_args keeps start >= end).
    Fails if the slope, the intercept or the floor after the decay is wrong."""
    rng = np.random.default_rng(int(duration))
    steps = [0, duration, 3 * duration, *rng.integers(1, int(duration) + 1, 5), *rng.integers(int(duration), 10**6, 3)]
    for t in steps:
        expected = end if t >= duration else start + (end - start) * t / duration
        assert dqn.linear_schedule(start, end, duration, int(t)) == pytest.approx(expected, rel=1e-12, abs=1e-12), t


# ---------------------------------------------------------------------------------------------------------------
# ddpg_td3.py
# ---------------------------------------------------------------------------------------------------------------
def random_bounds(rng, dim):
    low = rng.uniform(-3.0, 0.5, dim)
    high = low + rng.uniform(0.5, 4.0, dim)
    return low, high, (high - low) / 2


@pytest.mark.parametrize("seed", SEEDS)
def test_td3_smoothed_target_actions_clip_noise_then_action(seed):
    """a' = clip(mu'(s') + clip(eps, -c, c) * half_range, low, high), per dimension. Fails if the noise clip is missing
    on either side, the noise is not scaled to the bounds, or the action is not clipped to both bounds."""
    rng = np.random.default_rng(seed)
    batch, dim, noise_clip = 64, 3, 0.5
    low, high, scale = random_bounds(rng, dim)
    actions = rng.uniform(low, high, (batch, dim))
    noise = rng.normal(scale=0.6, size=(batch, dim))
    expected = np.zeros((batch, dim))
    for i, j in itertools.product(range(batch), range(dim)):
        eps = min(max(noise[i][j], -noise_clip), noise_clip)
        expected[i][j] = min(max(actions[i][j] + eps * scale[j], low[j]), high[j])
    assert (noise > noise_clip).any() and (noise < -noise_clip).any()
    assert (expected == low).any() and (expected == high).any()  # both clips of the action act somewhere
    got = td3.smoothed_target_actions(f64(actions), f64(noise), noise_clip, f64(scale), f64(low), f64(high))
    close(got, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_td3_exploration_actions_are_clipped_to_the_bounds(seed):
    """a = clip(mu(s) + eps * half_range, low, high), the noise unclipped. Fails if the action passes a bound or
    the noise is clipped or not scaled."""
    rng = np.random.default_rng(seed)
    batch, dim = 64, 4
    low, high, scale = random_bounds(rng, dim)
    actions, noise = rng.uniform(low, high, (batch, dim)), rng.normal(scale=0.4, size=(batch, dim))
    expected = [[min(max(actions[i][j] + noise[i][j] * scale[j], low[j]), high[j]) for j in range(dim)] for i in range(batch)]
    assert (np.array(expected) == low).any() and (np.array(expected) == high).any() and (abs(noise) > 1).any()
    close(td3.exploration_actions(f64(actions), f64(noise), f64(scale), f64(low), f64(high)), expected)


@pytest.mark.parametrize("critics", [1, 2, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_td3_td_target_takes_the_minimum_over_critics(seed, critics):
    """y = r + gamma * (1 - done) * min_k Q'_k(s', a'): DDPG with one critic, TD3's clipped double Q with two. Fails
    if it takes the max or the mean over the critics, or bootstraps through a termination."""
    rng = np.random.default_rng(seed)
    batch, gamma = 48, rng.uniform(0.5, 0.999)
    rewards, terms = rng.normal(size=batch), (rng.random(batch) < 0.3).astype(float)
    next_q = rng.normal(size=(critics, batch))
    assert 0 < terms.sum() < batch
    expected = [rewards[i] + (0.0 if terms[i] else gamma * min(next_q[k][i] for k in range(critics))) for i in range(batch)]
    close(td3.td_target(f64(rewards), f64(terms), f64(next_q), gamma), expected)


# ---------------------------------------------------------------------------------------------------------------
# es.py
# ---------------------------------------------------------------------------------------------------------------
def centered_ranks_reference(fitness):
    """Salimans et al. 2017's shaping: 0-based ranks, ties sharing their mean rank, scaled to [-0.5, 0.5]."""
    f = np.asarray(fitness, dtype=np.float64)
    below = (f[None, :] < f[:, None]).sum(1)
    equal = (f[None, :] == f[:, None]).sum(1)
    return (below + (equal - 1) / 2) / (len(f) - 1) - 0.5


@pytest.mark.parametrize("size, distinct", [(2, 1), (2, 2), (8, 3), (16, 1000), (64, 5), (33, 4)])
@pytest.mark.parametrize("seed", SEEDS)
def test_es_centered_ranks_with_ties(seed, size, distinct):
    """Ranks 0..P-1 (ties share their mean rank) mapped to [-0.5, 0.5]; mean 0; invariant under a monotone change of
    the fitness. Fails if ties are broken by sort order, ranks are reversed, or the scaling is off."""
    rng = np.random.default_rng(seed)
    fitness = rng.integers(0, distinct, size).astype(np.float64) * 3.7 - 20.0
    expected = centered_ranks_reference(fitness)
    for dtype in (torch.float64, torch.float32):
        got = es.centered_ranks(torch.tensor(fitness, dtype=dtype))
        close(got, expected)
    close(es.centered_ranks(torch.tensor(np.exp(fitness / 10))), expected)
    assert abs(expected.sum()) < 1e-9


@pytest.mark.parametrize("seed", SEEDS)
def test_es_centered_ranks_are_made_on_the_fitness_device(seed):
    """The ranks live on the fitness's device, whatever torch's default device is (a CUDA run's fitness is on the GPU).
    The 'meta' default device, which holds no numbers, stands in for another device here. Fails if any tensor of the
    computation is made on the default device instead."""
    rng = np.random.default_rng(seed)
    fitness = rng.integers(0, 4, 10).astype(np.float64)
    with torch.device("meta"):
        got = es.centered_ranks(torch.tensor(fitness, device="cpu"))
    assert got.device.type == "cpu"
    close(got, centered_ranks_reference(fitness))


@pytest.mark.parametrize("seed", SEEDS)
def test_es_perturb_is_plus_then_minus_for_each_pair(seed):
    """Member 2j = theta + sigma eps_j and member 2j + 1 = theta - sigma eps_j. Fails if the signs or pairs are swapped
    or sigma is left out."""
    rng = np.random.default_rng(seed)
    pairs, dim, sigma = 5, 7, rng.uniform(0.01, 0.5)
    theta, noise = rng.normal(size=dim), rng.normal(size=(pairs, dim))
    expected = []
    for j in range(pairs):
        expected.append([theta[d] + sigma * noise[j][d] for d in range(dim)])
        expected.append([theta[d] - sigma * noise[j][d] for d in range(dim)])
    close(es.perturb(f64(theta), f64(noise), sigma), expected)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", SEEDS)
def test_es_gradient_is_the_sum_over_the_antithetic_population(seed, dtype):
    """g = 1/(P sigma) sum_i F_i eps_i with eps_2j = eps_j and eps_2j+1 = -eps_j (perturb's members); with the
    members' own displacements (theta_i - theta) / sigma too. Fails with the antithetic signs swapped, a factor of
    2 (dividing by the number of pairs), or sigma misplaced."""
    rng = np.random.default_rng(seed)
    pairs, dim, sigma = 6, 9, rng.uniform(0.01, 0.5)
    shaped, noise = rng.normal(size=2 * pairs), rng.normal(size=(pairs, dim))
    population = 2 * pairs
    expected = np.zeros(dim)
    for i in range(population):
        eps = noise[i // 2] if i % 2 == 0 else -noise[i // 2]
        expected += shaped[i] * eps
    expected /= population * sigma
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    got = es.es_gradient(f64(shaped), f64(noise).to(dtype), sigma)
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=tol, atol=tol)
    # the same sum written with the members perturb makes
    theta = rng.normal(size=dim)
    members = es.perturb(f64(theta), f64(noise), sigma).numpy()
    by_members = sum(shaped[i] * (members[i] - theta) / sigma for i in range(population)) / (population * sigma)
    np.testing.assert_allclose(by_members, expected, rtol=1e-9, atol=1e-9)


def moments(x):
    x = np.asarray(x, dtype=np.float64)
    return x.mean(0), x.var(0), len(x)


@pytest.mark.parametrize("seed", SEEDS)
def test_es_update_mean_var_count_equals_numpy_over_the_concatenation(seed):
    """Merging the moments of batch after batch gives numpy's mean and (population) variance of all the rows together.
    Fails if the cross term delta^2 n_a n_b / n is missing or the weights of the two means are swapped."""
    rng = np.random.default_rng(seed)
    batches = [rng.normal(loc=rng.normal(scale=3), scale=rng.uniform(0.1, 4), size=(rng.integers(1, 30), 3)) for _ in range(4)]
    mean, var, count = (f64(m) for m in moments(batches[0]))
    for k in range(1, len(batches)):
        b_mean, b_var, b_count = moments(batches[k])
        mean, var, count = es.update_mean_var_count(mean, var, count, f64(b_mean), f64(b_var), b_count)
        all_rows = np.concatenate(batches[: k + 1])
        close(mean, all_rows.mean(0), 1e-10)
        close(var, all_rows.var(0), 1e-10)
        assert float(count) == len(all_rows)


@pytest.mark.parametrize("seed", SEEDS)
def test_es_update_from_sums_equals_numpy_over_the_concatenation(seed):
    """The sums of x and x^2 over n observations, merged into running statistics, give numpy's moments over all the
    observations; from fresh ObsStatistics, those of the data plus its prior (mass 1e-4 at mean 0, variance 1);
    count 0 changes nothing. Fails if the batch variance is not E[x^2] - E[x]^2 or the count is mishandled."""
    rng = np.random.default_rng(seed)
    first, second = rng.normal(2.0, 3.0, size=(17, 4)), rng.normal(-1.0, 0.5, size=(9, 4))
    rms = es.ObsStatistics((4,), torch.device("cpu"))
    rms.mean, rms.var, rms.count = (f64(m) for m in moments(first))
    es.update_from_sums(rms, f64(second.sum(0)), f64((second**2).sum(0)), f64(len(second)))
    both = np.concatenate([first, second])
    close(rms.mean, both.mean(0), 1e-10)
    close(rms.var, both.var(0), 1e-10)
    assert float(rms.count) == len(both)
    before = [t.clone() for t in (rms.mean, rms.var, rms.count)]
    es.update_from_sums(rms, f64(np.zeros(4)), f64(np.zeros(4)), f64(0.0))  # no observation this generation
    assert all(torch.equal(a, b) for a, b in zip(before, (rms.mean, rms.var, rms.count), strict=True))
    # fresh statistics: the weighted moments of the prior pseudo-observation and the data
    fresh, prior = es.ObsStatistics((4,), torch.device("cpu")), 1e-4
    es.update_from_sums(fresh, f64(both.sum(0)), f64((both**2).sum(0)), f64(len(both)))
    mass = prior + len(both)
    mean = both.sum(0) / mass
    close(fresh.mean, mean, 1e-10)
    close(fresh.var, (prior * 1.0 + (both**2).sum(0)) / mass - mean**2, 1e-9)


def test_es_update_from_sums_merges_a_single_observation():
    """One observation (count 1) is merged like any other batch: numpy's moments over the earlier rows and it. Fails
    if a count of 1 is skipped as if nothing had been observed."""
    rng = np.random.default_rng(7)
    first, one = rng.normal(size=(5, 3)), rng.normal(size=(1, 3))
    rms = es.ObsStatistics((3,), torch.device("cpu"))
    rms.mean, rms.var, rms.count = (f64(m) for m in moments(first))
    es.update_from_sums(rms, f64(one.sum(0)), f64((one**2).sum(0)), f64(1.0))
    both = np.concatenate([first, one])
    close(rms.mean, both.mean(0), 1e-10)
    close(rms.var, both.var(0), 1e-10)
    assert float(rms.count) == 6


def test_es_update_from_sums_never_makes_a_negative_variance():
    """A constant observation whose E[x^2] - E[x]^2 rounds below zero (0.1 three times) merged into statistics of
    variance 0: the variance stays >= 0 (sqrt(var + 1e-8) is taken later). Fails without the clamp at 0."""
    x = [0.1, 0.1, 0.1]
    assert sum(v * v for v in x) / 3 - (sum(x) / 3) ** 2 < 0  # the rounding the clamp is there for
    rms = es.ObsStatistics((1,), torch.device("cpu"))
    rms.mean, rms.var, rms.count = f64([0.1]), f64([0.0]), f64(5.0)
    es.update_from_sums(rms, f64([sum(x)]), f64([sum(v * v for v in x)]), f64(3.0))
    assert rms.var.item() >= 0.0 and rms.var.item() == pytest.approx(0.0, abs=1e-15)
    assert rms.mean.item() == pytest.approx(0.1, rel=1e-15) and rms.count.item() == 8.0


@pytest.mark.parametrize("clip", [5.0, 1.5])
@pytest.mark.parametrize("seed", SEEDS)
def test_es_normalize_frozen_clips_both_sides(seed, clip):
    """(obs - shift) / scale, clipped to [-clip, clip] (5 by default). Fails if either clip is missing or the
    statistics are applied the wrong way round."""
    rng = np.random.default_rng(seed)
    obs, shift, scale = rng.normal(scale=8.0, size=(50, 3)), rng.normal(size=3), rng.uniform(0.3, 2.0, 3)
    expected = [[min(max((obs[i][d] - shift[d]) / scale[d], -clip), clip) for d in range(3)] for i in range(50)]
    assert (np.array(expected) == clip).any() and (np.array(expected) == -clip).any()
    args = (f64(obs), f64(shift), f64(scale)) + ((clip,) if clip != 5.0 else ())
    close(es.normalize_frozen(*args), expected)


@pytest.mark.parametrize(
    "obs_dim, hidden, n_out",
    [(4, (6,), 2), (5, (8, 3), 3), (12, (9, 4), 2), (3, (), 4)],  # inputs <= 8 (multiply-and-sum), > 8 (baddbmm)
)
@pytest.mark.parametrize("seed", range(2))
def test_es_population_forward_equals_a_loop_of_matrix_products(seed, obs_dim, hidden, n_out):
    """Member p's flat parameters are, layer by layer, the weight (out, in) row by row then the bias (nn.Linear's
    parameters_to_vector order); its network is tanh hidden layers and a linear output, on its own observation.
    Fails if stack_layers reads the weights transposed or out of order, or either branch of population_forward
    multiplies the wrong way or misplaces the tanh."""
    rng = np.random.default_rng(seed)
    sizes = [obs_dim, *hidden, n_out]
    shapes = [(n_o, n_i) for n_i, n_o in zip(sizes[:-1], sizes[1:], strict=True)]
    members = 6
    thetas = rng.normal(size=(members, sum(o * i + o for o, i in shapes)))
    x = rng.normal(size=(members, obs_dim))
    expected = []
    for p in range(members):
        h, offset = x[p], 0
        for k, (n_o, n_i) in enumerate(shapes):
            w = thetas[p, offset : offset + n_o * n_i].reshape(n_o, n_i)
            offset += n_o * n_i
            b = thetas[p, offset : offset + n_o]
            offset += n_o
            h = w @ h + b
            h = np.tanh(h) if k < len(shapes) - 1 else h
        expected.append(h)
    got = es.population_forward(es.stack_layers(f64(thetas), shapes), f64(x))
    close(got, expected, 1e-10)


# ---------------------------------------------------------------------------------------------------------------
# qlearning.py
# ---------------------------------------------------------------------------------------------------------------
def cell_reference(x, low, high, bins):
    """The cell of x in a uniform grid of bins cells on [low, high]: how many inner edges low + k (high - low) / bins
    lie at or below x, in exact rational arithmetic (a value on an edge belongs to the cell above; outside the
    bounds, the edge cells)."""
    x, low, high = Fraction(float(x)), Fraction(float(low)), Fraction(float(high))
    return sum(1 for k in range(1, bins) if x >= low + k * (high - low) / bins)


@pytest.mark.parametrize("bins", [1, 2, 5, 8])
@pytest.mark.parametrize("seed", SEEDS)
def test_discretise_random_points_edges_and_out_of_range(seed, bins):
    """Row index = row-major number of the per-dimension cells (first dimension slowest); values at or beyond the
    bounds fall in the edge cells; a value on an inner edge in the cell above. Fails if the clip is off by one at
    either end, the index is column-major, or edges go to the cell below."""
    rng = np.random.default_rng(seed)
    dims = 3
    # dyadic bounds, with a power-of-2 bins the inner edges are exact floats: "on an edge" means the same to both
    low = rng.integers(-8, 0, dims) / 2.0
    high = low + rng.integers(1, 9, dims) * 2.0
    span = high - low
    points = [rng.uniform(low - 0.5 * span, high + 0.5 * span) for _ in range(60)]
    points += [low, high, low - 1e-9, high + 1e-9, low - 1e6, high + 1e6]
    if bins & (bins - 1) == 0:  # a power of 2: the inner edges of dyadic bounds are exact floats
        points += [low + rng.integers(1, bins + 1, dims) * span / bins for _ in range(10)]  # inner edges and the top
    grid = qlearning.Grid(tuple(low.tolist()), tuple(high.tolist()), bins)
    expected = []
    for point in points:
        index = 0
        for d in range(dims):
            index = index * bins + cell_reference(point[d], low[d], high[d], bins)
        expected.append(index)
    assert grid.num_states == bins**dims
    assert qlearning.discretise(f64(points), grid).tolist() == expected
    assert qlearning.discretise(f64(points).reshape(-1, 1, 3), grid).tolist() == expected  # any observation shape


@pytest.mark.parametrize("bins", [2, 3, 7])
def test_discretise_keeps_bounds_that_are_not_float32_numbers(bins):
    """Bounds such as 0.1 (--obs-low / --obs-high) are float64 numbers, and so are the inner edges between them: a
    value a hair (1e-11 of the range) either side of an edge lands on its own side. Fails if a bound is rounded to
    float32 on the way, which moves the edges by about 1e-9 to 1e-7 of the range."""
    low, high = np.array([0.1, -1.3, 2.7]), np.array([1.1, 0.7, 3.3])
    assert (low.astype(np.float32) != low).all() and (high.astype(np.float32) != high).all()
    span = high - low
    points = [low + k * span / bins + sign * 1e-11 * span for k in range(1, bins) for sign in (-1, 1)]
    grid = qlearning.Grid(tuple(low.tolist()), tuple(high.tolist()), bins)
    expected = []
    for point in points:
        index = 0
        for d in range(3):
            index = index * bins + cell_reference(point[d], low[d], high[d], bins)
        expected.append(index)
    assert len(set(expected)) == bins  # both sides of every edge: every cell is reached
    assert qlearning.discretise(f64(points), grid).tolist() == expected


@pytest.mark.parametrize("seed", SEEDS)
def test_discretise_works_on_the_observations_device(seed):
    """The grid's bounds and the row strides are made on the observations' device, whatever torch's default device is
    (a CUDA run's observations are on the GPU). The 'meta' default device, which holds no numbers, stands in for
    another device here. Fails if any of them is made on the default device instead."""
    rng = np.random.default_rng(seed)
    low, high, bins = np.array([-1.0, 0.0]), np.array([1.0, 3.0]), 4
    points = rng.uniform(low - 1.0, high + 1.0, (20, 2))
    grid = qlearning.Grid(tuple(low.tolist()), tuple(high.tolist()), bins)
    expected = [
        cell_reference(p[0], low[0], high[0], bins) * bins + cell_reference(p[1], low[1], high[1], bins) for p in points
    ]
    with torch.device("meta"):
        got = qlearning.discretise(torch.tensor(points, device="cpu"), grid)
    assert got.device.type == "cpu" and got.tolist() == expected


def test_discretise_keeps_discrete_ids():
    """A Discrete space is its own table (bins 0): the ids as they are, as long integers. Fails if they are
    remapped."""
    ids = torch.tensor([5, 0, 3, 499, 5], dtype=torch.int32)
    got = qlearning.discretise(ids, qlearning.Grid())
    assert got.dtype == torch.int64 and got.tolist() == [5, 0, 3, 499, 5]


def q_update_reference(q, batch, gamma, lr):
    """The documented update, literally: each valid transition's target r + gamma max_a' Q(s', a') (no bootstrap
    after a termination) from the table before the batch; each (s, a) pair hit n times moves towards the mean of its
    targets by 1 - (1 - lr)^n. Also the mean |target - Q(s, a)| over the valid transitions."""
    new, hits, errors = [row[:] for row in q], {}, []
    for s, a, r, s2, term, valid in batch:
        if valid:
            target = r + (0.0 if term else gamma * max(q[s2]))
            hits.setdefault((s, a), []).append(target)
            errors.append(abs(target - q[s][a]))
    for (s, a), targets in hits.items():
        step = 1.0 - (1.0 - lr) ** len(targets)
        new[s][a] = q[s][a] + step * (sum(targets) / len(targets) - q[s][a])
    return new, (sum(errors) / len(errors) if errors else 0.0)


def run_q_update(q, batch, gamma, lr):
    s, a, r, s2, term, valid = zip(*batch, strict=True)
    table = f64(q)
    ints = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    td = qlearning.q_update(table, ints(s), ints(a), f64(r), ints(s2), f64(term), f64(valid), gamma=gamma, lr=lr)
    return table, td


@pytest.mark.parametrize("seed", SEEDS)
def test_q_update_matches_the_documented_rule(seed):
    """Many envs hit few (state, action) pairs in one step, with terminations and reset steps (valid 0, carrying
    garbage). Fails if a reset step changes the table or counts as a duplicate, a termination bootstraps, the
    duplicates' step is not 1 - (1 - lr)^n, the targets read a table already updated (as one update per env in
    turn would), the result depends on the envs' order, or the TD error is averaged over the wrong transitions."""
    rng = np.random.default_rng(seed)
    states, n_actions, n, gamma, lr = 6, 3, 48, rng.uniform(0.5, 0.99), rng.uniform(0.05, 0.9)
    q = rng.normal(size=(states, n_actions)).tolist()
    batch = [
        (int(rng.integers(states - 1)), int(rng.integers(n_actions)), float(rng.normal()), int(rng.integers(states)),
         float(rng.random() < 0.25), float(rng.random() < 0.8))
        for _ in range(n)
    ]  # fmt: skip
    for _ in range(2):  # reset steps on pairs of the last state, which no valid transition of the batch hits
        batch.insert(int(rng.integers(n)), (states - 1, int(rng.integers(n_actions)), 5.0, 0, 0.0, 0.0))
    valid_pairs = {(s, a) for s, a, *_, v in batch if v}
    shared = {(s, a) for s, a, *_, v in batch if not v} & valid_pairs
    assert shared and max(sum(1 for b in batch if b[:2] == p and b[5]) for p in valid_pairs) >= 3
    assert any(b[4] and b[5] for b in batch)
    expected, expected_td = q_update_reference(q, batch, gamma, lr)
    for order in (range(len(batch)), rng.permutation(len(batch))):  # the envs' order does not matter
        table, td = run_q_update(q, [batch[i] for i in order], gamma, lr)
        close(table, expected)
        assert td.item() == pytest.approx(expected_td, rel=1e-12)


@pytest.mark.parametrize("hits", [1, 2, 5])
def test_q_update_duplicates_with_one_target_equal_n_updates_in_a_row(hits):
    """n envs with the same transition in one step move Q(s, a) as n one-step updates q += lr (y - q) in a row would
    (y fixed: s' is terminal). Fails if duplicates count once, or add n full steps."""
    q, gamma, lr, target = [[0.5, -1.0], [2.0, 0.25]], 0.9, 0.3, 4.0
    batch = [(0, 1, target, 1, 1.0, 1.0)] * hits + [(1, 0, 7.0, 0, 0.0, 0.0)]  # and a reset step
    table, _ = run_q_update(q, batch, gamma, lr)
    sequential = q[0][1]
    for _ in range(hits):
        sequential += lr * (target - sequential)
    close(table, [[0.5, sequential], [2.0, 0.25]])


def test_q_update_with_only_reset_steps_changes_nothing():
    """A step where every env was resetting: the table is unchanged and the TD error 0 (not a division by 0)."""
    q = [[1.0, 2.0], [3.0, 4.0]]
    table, td = run_q_update(q, [(0, 1, 5.0, 1, 0.0, 0.0), (1, 0, -3.0, 0, 1.0, 0.0)], 0.9, 0.5)
    assert table.tolist() == q and td.item() == 0.0


@pytest.mark.parametrize("with_reset_step", [False, True])
def test_q_update_td_error_of_a_single_valid_transition(with_reset_step):
    """One valid transition (a run with one env), alone or beside a reset step: the TD error is its own
    |r + gamma max Q(s', .) - Q(s, a)|. Fails if the mean divides by more than the one valid transition."""
    q, gamma, lr = [[1.0, 2.0], [3.0, 4.0]], 0.9, 0.5
    batch = [(0, 1, 5.0, 1, 0.0, 1.0)] + [(1, 0, -3.0, 0, 1.0, 0.0)] * with_reset_step
    table, td = run_q_update(q, batch, gamma, lr)
    target = 5.0 + gamma * max(q[1])
    assert td.item() == pytest.approx(abs(target - q[0][1]), rel=1e-12)
    close(table, [[1.0, 2.0 + lr * (target - 2.0)], [3.0, 4.0]])


@pytest.mark.parametrize("start, end, duration", [(1.0, 0.05, 100), (0.1, 0.9, 50), (0.5, 0.5, 10), (0.3, 0.01, 0)])
def test_linear_interp_before_during_after_either_direction(start, end, duration):
    """start at t = 0, end from t = duration on, a straight line between, up or down; duration 0 is end at once.
    Fails if the line is not clamped after the end, or only decreasing schedules work. (With duration 0, t = 0 is
    both "start at t = 0" and "end at once": left out; the script asks from t = num_envs on.)"""
    ts = {0, 1, duration // 3, duration // 2, duration - 1, duration, duration + 1, 10 * duration + 5}
    for t in sorted(t for t in ts if t > 0 or (t == 0 and duration > 0)):
        expected = end if t >= duration else start + (end - start) * t / duration
        assert qlearning.linear_interp(start, end, duration, t) == pytest.approx(expected, rel=1e-12, abs=1e-12), t


@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_actions_break_ties_towards_the_lowest_action(seed):
    """The action of largest Q in each state, the lowest one among equals. Fails if ties go to another action or the
    rows are mixed up."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 3, (7, 4)).astype(np.float64)  # values 0-2 in 4 columns: ties everywhere
    states = rng.integers(0, 7, 30)
    expected = [next(a for a in range(4) if q[s][a] == max(q[s])) for s in states]
    assert any(list(q[s]).count(max(q[s])) > 1 and list(q[s]).index(max(q[s])) == 0 for s in states)
    assert qlearning.greedy_actions(f64(q), torch.tensor(states)).tolist() == expected


# A tiny MDP in gymnasium's P format: P[s][a] = [(probability, next state, reward, terminated), ...]. State 2's action
# 0 ends the episode with probability 0.3 on an outcome that otherwise goes on to the same state.
TINY_MDP = {
    0: {0: [(1.0, 0, 0.0, False)], 1: [(0.5, 1, 1.0, False), (0.5, 2, 0.0, False)]},
    1: {0: [(1.0, 1, 0.5, False)], 1: [(0.6, 1, 3.0, True), (0.4, 0, 0.0, False)]},
    2: {0: [(0.7, 2, 1.0, False), (0.3, 2, 1.0, True)], 1: [(1.0, 0, 2.0, True)]},
}
TINY_START = [0.5, 0.25, 0.25]


def tiny_tables():
    """The MDP as exact_return takes it: (P[s, a, s'], expected reward R[s, a], terminal mass T[s, a, s'], start)."""
    P, R, T = np.zeros((3, 2, 3)), np.zeros((3, 2)), np.zeros((3, 2, 3))
    for s, a in itertools.product(range(3), range(2)):
        for p, s2, r, terminated in TINY_MDP[s][a]:
            P[s, a, s2] += p
            R[s, a] += p * r
            T[s, a, s2] += p * terminated
    return P, R, T, np.array(TINY_START)


def enumerated_return(choose, horizon):
    """Expected undiscounted return over every trajectory of at most `horizon` steps, choose(state, t) the action:
    the sum of probability x return over the leaves of the tree of outcomes."""
    total = 0.0

    def walk(s, t, probability, gained):
        nonlocal total
        if t == horizon:
            total += probability * gained
            return
        for p, s2, r, terminated in TINY_MDP[s][choose(s, t)]:
            if terminated:
                total += probability * p * (gained + r)
            else:
                walk(s2, t + 1, probability * p, gained + r)

    for s, p0 in enumerate(TINY_START):
        walk(s, 0, p0, 0.0)
    return total


@pytest.mark.parametrize("horizon", [1, 2, 3])
def test_exact_return_by_enumerating_trajectories_and_policies(horizon):
    """Each of the 8 stationary policies' return is the sum over all its trajectories; the optimum (policy None) is
    the best of all 2^(3 horizon) time-dependent deterministic policies. Fails if termination mass still bootstraps,
    the horizon is off by one, or the optimum is taken over stationary policies or with the wrong start."""
    tables = tiny_tables()
    stationary = {}
    for policy in itertools.product(range(2), repeat=3):
        stationary[policy] = enumerated_return(lambda s, t, pi=policy: pi[s], horizon)
        assert qlearning.exact_return(tables, np.array(policy), horizon) == pytest.approx(stationary[policy], rel=1e-12)
    best = -np.inf
    for bits in itertools.product(range(2), repeat=3 * horizon):
        best = max(best, enumerated_return(lambda s, t, b=bits: b[3 * t + s], horizon))
    assert qlearning.exact_return(tables, None, horizon) == pytest.approx(best, rel=1e-12)
    if horizon == 3:  # the optimum needs the time: acting the same at every step loses
        assert best > max(stationary.values()) + 1e-6
