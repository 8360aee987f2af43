#!/usr/bin/env bash
# OpenAI ES (Salimans et al. 2017, "Evolution Strategies as a Scalable Alternative to Reinforcement Learning"): the
# commands of its benchmark, 3 seeds each, through the runner. Hyperparameters: the Humanoid configuration of the
# paper's code (github.com/openai/evolution-strategies-starter, configurations/humanoid.json): noise_stdev 0.02,
# l2coeff 0.005, Adam stepsize 0.01, centered-rank fitness shaping, 256-256 tanh MLP for MuJoCo, observation
# normalisation; es.py's presets hold them. Their population was at least 10,000 episodes a generation on 1,440
# CPUs; here it is one envpool batch of 256 (--population-size).
#
#   env               generations  preset   reference
#   CartPole-v1       100          classic  475 = gymnasium's reward_threshold for CartPole-v1 (solved), not an ES
#                                           result; tests/test_es.py measured the mean policy at 500 by generation 3
#   Pendulum-v1       100          classic  no published ES figure found; the classic preset does not learn it (mean
#                                           policy -1053 after 100 generations; -1120 with sigma 0.1; -1064 after 300
#                                           generations with sigma 0.05, Adam 0.03)
#   Pendulum-v1,      300          control  found by the `tune` study below on Pendulum-v1 (seeds 1-2); no published
#   MountainCarContinuous-v0                ES figure found for either env
#   HalfCheetah-v4    500          mujoco   Salimans et al. 2017, Table 3: no final returns, only the timesteps ES
#   Hopper-v4         500          mujoco   needed to reach 25/50/75/100% of TRPO's score at 5M steps (TRPO's
#                                           figures from Schulman et al. 2015, -v1 envs); nothing to put in
#                                           references.csv as a return at a step count
#   (--preset auto picks control for these two Box-action classic-control envs, mujoco for other Box actions)
#
# What to compare: `charts/episodic_return` is one perturbed member's episode (population-size points per
# generation; report.py averages the last 100), `charts/population_mean_return` the generation's mean fitness,
# `charts/max_return` its best member, `eval/episodic_return` the unperturbed mean policy
# every --eval-every generations and, with --save-model, the final reloaded model's episodes. The paper reports
# the mean policy.
#
# Usage: bash benchmark/es.sh [classic|control|mujoco|all|speed|tune]   (OMP_NUM_THREADS=1 per run, set by the runner)
#   tune: the Optuna study behind the control preset: 40 trials of 2 seeds x 300 generations on Pendulum-v1, the
#         classic preset's settings first, median pruning after 50 generations; about 25 minutes on a 2-core CPU.
#         Its table and plots go to benchmark/results/es_pendulum_tuning/.
# Classic control: about a minute a run on a quiet 2-core CPU. MuJoCo: 500 generations of 256 episodes of up to
# 1,000 steps is up to 128M env steps a run: hours on a 2-core CPU, wants many cores (torchrun) or a GPU for the
# 256-256 networks.
#   speed: population throughput against envpool's random-action throughput for the same env and number of envs
#          (CartPole-v1, 256 members), then 1 process against 2 under torchrun (same seed, same work).
set -euo pipefail
cd "$(dirname "$0")/.."
family="${1:-classic}"

source benchmark/common.sh

if [[ $family == classic || $family == all ]]; then
  bench es es_cartpole CartPole-v1 -- --save-model
  bench es es_pendulum Pendulum-v1 -- --save-model --preset classic
fi
if [[ $family == control || $family == all ]]; then bench es es_control Pendulum-v1 MountainCarContinuous-v0 -- --save-model; fi
if [[ $family == tune ]]; then
  python benchmark/tune.py --script es --env-ids Pendulum-v1 --trials 40 --seeds 2 --study-name es_pendulum \
    --param sigma=log:0.005:0.5 --param learning-rate=log:0.001:0.3 --param l2-coef=log:0.00001:0.05 \
    --param norm-obs=cat:true,false --enqueue sigma=0.02,learning-rate=0.01,l2-coef=0.005,norm-obs=true \
    --report-every 512000 --prune-warmup 5 -- --preset classic --num-generations 300 --no-cuda
  mkdir -p benchmark/results/es_pendulum_tuning
  cp benchmark/tuning/es_pendulum/{trials.md,history.png,importances.png} benchmark/results/es_pendulum_tuning/
