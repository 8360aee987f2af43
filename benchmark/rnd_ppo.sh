#!/usr/bin/env bash
# RND + PPO on Atari's hard-exploration games: the exact commands of the paper's setting (sticky actions 0.25, episodes
# capped at 4,500 steps = 18,000 frames, no life-loss episodes, 128 envs x 128 steps, 30K rollouts per env = 491,520,000
# steps = about 2B frames), 3 seeds each, through the runner; references are in benchmark/references.csv.
#
#   env                    steps        reference (mean episodic return)
#   MontezumaRevenge-v5    491,520,000  Burda et al. 2019, Figure 7 (CNN policy, ~2B frames): 8,152 over 3 seeds;
#                                       CleanRL ppo_rnd_envpool.py (docs.cleanrl.dev, PPO + RND page, 2B frames): ~7,100,
#                                       1 seed; plain PPO: CleanRL ppo_atari_envpool_xla_jax.py 0.08 +- 0.12 (its 57-game
#                                       envpool table, docs/benchmark/ppo_atari_envpool_xla_jax.md, 10M steps, 3 seeds)
#   Venture-v5             491,520,000  Burda et al. 2019 (RND, CNN policy; the paper's results table, as Papers with Code
#   Gravitar-v5                         lists it): Venture 1,859, Gravitar 3,906, PrivateEye 8,666 (also Solaris 3,282,
#   PrivateEye-v5                       Pitfall -3); `bash benchmark/rnd_ppo.sh 491520000 others`
#
# What to watch besides the return: charts/rooms_visited_total and charts/episode_rooms (Montezuma and Pitfall only),
# charts/intrinsic_reward, losses/rnd_loss.
#
# A full run is a GPU job of days. On a 2-core x86 CPU the 491M steps would take years; the random-action statistics
# alone (50 x 128 steps of 128 envs, 819,200 env steps) take minutes there (the run prints the time and logs
# charts/obs_norm_init_seconds).
#
# Usage: bash benchmark/rnd_ppo.sh [STEPS] [montezuma|others]   (default 491520000 montezuma; a smaller STEPS runs the
# same commands shorter)
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-491520000}"
which="${2:-montezuma}"

source benchmark/common.sh

case "$which" in
  montezuma) bench rnd_ppo rnd_ppo_montezuma MontezumaRevenge-v5 -- --total-timesteps "$steps" --checkpoint-every 16777216 ;;
  others) bench rnd_ppo rnd_ppo_others Venture-v5 Gravitar-v5 PrivateEye-v5 -- --total-timesteps "$steps" --checkpoint-every 16777216 ;;
  *) echo "usage: bash benchmark/rnd_ppo.sh [STEPS] [montezuma|others]" >&2; exit 2 ;;
esac