fi
if [[ $family == mujoco || $family == all ]]; then bench es es_mujoco HalfCheetah-v4 Hopper-v4 -- --save-model; fi

if [[ $family == speed ]]; then
  # 1. the rollout alone (batched forward + envpool, env steps counted whether a member is done or not) and the
  #    whole training loop (its logged charts/SPS: real transitions, update included), against envpool's
  #    random-action throughput for 256 envs
  python - <<'EOF'
import os, subprocess, sys, tempfile, time
import envpool, numpy as np, torch
sys.path.insert(0, "algorithms")
sys.path.insert(0, "benchmark")
import es
from tblog import read_scalars

torch.set_num_threads(1)
P, env_id = 256, "CartPole-v1"

def env_sps(seconds=5.0):
    envs = envpool.make(env_id, env_type="gymnasium", num_envs=P, seed=0)
    envs.reset()
    rng, steps, start = np.random.default_rng(0), 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(rng.integers(0, 2, P))
        steps += P
    return steps / (time.perf_counter() - start)

with tempfile.TemporaryDirectory() as tmp:  # a trained population: every member plays the full 500 steps
    flags = ["--num-generations", "30", "--eval-every", "0", "--save-model", "--population-size", str(P)]
    subprocess.run([sys.executable, os.path.abspath("algorithms/es.py"), *flags], cwd=tmp, check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    (run,) = (os.path.join(tmp, "runs", d) for d in os.listdir(os.path.join(tmp, "runs")))
    train_sps = read_scalars(run)["charts/SPS"][-1][1]
    model = es.load_checkpoint(os.path.join(run, "es.model"), es.Args.env_id, kind="model")  # the safe loader
policy = es.Policy(4, 2, tuple(model["args"]["hidden_sizes"]))
policy.load_state_dict(model["model"])
rms = es.ObsStatistics((4,), torch.device("cpu"))
rms.load_state_dict(model["obs_rms"])
shift, scale = es.frozen_normalizer(rms, 4, torch.device("cpu"))
theta = torch.nn.utils.parameters_to_vector(policy.parameters()).detach()
steps, start, generation = 0, time.perf_counter(), 0
while time.perf_counter() - start < 10.0:
    generation += 1
    noise = es.pair_noise(1, generation, range(P // 2), theta.numel(), torch.device("cpu"))
    layers = es.stack_layers(es.perturb(theta, noise, 0.02), policy.layer_shapes())
    envs = es.make_env(env_id, P, es.generation_env_seed(1, generation))
    episodes = es.Episodes.of(es.rollout(envs, layers, shift, scale, None, None, 500, torch.device("cpu")), 4)
    steps += P * int(episodes.lengths.max())  # every env steps until the longest episode ends
    envs.close()
rollout_sps = steps / (time.perf_counter() - start)
random_sps = env_sps()
print(f"{env_id}, {P} envs: envpool random actions {random_sps:,.0f} steps/s")
print(f"  es rollout (trained population, noise + envs made each generation) {rollout_sps:,.0f} steps/s = "
      f"{rollout_sps / random_sps:.1%}")
print(f"  es.py training, 30 generations, logged charts/SPS {train_sps:,.0f} steps/s = {train_sps / random_sps:.1%}")
EOF
  # 2. one process against two under torchrun: the same seed plays the same episodes, so the same work
  for n in 1 2; do
    tmp=$(mktemp -d)
    (cd "$tmp" && OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node "$n" \
      "$OLDPWD/algorithms/es.py" --num-generations 20 --eval-every 0 --exp-name "torchrun$n" >/dev/null 2>&1)
    python -c "import sys, glob; sys.path.insert(0, 'benchmark'); from tblog import read_scalars
sps = read_scalars(glob.glob('$tmp/runs/*')[0])['charts/SPS'][-1][1]
print(f'torchrun --nproc_per_node $n: {sps:,.0f} steps/s (CartPole-v1, 256 members, 20 generations)')"
    rm -rf "$tmp"
  done
fi
