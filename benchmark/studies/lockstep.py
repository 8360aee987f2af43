"""One of this project's files and its CleanRL counterpart, run on the same data, from the same weights, with the same
draws, on the CPU in float32: every parameter and the optimiser's moments compared after every optimiser step.

    python benchmark/studies/lockstep.py                         # every pair; CleanRL's files fetched at CLEANRL_COMMIT
    python benchmark/studies/lockstep.py --cleanrl PATH          # a clone of vwxyzjn/cleanrl (read with git show)
    python benchmark/studies/lockstep.py --only ppo-atari --out benchmark/runs/lockstep.md

A learning curve is a weak proof that two implementations do the same maths: two that differ in a detail can land in
the same band. Here both sides step a scripted env (the same observations and rewards whatever the actions, standing in
for envpool behind each side's own API), take their actions from a fixed sequence that neither policy chooses (so a
near tie between two actions cannot split the runs), shuffle their minibatches with the same permutations, and start
from the reference's initial weights, copied into ours by position once their names' roles and shapes are checked.
What is compared is the update's maths: after every optimiser step, each parameter and each of the optimiser's
moments (Adam's two, RMSprop's mean square) must be within float32 rounding of the reference's (max |ours - reference|
<= 1e-5 x (1 + the reference tensor's largest magnitude)); so must each minibatch's loss. CleanRL's file runs
unchanged but for the ports cleanrl_speed.py lists.

The replay pairs (DQN, DDPG, TD3) explore with scripted actions (DQN: the coin always explores; DDPG and TD3: scripted
uniform actions before learning starts) and draw every replay sample's indices from one script, among the transitions
both sides hold; TD3's target policy smoothing noise is scripted too. CleanRL's critics (one nn.Linear stack each,
under one optimiser) are compared in ours' layout (as_critics: one batched module, the critics stacked), and ours'
target networks, copied from the online ones before the optimiser is made, get the reference's weights as well. DQN's
Atari pair scripts one new frame a step, stacked four deep as an emulator's, since ours stores the newest frame alone.

The PPG pair runs a whole phase (both policy iterations, all six auxiliary epochs) on procgen's ProcgenEnv as CleanRL
wraps it (channels-last frames of the same script). ppg_procgen.py follows openai/phasic-policy-gradient, which departs
from CleanRL's file within a phase: a second Adam for the auxiliary phase, no leftover policy gradient in its first
step, the advantages' population std. Those are made CleanRL's by make_same, and each is left as ours in turn, which
must not match (run_departures, as scenario 2 below); the rest of CleanRL's settings are flags on one side or the other.
The RND pair is run the same way: rnd_ppo.py follows openai/random-network-distillation, and seven details differ from
CleanRL's ppo_rnd_envpool.py (DIFFERENCES), some made CleanRL's by editing a copy of ours (TEXT_PATCHES: a network's
shape, say), the others on its functions. Its one optimiser holds two modules (the agent and RND's predictor), and the
fixed random target network, in no optimiser, gets the reference's weights too; CleanRL's random choice of the frames
the predictor learns from is scripted to the ones ours takes (the first quarter of each minibatch).

Two scenarios per pair. 1: no episode ends. 2: the scripted env ends episodes (about one env step in 20, a third of
them by a time limit) with envpool's and gymnasium 1.x's next-step autoreset. There ours departs from CleanRL on
purpose (DIFFERENCES: it bootstraps a truncation, and masks out the reset step; docs/ppo.md gives the sources), so ours
runs three times: with both departures made CleanRL's way (make_same, a patch of ours' compute_gae), which must match,
and with each left as ours, which must not: so each departure is real, reached by the data, and the only one. With
memory (ppo-lstm) there is a third, where the memory is zeroed, made CleanRL's by an edit of ours (TEXT_PATCHES). The
replay pairs have no second scenario: CleanRL's replay files read gymnasium 0.29's same-step autoreset (the final
observation in the step's info), which this next-step scripted env does not stand in for.

A match says nothing about a detail the data never reaches: at the presets' learning rates no ratio leaves PPO's clip
range in two iterations, so a clip made one-sided, doubled or removed matched too. So the first scenario of each PPO
pair (ppo.py's four, PPG, RND) runs at a larger learning rate on both sides (spec["push"]), which takes the policy
ratio, the value change and the gradient norm past their clips; the second keeps each side's defaults. Each side's run
records how far it reaches into its clips (install_reach: the share of each clamp's inputs outside its bounds, the
gradient norms against their bound), and the table gives the reference's. And the study checks itself: in the first
scenario, ours runs once more with a change of the detail that defines the pair's algorithm planted in its copy
(PLANTED: PPO's policy clip, A2C's critic baseline, DQN's and DDPG's target networks, TD3's clipped smoothing noise,
PPG's behaviour-cloning term, RND's intrinsic reward), stopping at the first step that differs; a planted change that
matches fails the study.

Each side runs in a child process of this script (`--side`), which installs the stand-ins and records what it
compares; this process compares the two records. CleanRL's Atari files need gym 0.23 on the path, and the A2C pair
Stable-Baselines3 (a2c.py has no CleanRL counterpart; SB3's A2C is the reference its docs page reproduces), both in
--deps: `pip install --target /tmp/cleanrl_deps --no-deps gym==0.23.1 gym_notices stable-baselines3==2.4.1
cloudpickle pandas python-dateutil tzdata`. Prints one line per pair, what its reference reached of its clips and
its planted change's verdict, then `N of M pairs match; K of L planted changes differ`; exits 0 only when every pair
matches and every planted change differs. The reference side writes each step's tensors to a file of its own as it
takes the step, and ours' side maps each file from disk as it reaches that step and compares at once, keeping only
the verdict: neither holds the steps in memory, which for the Atari DQN pair are about 10 GB (500 steps of the Nature
CNN and Adam's two moments; as much temporary disk). All pairs: about 11 minutes of CPU time, one thread a side (the
planted changes' runs and the larger learning rates add about a tenth); 11 to 17 minutes on 2 cores with other runs
beside them.
"""

import argparse
import os
import runpy
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmark/studies, for the pinned CleanRL
from cleanrl_speed import CLEANRL_COMMIT, cleanrl_file, write_ported  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5  # of (1 + the reference tensor's largest magnitude): float32 rounding over a few dozen Adam steps
OPTIMISERS = {torch.optim.Adam: "Adam", torch.optim.RMSprop: "RMSprop"}  # each optimiser's state compared, by its name
MOMENTS = {"Adam": ("exp_avg", "exp_avg_sq"), "RMSprop": ("square_avg",)}

# Why a pair has no second scenario: the table's row for it
NO_ENDS = {
    "replay": "not driven: CleanRL's file reads gymnasium 0.29's same-step autoreset (the final observation in the step's "
    "info); with ours' next-step autoreset an episode's end costs one more env step (the reset step), so from the first "
    "end on the two files' step counters, replay slots and training schedules no longer fall on the same transitions",
    "same-step": "not driven: SB3's vector env resets an ended env within the step (the final observation in the "
    "step's info), and the scripted env's next-step autoreset does not stand in for it",
    "procgen": "not driven: procgen resets an ended env within the step, envpool on the next one, so from the first end "
    "on the two files' rollouts hold different steps",
}
# (title, our file and flags, CleanRL's file and flags, the scripted env, the leading name of each role's modules, ours'
# deliberate differences at an episode's end: DIFFERENCES, or why scenario 2 is not driven: NO_ENDS)
PAIRS = {
    "ppo-atari": (
        "ppo.py Breakout-v5 (atari preset) against ppo_atari_envpool.py, 8 envs x 128 steps, 2 iterations",
        ["ppo.py", "--env-id", "Breakout-v5", "--total-timesteps", "2048", "--no-cuda"],
        ["cleanrl/ppo_atari_envpool.py", "--env-id", "Breakout-v5", "--total-timesteps", "2048", "--no-cuda"],
        dict(obs_shape=(4, 84, 84), num_actions=4, lives=5, push=("--learning-rate", "0.0025")),
        {"network": "trunk", "encoder": "trunk", "actor": "actor", "critic": "critic"},
        ("truncation", "reset-step"),
    ),
    "ppo-classic": (
        "ppo.py CartPole-v1 (classic preset) against ppo.py, 4 envs x 128 steps, 2 iterations",
        ["ppo.py", "--env-id", "CartPole-v1", "--total-timesteps", "1024", "--no-cuda"],
        ["cleanrl/ppo.py", "--env-id", "CartPole-v1", "--total-timesteps", "1024", "--no-cuda"],
        dict(obs_shape=(4,), num_actions=2, push=("--learning-rate", "0.0025")),
        {"actor": "actor", "critic": "critic"},
        ("truncation", "reset-step"),
    ),
    "ppo-lstm": (
        "ppo.py Breakout-v5 --rnn lstm (atari preset) against ppo_atari_lstm.py, 8 envs x 128 steps, 2 iterations",
        ["ppo.py", "--env-id", "Breakout-v5", "--rnn", "lstm", "--total-timesteps", "2048", "--no-cuda"],
        ["cleanrl/ppo_atari_lstm.py", "--total-timesteps", "2048", "--no-cuda"],  # its env id is never made here
        # one frame per observation, as both files take it
        dict(obs_shape=(1, 84, 84), num_actions=4, lives=5, push=("--learning-rate", "0.0025")),
        {"network": "trunk", "encoder": "trunk", "lstm": "memory", "memory": "memory", "actor": "actor", "critic": "critic"},
        ("truncation", "reset-step", "memory-reset"),
    ),
    "ppo-continuous": (
        "ppo.py Hopper-v4 (mujoco preset) --norm-obs --norm-reward against ppo_continuous_action.py, 1 env x 64 steps, 2 "
        "iterations of 2 epochs of 2 minibatches",
        "ppo.py --env-id Hopper-v4 --num-steps 64 --num-minibatches 2 --update-epochs 2 --total-timesteps 128".split()
        + "--norm-obs --norm-reward --no-cuda".split(),
        [
            "cleanrl/ppo_continuous_action.py",
            *"--env-id Hopper-v4 --num-steps 64 --num-minibatches 2 --update-epochs 2 --total-timesteps 128".split(),
            "--no-cuda",
        ],
        # single_envs: CleanRL normalises inside each env (gymnasium's wrappers), under gymnasium's SyncVectorEnv
        dict(obs_shape=(11,), action_dim=3, single_envs=True, push=("--learning-rate", "0.01")),
        {"actor": "actor", "actor_mean": "actor", "actor_logstd": "actor", "critic": "critic"},
        ("truncation", "reset-step", "norm-restart", "norm-reset-step"),
    ),
    "a2c": (
        "a2c.py CartPole-v1 (classic preset: SB3's defaults) against Stable-Baselines3's A2C (its defaults, as "
        "rl-baselines3-zoo's CartPole-v1 entry: 8 envs), 8 envs x 5 steps, 4 iterations of one RMSprop step",
        "a2c.py --env-id CartPole-v1 --num-envs 8 --total-timesteps 160 --no-cuda".split(),
        ["sb3:a2c", *"--env-id CartPole-v1 --num-envs 8 --total-timesteps 160".split()],  # SB3_A2C, written by the study
        # single_envs: SB3's DummyVecEnv of gymnasium.make's envs, each env one row of the pool ours steps
        dict(obs_shape=(4,), num_actions=2, single_envs=True, envs=8),
        {
            "actor": "actor",
            "critic": "critic",
            "mlp_extractor.policy_net": "actor",
            "action_net": "actor",
            "mlp_extractor.value_net": "critic",
            "value_net": "critic",
        },  # fmt: skip
        NO_ENDS["same-step"],
    ),
    "dqn-classic": (
        "dqn.py CartPole-v1 (classic preset) against dqn.py, 1 env, 500 gradient steps after 1,000 learning-starts steps",
        ["dqn.py", "--env-id", "CartPole-v1", "--total-timesteps", "6005", "--learning-starts", "1000", "--no-cuda"],
        ["cleanrl/dqn.py", "--env-id", "CartPole-v1", "--total-timesteps", "6005", "--learning-starts", "1000", "--no-cuda"],
        dict(obs_shape=(4,), num_actions=2, replay=True),  # replay: scripted exploration and replay samples (run_side)
        {"network": "trunk"},
        NO_ENDS["replay"],
    ),
    "dqn-atari": (
        "dqn.py Breakout-v5 (atari preset) against dqn_atari.py, 1 env, 500 gradient steps after 1,000 learning-starts steps",
        "dqn.py --env-id Breakout-v5 --total-timesteps 3003 --learning-starts 1000 --buffer-size 4000 --no-cuda".split(),
        "cleanrl/dqn_atari.py --total-timesteps 3003 --learning-starts 1000 --buffer-size 4000 --no-cuda".split(),  # no env
        # stacked: each step's stack is the last four of one frame per step, as an emulator's are (ours stores the
        # newest frame alone and restacks it)
        dict(obs_shape=(4, 84, 84), num_actions=4, lives=5, replay=True, stacked=True),
        {"network": "trunk"},
        NO_ENDS["replay"],
    ),
    "td3": (
        "ddpg_td3.py Hopper-v4 (mujoco preset) against td3_continuous_action.py, 1 env, 500 critic and 250 actor steps "
        "after 1,000 random steps (CleanRL's loop counts from 0 and trains from step 1,001: its budget is one more)",
        "ddpg_td3.py --env-id Hopper-v4 --total-timesteps 1500 --learning-starts 1000 --buffer-size 10000 --no-cuda".split(),
        [
            "cleanrl/td3_continuous_action.py",
            *"--env-id Hopper-v4 --total-timesteps 1501 --learning-starts 1000".split(),
            "--buffer-size",
            "10000",
            "--no-cuda",
        ],  # fmt: skip
        # critics: CleanRL's qf1 and qf2 under one optimiser, laid out as ours' batched Critics (as_critics)
        dict(obs_shape=(11,), action_dim=3, batch_size=256, layout="critics"),
        {"network": "actor", "fc1": "actor", "fc2": "actor", "fc_mu": "actor", "weights": "critic", "biases": "critic"},
        NO_ENDS["replay"],
    ),
    "ddpg": (
        "ddpg_td3.py --algo ddpg Hopper-v4 (mujoco preset) against ddpg_continuous_action.py, 1 env, 500 critic and 250 "
        "actor steps after 1,000 random steps (CleanRL's budget one more, as for TD3)",
        "ddpg_td3.py --algo ddpg --env-id Hopper-v4 --total-timesteps 1500 --learning-starts 1000 --buffer-size 10000".split()
        + ["--no-cuda"],
        [
            "cleanrl/ddpg_continuous_action.py",
            *"--env-id Hopper-v4 --total-timesteps 1501 --learning-starts 1000".split(),
            "--buffer-size",
            "10000",
            "--no-cuda",
        ],  # fmt: skip
        dict(obs_shape=(11,), action_dim=3, batch_size=256, layout="critics"),  # one critic, laid out as ours' Critics
        {"network": "actor", "fc1": "actor", "fc2": "actor", "fc_mu": "actor", "weights": "critic", "biases": "critic"},
        NO_ENDS["replay"],
    ),
    "ppg": (
        "ppg_procgen.py StarpilotEasy-v0 --arch detach against ppg_procgen.py, 4 envs x 32 steps, a whole phase: 2 policy "
        "iterations of 2 minibatches, then 6 auxiliary epochs of 4 minibatches of 2 rollouts (ours: --max-grad-norm 0.5 "
        "--vf-coef 0.5, CleanRL's settings; CleanRL: --no-clip-vloss, ours' value loss)",
        [
            "ppg_procgen.py",
            *"--env-id StarpilotEasy-v0 --arch detach --num-envs 4 --num-steps 32 --num-minibatches 2 --n-pi 2".split(),
            *"--aux-rollouts 2 --total-timesteps 384 --max-grad-norm 0.5 --vf-coef 0.5 --chunk-size 4096 --no-cuda".split(),
        ],  # 3 iterations: ours' auxiliary phase follows a phase's last iteration only when one more comes (stop_early)
        [
            "cleanrl/ppg_procgen.py",
            *"--env-id starpilot --num-envs 4 --num-steps 32 --num-minibatches 2 --n-iteration 2".split(),
            *"--num-aux-rollouts 2 --total-timesteps 256 --no-clip-vloss --no-cuda".split(),
        ],
        # procgen: CleanRL's ProcgenEnv (gym 0.23, channels-last frames) beside ours' envpool pool; departures: ours'
        # differences from CleanRL within a phase, each made CleanRL's by make_same (DIFFERENCES); stop_early: ours stops
        # once it has taken as many optimiser steps as the reference
        dict(
            obs_shape=(3, 64, 64),
            num_actions=15,
            procgen=True,
            push=("--learning-rate", "0.0015"),
            departures=("one-adam", "stale-grad", "adv-std"),
            stop_early=True,
        ),  # fmt: skip
        {"network": "trunk", "policy_net": "trunk", "actor": "actor", "critic": "critic", "aux_critic": "aux"},
        NO_ENDS["procgen"],
    ),
    "rnd": (
        "rnd_ppo.py Breakout-v5 against ppo_rnd_envpool.py, 4 envs x 32 steps, 2 iterations of 2 epochs of 2 minibatches, "
        "after one rollout of random steps for the observation statistics (ours: --anneal-lr --norm-adv --vf-coef 0.5 "
        "--max-grad-norm 0.5, CleanRL's settings; CleanRL: --no-clip-vloss, ours' extrinsic value loss)",
        [
            "rnd_ppo.py",
            *"--env-id Breakout-v5 --num-envs 4 --num-steps 32 --num-minibatches 2 --update-epochs 2".split(),
            *"--total-timesteps 256 --num-iterations-obs-norm-init 1 --anneal-lr --norm-adv --vf-coef 0.5".split(),
            "--max-grad-norm",
            "0.5",
            *"--chunk-size 4096 --no-cuda".split(),
        ],
        [
            "cleanrl/ppo_rnd_envpool.py",
            *"--env-id Breakout-v5 --num-envs 4 --num-steps 32 --num-minibatches 2 --update-epochs 2".split(),
            *"--total-timesteps 256 --num-iterations-obs-norm-init 1 --no-clip-vloss --no-cuda".split(),
        ],
        # fixed: the random target network, in no optimiser, copied from the reference's as well; predicted: CleanRL
        # draws each minibatch frame for the predictor with that probability, scripted to the first quarter, ours' pick
        dict(
            obs_shape=(4, 84, 84),
            num_actions=4,
            lives=5,
            fixed="target",
            predicted=0.25,
            push=("--learning-rate", "0.001"),
            departures=(
                "policy-conv",
                "policy-residual",
                "leaky-slope",
                "adam-eps",
                "rnd-frames",
                "filter-axis",
                "reward-count",
            ),
        ),  # fmt: skip
        {
            "network": "trunk",
            "trunk": "trunk",
            "actor": "actor",
            "extra_policy": "actor",
            "extra_layer": "critic",
            "extra_value": "critic",
            "critic_ext": "critic",
            "critic_int": "critic",
            "predictor": "predictor",
        },  # fmt: skip
        ("truncation", "reset-step"),  # with the seven above made CleanRL's
    ),
}
# Stable-Baselines3's A2C has no script of its own: this one runs it with its defaults (rl-baselines3-zoo's CartPole-v1
# entry adds 8 envs), on envs made by gymnasium.make, as a user's script would
SB3_A2C = """import argparse

import gymnasium
from stable_baselines3 import A2C
from stable_baselines3.common.vec_env import DummyVecEnv

p = argparse.ArgumentParser()
p.add_argument("--env-id", default="CartPole-v1")
p.add_argument("--num-envs", type=int, default=8)
p.add_argument("--total-timesteps", type=int, default=160)
args = p.parse_args()
envs = DummyVecEnv([lambda: gymnasium.make(args.env_id) for _ in range(args.num_envs)])
A2C("MlpPolicy", envs, device="cpu", seed=1).learn(total_timesteps=args.total_timesteps)
"""
# Where ours departs from CleanRL on purpose, at an episode's end (docs/ppo.md, "Departures from CleanRL", with the
# sources): each made CleanRL's way by make_same, so that scenario 2 can show it is the only difference
DIFFERENCES = {
    "truncation": "truncation bootstrapping",  # ours bootstraps a truncated episode from V(final observation)
    "reset-step": "the reset step's mask",  # ours masks out the reset step of next-step autoreset
    "memory-reset": "where the memory is zeroed",  # ours at the next episode's first frame; CleanRL's at the reset step
    # ppo.py --norm-reward against gymnasium's NormalizeReward inside each env (ppo_continuous_action.py)
    "norm-restart": "where the scaled reward's running return restarts",  # ours after any end, from 0; gymnasium's at a
    # termination, from that step's reward, and never at a truncation
    "norm-reset-step": "the reset step in the reward statistics",  # ours counts it; gymnasium's wrapper never sees it
    # PPG, within a phase (docs/ppg_procgen.md): ours follows openai/phasic-policy-gradient
    "one-adam": "the auxiliary phase's own Adam",  # openai's: a second Adam; CleanRL's one Adam carries its moments over
    "stale-grad": "the policy gradient CleanRL's first auxiliary step adds",  # no zero_grad between its phases
    "adv-std": "the advantages' population std",  # openai's mpi_moments; CleanRL's torch .std() divides by n - 1
    # RND, without episode ends (docs/rnd_ppo.md): ours follows openai/random-network-distillation
    "policy-conv": "the policy's 4x4 third convolution",  # CleanRL's is 3x3 (a 7x7 map, not 6x6, into the dense layer)
    "policy-residual": "the policy head's residual connection",  # CleanRL's actor: two layers, no skip
    "leaky-slope": "RND's leaky-ReLU slope of 0.2",  # TensorFlow's default; CleanRL's nn.LeakyReLU() has 0.01
    "adam-eps": "Adam's eps of 1e-8",  # CleanRL's 1e-5
    "rnd-frames": "RND's frames",  # ours the frame each step reached; CleanRL's statistics and predictor the step's own
    "filter-axis": "the intrinsic reward filter's axis",  # ours runs over time; CleanRL's over the rollout's envs
    "reward-count": "the intrinsic return statistics' count",  # CleanRL counts a rollout as num_envs values
}
# ours' text where a difference is made CleanRL's by editing ours' file (its copy, in the side's process): (old, new,
# how many times old occurs); the others are made CleanRL's on ours' functions (make_same)
SCALE_REWARD_CALL = (  # ppo.py's reward scaling, also given the step's terminations and which envs took a real step
    "scale_reward(train_reward, discounted_return, done, return_rms, args.gamma)",
    "scale_reward(train_reward, discounted_return, done, return_rms, args.gamma, term, next_valid)",
    1,
)
TEXT_PATCHES = {
    "norm-restart": [SCALE_REWARD_CALL],
    "norm-reset-step": [SCALE_REWARD_CALL],
    "memory-reset": [("next_start = next_start, 1.0 - valid[step]", "next_start = next_start, dones[step]", 1)],
    "policy-conv": [("layer_init(nn.Conv2d(64, 64, 4, stride=1))", "layer_init(nn.Conv2d(64, 64, 3, stride=1))", 1)],
    "policy-residual": [
        ("policy_h, value_h = h + F.relu(self.extra_policy(h)),", "policy_h, value_h = F.relu(self.extra_policy(h)),", 1)
    ],
    "leaky-slope": [("nn.LeakyReLU(0.2)", "nn.LeakyReLU()", 3)],
    "adam-eps": [("torch.optim.Adam(params, lr=lr0, fused=", "torch.optim.Adam(params, lr=lr0, eps=1e-5, fused=", 1)],
    "rnd-frames": [  # the statistics' update after the rollout (not the same line in the random steps before), the batch
        ("update_frame_stats(obs_rms, frames.flatten(0, 1), world_size=args.world_size)\n            _,",
         "update_frame_stats(obs_rms, obs[:, :, -1:].flatten(0, 1), world_size=args.world_size)\n            _,", 1),
        ("frames=frames.flatten(0, 1),", "frames=obs[:, :, -1:].flatten(0, 1),", 1),
    ],
}  # fmt: skip
# A change of the detail that defines each pair's algorithm, planted in a copy of ours ((old, new, how many times old
# occurs), as TEXT_PATCHES), with any departures made CleanRL's: ours must then differ from the reference, or the pair's
# data does not reach that detail and its match says nothing about it. The study fails where a planted change matches.
POLICY_CLIP = (
    "the policy ratio's clip made one-sided (no lower bound)",
    [("-advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)", "-advantages * ratio.clamp(max=1 + clip_coef)", 1)],
)
DQN_TARGET = (
    "the TD target from the online network, not the target network",
    [('next_q_target = target_network(batch["next_obs"])', 'next_q_target = q_network(batch["next_obs"])', 1)],
)  # fmt: skip
PLANTED = {
    "ppo-atari": POLICY_CLIP,
    "ppo-classic": POLICY_CLIP,
    "ppo-lstm": POLICY_CLIP,
    "ppo-continuous": POLICY_CLIP,
    "a2c": (  # A2C has no clip: its defining detail is the critic's baseline in the policy gradient
        "the policy gradient weighted by the return, not the advantage (no critic baseline)",
        [("pg_loss = masked_mean(-advantages.detach() * logprob, mask)",
          "pg_loss = masked_mean(-returns * logprob, mask)", 1)],
    ),
    "dqn-classic": DQN_TARGET,
    "dqn-atari": DQN_TARGET,
    "td3": (
        "the target policy smoothing noise left unclipped",
        [("(next_actions + noise.clamp(-noise_clip, noise_clip) * action_scale)", "(next_actions + noise * action_scale)", 1)],
    ),
    "ddpg": (
        "the TD target from the online critic, not the target critic",
        [("td_target(rewards, terminations, target_critic(next_obs, next_actions),",
          "td_target(rewards, terminations, critic(next_obs, next_actions),", 1)],
    ),
    "ppg": (
        "the auxiliary phase's behaviour-cloning term dropped",
        [('loss = mean["aux_value_loss"] + beta_clone * mean["bc_kl"] + vf_true_weight',
          'loss = mean["aux_value_loss"] + vf_true_weight', 1)],
    ),
    "rnd": (
        "the intrinsic reward left out of the advantages",
        [("advantages=(args.ext_coef * ext_advantages + args.int_coef * int_advantages)",
          "advantages=(args.ext_coef * ext_advantages)", 1)],
    ),
}  # fmt: skip
# the order both sides' parameters are recorded and copied in (CleanRL's ppo.py makes its critic first, ours its actor):
# by role, then by position within the role
ROLES = ("trunk", "memory", "actor", "critic", "aux", "predictor")


# ---------------------------------------------------------------------------------------------------------------------
# The shared data and draws: a function of a counter only, so both sides see the same numbers in the same order
# ---------------------------------------------------------------------------------------------------------------------
def scripted_frames(step: int, num_envs: int, shape: tuple) -> np.ndarray:
    """The observations every env shows at vector step `step` (0: the reset), seeded by the step: stacked uint8 frames
    (three dimensions), else float32 vectors."""
    rng = np.random.default_rng([1, step])
    if len(shape) == 3:
        return rng.integers(0, 256, (num_envs, *shape), dtype=np.uint8)
    return rng.standard_normal((num_envs, *shape), dtype=np.float32)


def scripted_rewards(step: int, num_envs: int) -> np.ndarray:
    """Clipped Atari rewards, mostly 0, some +-1: the signal the value head and the advantages learn from."""
    return np.random.default_rng([2, step]).choice(np.float32([-1, 0, 0, 0, 1]), num_envs)


def scripted_ends(step: int, num_envs: int) -> tuple[np.ndarray, np.ndarray]:
    """(terminated, truncated) at vector step `step`, with --ends: each env ends about one step in 20, a third of the
    ends by a time limit. Before the draw is used, an env on its reset step never ends (ScriptedPool.step)."""
    u = np.random.default_rng([5, step]).random(num_envs)
    return u < 0.035, (u >= 0.035) & (u < 0.05)


def scripted_actions(step: int, shape: tuple, num_actions: int) -> torch.Tensor:
    """The actions taken at vector step `step`: a fixed sequence neither policy chooses."""
    return torch.from_numpy(np.random.default_rng([3, step]).integers(0, num_actions, shape))


def scripted_batch(call: int, batch_size: int, below: int) -> np.ndarray:
    """The transitions of the `call`-th replay sample: indices of the first `below` added (both sides hold them)."""
    return np.random.default_rng([6, call]).integers(0, below, batch_size)


def scripted_uniform(step: int, shape: tuple) -> np.ndarray:
    """The random actions of vector step `step` before learning starts, uniform within bounds of -1 and 1."""
    return np.random.default_rng([7, step]).uniform(-1.0, 1.0, shape).astype(np.float32)


def scripted_noise(call: int, shape: tuple) -> torch.Tensor:
    """The standard normal draws of the `call`-th target policy smoothing (TD3)."""
    return torch.from_numpy(np.random.default_rng([8, call]).standard_normal(shape, dtype=np.float32))


def scripted_permutation(call: int, n: int) -> np.ndarray:
    """The minibatch order of the `call`-th epoch."""
    return np.random.default_rng([4, call]).permutation(n)


class ScriptedPool:
    """A vector env as a script: reset and step return scripted_frames and scripted_rewards; with spec["ends"],
    scripted_ends ends episodes, and the step after an end is the reset step of envpool's and gymnasium 1.x's next-step
    autoreset (its action ignored, reward 0, no end; the frames are scripted as any step's), else no episode ends.
    It stands in for envpool's Atari pool, with envpool's info keys (reward, terminated, lives, env_id), or for a
    gymnasium vector env (SyncVectorEnv, make_vec; no info). The gymnasium API (reset -> (obs, info), step -> 5
    values) or, with env_type="gym", envpool's old gym one (reset -> obs, step -> (obs, reward, done, info)), as
    CleanRL's envpool scripts call it."""

    def __init__(self, spec: dict, num_envs: int, env_type: str):
        self.spec, self.num_envs, self.old_api, self.step_count = spec, num_envs, env_type == "gym", 0
        self.resetting = np.zeros(num_envs, dtype=bool)  # the envs whose next step is a reset step
        self.config = {"num_envs": num_envs}
        import gymnasium

        frames = len(spec["obs_shape"]) == 3
        low, high, dtype = (0, 255, np.uint8) if frames else (-np.inf, np.inf, np.float32)
        self.single_observation_space = self.observation_space = gymnasium.spaces.Box(low, high, spec["obs_shape"], dtype)
        if "action_dim" in spec:  # continuous: MuJoCo's bounds of -1 and 1
            self.single_action_space = gymnasium.spaces.Box(-1.0, 1.0, (spec["action_dim"],), np.float32)
        else:
            self.single_action_space = gymnasium.spaces.Discrete(spec["num_actions"])
        self.action_space = self.single_action_space

    def info(self, reward: np.ndarray, terminated: np.ndarray) -> dict:
        if "lives" not in self.spec:  # a gymnasium vector env: no info of its own
            return {}
        lives = np.full(self.num_envs, self.spec["lives"], dtype=np.int32)  # every termination a game over
        ids = np.arange(self.num_envs, dtype=np.int32)
        return dict(reward=reward, terminated=terminated.astype(np.int32), lives=lives, env_id=ids)

    def frames(self, step: int) -> np.ndarray:
        """The observations of vector step `step`; with spec["stacked"], the newest frames of the last steps (before
        the first, the first frame again, as after envpool's reset)."""
        shape = self.spec["obs_shape"]
        if not self.spec.get("stacked"):
            return scripted_frames(step, self.num_envs, shape)
        steps = range(step - shape[0] + 1, step + 1)
        return np.concatenate([scripted_frames(max(k, 0), self.num_envs, (1, *shape[1:])) for k in steps], axis=1)

    def reset(self, **kwargs):
        obs, none = self.frames(0), np.zeros(self.num_envs, dtype=bool)
        return obs if self.old_api else (obs, self.info(np.zeros(self.num_envs, dtype=np.float32), none))

    def step(self, action):
        assert len(np.asarray(action)) == self.num_envs
        self.step_count += 1
        obs = self.frames(self.step_count)
        reward, term = scripted_rewards(self.step_count, self.num_envs), np.zeros(self.num_envs, dtype=bool)
        trunc = term.copy()
        if self.spec.get("ends"):
            term, trunc = (ended & ~self.resetting for ended in scripted_ends(self.step_count, self.num_envs))
            reward = np.where(self.resetting, np.float32(0), reward)
            self.resetting = term | trunc
        if self.old_api:
            return obs, reward, term | trunc, self.info(reward, term)
        return obs, reward, term, trunc, self.info(reward, term)

    def close(self):
        pass


def single_env(spec: dict, pools: list):
    """One env of a pool as a gymnasium.Env, for the references that wrap each env (ppo_continuous_action.py's
    normalisation wrappers) before a vector env steps them (gymnasium's SyncVectorEnv, SB3's DummyVecEnv): the i-th
    env made shows row i of a pool of spec["envs"] (default 1), as ours' pool does."""
    import gymnasium

    row = len(pools)  # the envs made before this one (a side that makes single envs makes no other pool)
    pool = ScriptedPool(spec, spec.get("envs", 1), "gymnasium")
    assert row < pool.num_envs, f"env {row + 1} made of a pool of {pool.num_envs}"
    pools.append(pool)

    class ScriptedEnv(gymnasium.Env):
        observation_space, action_space = pool.single_observation_space, pool.single_action_space

        def reset(self, seed=None, options=None):
            if pool.step_count == 0:
                return pool.reset()[0][row], {}
            # a vector env's autoreset, the step after an end: the pool's own reset step (reward 0, no end)
            return pool.step(np.zeros((pool.num_envs, *pool.single_action_space.shape)))[0][row], {}

        def step(self, action):
            obs, reward, term, trunc, _ = pool.step(np.repeat(np.asarray(action)[None], pool.num_envs, axis=0))
            return obs[row], float(reward[row]), bool(term[row]), bool(trunc[row]), {}

    return ScriptedEnv()


def old_gym_pool(pool: ScriptedPool):
    """The pool as a gym 0.23 env, which CleanRL's wrappers (gym.Wrapper subclasses) need beneath them."""
    import gym

    class OldGymPool(gym.Env):
        def __init__(self):
            self.num_envs, self.config = pool.num_envs, pool.config
            self.observation_space = gym.spaces.Box(0, 255, pool.spec["obs_shape"], np.uint8)
            self.action_space = gym.spaces.Discrete(pool.spec["num_actions"])

        def reset(self, **kwargs):
            return pool.reset()

        def step(self, action):
            return pool.step(action)

    return OldGymPool()


def procgen_pool(spec: dict, num_envs: int, pools: list):
    """A scripted pool as procgen's ProcgenEnv under gym 0.23, as CleanRL's ppg_procgen.py wraps it: a dict observation
    whose "rgb" frames are the pool's, channels last; a list of infos. No episode ends (procgen resets an ended env
    within the step, which the pool's next-step reset does not stand in for)."""
    import gym

    pool = ScriptedPool(spec, num_envs, "gym")
    pools.append(pool)
    channels_last = lambda obs: {"rgb": np.ascontiguousarray(obs.transpose(0, 2, 3, 1))}  # noqa: E731

    class ProcgenEnv(gym.Env):
        def __init__(self):
            c, h, w = spec["obs_shape"]
            self.num_envs = num_envs
            self.observation_space = gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (h, w, c), np.uint8)})
            self.action_space = gym.spaces.Discrete(spec["num_actions"])

        def reset(self, **kwargs):
            return channels_last(pool.reset())

        def step(self, action):
            obs, reward, done, _ = pool.step(action)
            return channels_last(obs), reward, done, [{} for _ in range(num_envs)]

    return ProcgenEnv()


# ---------------------------------------------------------------------------------------------------------------------
# One side, in a child process: the stand-ins installed, the script run, what it did recorded
# ---------------------------------------------------------------------------------------------------------------------
def optimised_module(params: list, roles: dict) -> tuple[tuple[str, ...], torch.nn.Module] | None:
    """(the names of `params`, which give their roles; the module that holds exactly them), found among the live
    objects, or None. Where a module and its one child both hold them (a network that is one nn.Sequential), the
    names that give roles win."""
    import gc

    ids, found = [id(p) for p in params], []
    modules = [obj for obj in gc.get_objects() if isinstance(obj, torch.nn.Module)]
    for obj in modules:
        if [id(p) for p in obj.parameters()] == ids:
            found.append((tuple(name for name, _ in obj.named_parameters()), obj))
    for first in [] if found else modules:  # one optimiser over two modules (RND: the agent, then the predictor)
        head = [id(p) for p in first.parameters()]
        if not head or ids[: len(head)] != head:
            continue
        rest = next((obj for obj in modules if [id(p) for p in obj.parameters()] == ids[len(head) :]), None)
        under = next((name for obj in modules for name, child in obj.named_children() if child is rest), None)
        if rest is not None and under is not None:  # the second's names under the attribute that holds it
            names = [name for name, _ in first.named_parameters()]
            found.append((tuple(names + [f"{under}.{name}" for name, _ in rest.named_parameters()]), first))
    return max(found, key=lambda f: sum(role_of(name, roles) != "?" for name in f[0]), default=None)


def fixed_network(params: list, name: str) -> list[torch.Tensor]:
    """The parameters of the live module's child `name` (RND's target) beside the optimised ones: the child of the one
    module that also has a child all of whose parameters are being optimised (its predictor)."""
    import gc

    ids = {id(p) for p in params}
    for obj in gc.get_objects():
        if isinstance(obj, torch.nn.Module) and isinstance(getattr(obj, name, None), torch.nn.Module):
            others = [c for n, c in obj.named_children() if n != name and any(True for _ in c.parameters())]
            if others and all(id(p) in ids for c in others for p in c.parameters()):
                return list(getattr(obj, name).parameters())
    raise SystemExit(f"lockstep.py: error: no module holds a {name} network beside the optimised one")


def role_of(name: str, roles: dict) -> str:
    """A parameter's role: that of the longest of `roles`' module names it lies under ("?" when none)."""
    under = [key for key in roles if name == key or name.startswith(key + ".")]
    return roles[max(under, key=len)] if under else "?"


def target_copies(module: torch.nn.Module | None) -> list[torch.nn.Module]:
    """The live modules of the same class as `module` with the same values: its target networks, copied from it
    before its optimiser was made (and so before the reference's initial values are copied in)."""
    import gc

    if module is None:
        return []
    mine = list(module.parameters())

    def same(obj) -> bool:
        theirs = list(obj.parameters())
        return len(theirs) == len(mine) and all(
            a.shape == b.shape and a.device == b.device and torch.equal(a, b) for a, b in zip(theirs, mine, strict=True)
        )

    return [obj for obj in gc.get_objects() if type(obj) is type(module) and obj is not module and same(obj)]


def as_critics(tensors: list) -> list:
    """CleanRL's critics (qf1, and qf2 with TD3: three nn.Linear each, one optimiser over them) laid out as ours'
    Critics: each layer's weights transposed and the critics stacked, (critics, in, out), then the biases, (critics,
    1, out)."""
    nets = [tensors[i : i + 6] for i in range(0, len(tensors), 6)]
    weights = [torch.stack([net[i].T for net in nets]) for i in range(0, 6, 2)]
    return weights + [torch.stack([net[i + 1] for net in nets]).unsqueeze(1) for i in range(0, 6, 2)]


def layer_ids(names: list[str]) -> list[int]:
    """Each tensor's layer, numbered in the order the layers first appear: a weight and its bias share one."""
    keys = [n.rsplit(".", 1)[0] if n.endswith((".weight", ".bias")) else n.rsplit(".", 1)[-1] for n in names]
    return [list(dict.fromkeys(keys)).index(key) for key in keys]


def patched(text: str, same: list[str]) -> str:
    """Ours' source with the TEXT_PATCHES of the differences in `same` made, each edit where it is expected."""
    edits = {edit: d for d in same for edit in TEXT_PATCHES.get(d, [])}  # an edit two differences need: made once
    for (old, new, times), difference in edits.items():
        if text.count(old) != times:
            raise SystemExit(f"lockstep.py: error: ours no longer has {old!r} {times} time(s), to make {difference}")
        text = text.replace(old, new)
    return text


def planted(text: str, pair: str) -> str:
    """Ours' source with the pair's PLANTED change made, where it is expected."""
    for old, new, times in PLANTED[pair][1]:
        if text.count(old) != times:
            raise SystemExit(f"lockstep.py: error: ours no longer has {old!r} {times} time(s), to plant {PLANTED[pair][0]}")
        text = text.replace(old, new)
    return text


def make_same(names: dict, same: list[str]) -> None:
    """Ours' module globals (names) with the differences in `same` made CleanRL's way, on the functions they live in
    (the rest are TEXT_PATCHES of ours' source)."""
    for departures, make in (
        ({"truncation", "reset-step"}, make_same_gae),
        ({"adv-std"}, make_same_advantages),
        ({"one-adam", "stale-grad"}, make_same_phases),
        ({"filter-axis", "reward-count"}, make_same_intrinsic),
        ({"norm-restart", "norm-reset-step"}, make_same_reward_scaling),
    ):
        if departures & set(same):
            make(names, same)


def make_same_advantages(names: dict, same: list[str]) -> None:
    """ppg_procgen.py's advantage normalisation as CleanRL's: (adv - mean) / (adv.std() + 1e-8), torch's sample std."""

    def normalize_advantages(advantages, valid, world_size=1):
        count = valid.sum()
        mean = (advantages * valid).sum() / count
        std = (((advantages - mean) ** 2 * valid).sum() / (count - 1)).sqrt()
        return (advantages - mean) / (std + 1e-8) * valid

    names["normalize_advantages"] = normalize_advantages


def make_same_gae(names: dict, same: list[str]) -> None:
    """ppo.py's (and rnd_ppo.py's extrinsic) compute_gae as CleanRL's at an episode's end."""
    gae = names["compute_gae"]

    def compute_gae(rewards, values, next_value, terminations, dones, valid, *rest):
        if "truncation" in same:  # CleanRL ends the return at every done: a truncation counts as a termination
            terminations = dones
        if "reset-step" in same:  # CleanRL learns from the reset step: valid everywhere, in place (the update's mask)
            valid.fill_(1.0)
        return gae(rewards, values, next_value, terminations, dones, valid, *rest)

    names["compute_gae"] = compute_gae


def make_same_phases(names: dict, same: list[str]) -> None:
    """ppg_procgen.py's phases as CleanRL's: one Adam for both ("one-adam"); and ("stale-grad") the first auxiliary
    minibatch of a phase adding the gradient its last policy minibatch left behind, clipped as it was stepped: CleanRL
    zeroes the gradients before each policy backward pass and after each auxiliary step, never between the phases."""
    training_steps, optimizer_step, held = names["training_steps"], names["optimizer_step"], {}

    def step_keeping(optimizer, params, max_grad_norm, set_to_none=True):
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        held["last"] = [None if p.grad is None else p.grad.clone() for p in params]
        optimizer_step(optimizer, params, 0.0, set_to_none)  # clipped above

    def steps_as_cleanrl(agent, optimizer, aux_optimizer, args):
        steps = training_steps(agent, optimizer, optimizer if "one-adam" in same else aux_optimizer, args)
        if "stale-grad" not in same:
            return steps
        params, policy_step, aux_chunk = list(agent.parameters()), steps["policy_step"], steps["aux_chunk"]

        def policy_step_kept():
            policy_step()
            held["stale"] = held.pop("last")

        def aux_chunk_after(*chunk_args, **kwargs):
            for p, grad in zip(params, held.pop("stale", None) or [None] * len(params), strict=True):
                if grad is not None:
                    p.grad = grad
            return aux_chunk(*chunk_args, **kwargs)

        return dict(steps, policy_step=policy_step_kept, aux_chunk=aux_chunk_after)

    names["training_steps"] = steps_as_cleanrl
    if "stale-grad" in same:  # every step keeps its clipped gradient, for the auxiliary phase's first
        names["optimizer_step"] = step_keeping


def make_same_reward_scaling(names: dict, same: list[str]) -> None:
    """ppo.py's --norm-reward as gymnasium 1.x's NormalizeReward wrapper inside each env does it: the running return
    restarts at a termination, from that step's reward, and not at a truncation ("norm-restart"); the reset step of
    the next-step autoreset, where the vector env calls reset, not step, is not seen at all ("norm-reset-step")."""

    def scale_reward(reward, discounted_return, done, rms, gamma, term, valid, clip: float = 10.0):
        restart = term if "norm-restart" in same else np.zeros_like(done)
        running = discounted_return * gamma * (1.0 - restart) + reward
        seen = valid if "norm-reset-step" in same else np.ones_like(valid)
        running = np.where(seen, running, discounted_return)
        if seen.any():
            rms.update(running[seen][:, None])
        scaled = np.clip(reward / np.sqrt(rms.var + 1e-8), -clip, clip)
        return scaled, running if "norm-restart" in same else np.where(done, 0.0, running)

    names["scale_reward"] = scale_reward


def make_same_intrinsic(names: dict, same: list[str]) -> None:
    """rnd_ppo.py's intrinsic reward normalisation as CleanRL's: its RewardForwardFilter fed the rollout's rows env by
    env (each env's steps as one vector, the filter running on from env to env and rollout to rollout: "filter-axis"),
    and the statistics of the filtered values counted as num_envs values a rollout ("reward-count")."""
    forward_filter, update, held = names["forward_filter"], names["update_mean_var_count"], {}

    def normalize_intrinsic(rewards, rewems, valid, rms, gamma, world_size=1):
        if "filter-axis" in same:
            rows = []
            for row in rewards.T:
                held["rewems"] = row.clone() if "rewems" not in held else held["rewems"] * gamma + row
                rows.append(held["rewems"])
            filtered = torch.stack(rows)
        else:
            filtered, rewems = forward_filter(rewards, rewems, valid, gamma)
        x = filtered.double().flatten()
        count = rewards.shape[1] if "reward-count" in same else x.numel()
        rms.mean, rms.var, rms.count = update(rms.mean, rms.var, rms.count, x.mean(), x.var(unbiased=False), count)
        return (rewards / rms.var.sqrt()).float(), rewems

    names["normalize_intrinsic"] = normalize_intrinsic


def flag_value(flags: list[str], name: str) -> int:
    return int(flags[flags.index(name) + 1])


def install_replay_indices(counts: dict, below: int):
    """CleanRL's replay buffer draws its indices with np.random.randint, then each sample's env (one env: 0); ours'
    continuous buffer with torch.randint on its own generator: both get scripted_batch, counted in `counts`. Returns
    the scripted draw, batch(size), for a stand-in of ours' own."""
    counts["batch"] = 0

    def batch(size: int) -> np.ndarray:
        counts["batch"] += 1
        return scripted_batch(counts["batch"], size, below)

    def randint(low, high=None, size=None, dtype=int):
        return np.zeros(size, dtype=np.int64) if (high if high is not None else low) == 1 else batch(size)

    np.random.randint, torch_randint = randint, torch.randint

    def torch_randint_scripted(low, high, size, *args, generator=None, device=None, **kwargs):
        if generator is None:
            return torch_randint(low, high, size, *args, device=device, **kwargs)
        return torch.as_tensor(batch(size[0]), device=device)

    torch.randint = torch_randint_scripted
    return batch


def install_td3_draws(spec: dict, pools: list, counts: dict, below: int, batch_size: int) -> None:
    """TD3's draws, the same on both sides: the uniform actions before learning starts (CleanRL: the action space's
    sample(); ours: a numpy Generator's uniform), the replay indices, and the target policy smoothing noise (both:
    torch.randn_like of a batch of actions). The exploration noise after learning starts is left to each side: the
    scripted env's observations do not depend on the actions, and no sample reaches past `below`."""
    import gymnasium

    install_replay_indices(counts, below)
    shape = (spec["action_dim"],)
    counts["smoothing"] = 0

    def uniform(rows: int | None) -> np.ndarray:
        action = scripted_uniform(pools[-1].step_count + 1, shape)
        return action if rows is None else np.tile(action, (rows, 1))

    gymnasium.spaces.Box.sample = lambda space, *args, **kwargs: uniform(None)
    default_rng = np.random.default_rng

    class Draws:  # ours: the Generator of its random actions; uniform((N, action_dim)) scripted, the rest its own
        def __init__(self, seed):
            self.rng = default_rng(seed)

        def uniform(self, low=0.0, high=1.0, size=None):
            return uniform(size[0])

        def __getattr__(self, name):
            return getattr(self.rng, name)

    np.random.default_rng = lambda seed=None: Draws(seed) if isinstance(seed, int) else default_rng(seed)
    randn_like = torch.randn_like

    def smoothing(x, *args, **kwargs):  # a batch of actions: the smoothing noise; ours' acting step: its own draw
        if x.shape[0] != batch_size:
            return randn_like(x, *args, **kwargs)
        counts["smoothing"] += 1
        return scripted_noise(counts["smoothing"], tuple(x.shape)).to(x.device)

    torch.randn_like = smoothing


def install_replay_draws(spec: dict, pools: list, counts: dict, below: int) -> None:
    """The draws of epsilon-greedy and of the replay buffer, the same on both sides. CleanRL: random.random() for the
    coin, the action space's sample() for the action, np.random.randint for the buffer's indices (then its env index).
    Ours: numpy Generators made from a SeedSequence, the first for the coin (.random) and the action (.integers), the
    second for the buffer's slots and envs (.integers)."""
    import random

    import gymnasium

    batch = install_replay_indices(counts, below)  # CleanRL's buffer: np.random.randint
    n = spec["num_actions"]

    def action(num_envs: int) -> np.ndarray:
        return scripted_actions(pools[-1].step_count + 1, (num_envs,), n).numpy()

    random.random = lambda: 0.0  # CleanRL's coin: always below epsilon, so every step takes the scripted action
    gymnasium.spaces.Discrete.sample = lambda space, *args, **kwargs: np.int64(action(1)[0])
    default_rng, made = np.random.default_rng, []

    class Draws:  # ours: the exploration generator, then the replay buffer's
        def __init__(self, role: str):
            self.role = role

        def random(self, size=None):
            return np.zeros(size)  # explore

        def integers(self, low, high=None, size=None):
            if self.role == "explore":
                return action(size)
            return batch(size) if high != 1 else np.zeros(size, dtype=np.int64)

    def rng(seed=None):
        if isinstance(seed, np.random.SeedSequence):
            made.append(Draws(("explore", "replay")[len(made) % 2]))
            return made[-1]
        return seed if isinstance(seed, Draws) else default_rng(seed)

    np.random.default_rng = rng


def install_reach(reach: dict) -> None:
    """Records how far the run reaches into its clip ranges, in `reach`: for each clamp between two numbers (PPO's
    ratio, 1 - clip_coef to 1 + clip_coef; its value change, -clip_coef to clip_coef; TD3's smoothing noise), how many
    elements fell outside, of how many ("clamps"); for each gradient-norm clip, the norm before it and the bound
    ("norms"). A clip that nothing reaches is not tested by a match: its change would leave every step as it was."""
    import numbers

    clamps, norms = reach.setdefault("clamps", {}), reach.setdefault("norms", [])

    def counting(clamp):
        def counted(x, min=None, max=None, *args, **kwargs):
            bounds = (min, max)
            if all(isinstance(b, numbers.Real) and not isinstance(b, bool) for b in bounds) and x.is_floating_point():
                seen = clamps.setdefault((round(float(min), 6), round(float(max), 6)), [0, 0])
                seen[0] += int(((x < min) | (x > max)).sum())
                seen[1] += x.numel()
            return clamp(x, min, max, *args, **kwargs)

        return counted

    for owner in (torch, torch.Tensor):
        for name in ("clamp", "clip"):
            setattr(owner, name, counting(getattr(owner, name)))
    clip_grad_norm = torch.nn.utils.clip_grad_norm_

    def clip_recorded(parameters, max_norm, *args, **kwargs):
        norm = clip_grad_norm(parameters, max_norm, *args, **kwargs)
        norms.append((float(norm), float(max_norm)))
        return norm

    torch.nn.utils.clip_grad_norm_ = torch.nn.utils.clip_grad.clip_grad_norm_ = clip_recorded


def reach_text(reach: dict) -> str:
    """What a record's run reached of its clips (install_reach), in words; '' where it has none."""
    words = []
    for (low, high), (outside, total) in sorted(reach.get("clamps", {}).items()):
        if total:
            words.append(f"[{low:g}, {high:g}] left by {outside / total:.1%} of {total:,} values")
    norms = reach.get("norms", [])
    if norms:
        over = sum(norm > bound for norm, bound in norms)
        largest = max(norm for norm, _ in norms)
        words.append(f"gradient norm over {norms[0][1]:g} in {over} of {len(norms)} steps (largest {largest:.3g})")
    return "; ".join(words)


def run_side(side: str, pair: str, script: str, flags: list[str], record: str, start: str | None, ends: bool = False,
             same: list[str] = (), plant: bool = False) -> None:  # fmt: skip
    """Runs `script` (as __main__, with flags) with the stand-ins; writes to `record` the optimised parameters' names,
    their initial values and, after every optimiser step, the parameters and the optimiser's moments (the reference: to a file
    of the step's own beside `record`; ours: its verdict against the reference's) and the minibatch's loss.
    With `start` (the reference's record), the parameters are set to its initial values before the first step. With
    `ends`, episodes end (scripted_ends); `same` (ours only) makes those DIFFERENCES CleanRL's (make_same); `plant`
    (ours only) plants the pair's PLANTED change, and ours stops at the first step that differs."""
    import envpool

    spec, roles = dict(PAIRS[pair][3], ends=ends), PAIRS[pair][4]
    pools = []

    def make(task_id, env_type="gymnasium", num_envs=1, **kwargs):
        pools.append(ScriptedPool(spec, num_envs, env_type))
        return old_gym_pool(pools[-1]) if env_type == "gym" else pools[-1]

    envpool.make = make
    import gymnasium

    if spec.get("procgen"):  # ours asks envpool for the spaces first; CleanRL makes procgen's own ProcgenEnv
        envpool.make_spec = lambda task_id, **kwargs: ScriptedPool(spec, 1, "gymnasium")
        sys.modules["procgen"] = types.SimpleNamespace(ProcgenEnv=lambda num_envs, **kw: procgen_pool(spec, num_envs, pools))

    def make_vec(env_id, num_envs=1, **kwargs):  # ours: gymnasium's vector env for a few CartPoles
        pools.append(ScriptedPool(spec, num_envs, "gymnasium"))
        return pools[-1]

    gymnasium.make_vec = make_vec
    if spec.get("single_envs") and side == "reference":  # gymnasium.make per env, the wrappers and vector env as they are
        gymnasium.make = lambda env_id, **kwargs: single_env(spec, pools)
    else:  # CleanRL's ppo.py: its vector env of CartPoles, the pool
        gymnasium.vector.SyncVectorEnv = lambda thunks, **kwargs: make_vec("", len(thunks))
    counts = {"perm": 0}

    def sample(dist, sample_shape=()):  # the actions of the pool's next step: a throwaway pass (ours reckons its
        step = pools[-1].step_count + 1 if pools else 0  # storage with one before the envs exist) draws none
        return scripted_actions(step, dist.batch_shape, spec["num_actions"])

    torch.distributions.Categorical.sample = sample
    # Gaussian policies (both sides' Normal, ours' inside an Independent): scripted actions within the bounds
    torch.distributions.Normal.sample = lambda dist, sample_shape=(): torch.from_numpy(
        scripted_uniform(pools[-1].step_count + 1 if pools else 0, tuple(dist.batch_shape))
    ).to(dist.mean.device)

    def shuffle(x):  # CleanRL: np.random.shuffle(b_inds), the indices 0..n-1 in some order, once per epoch
        counts["perm"] += 1
        x[:] = scripted_permutation(counts["perm"], len(x))  # the epoch's order itself, as ours takes it from randperm

    def randperm(n, *args, device=None, **kwargs):  # ours: torch.randperm once per epoch
        counts["perm"] += 1
        return torch.as_tensor(scripted_permutation(counts["perm"], n), device=device)

    np.random.shuffle, torch.randperm = shuffle, randperm
    if spec.get("replay"):  # DQN: every env step explores, with the scripted action; every sample is scripted_batch
        install_replay_draws(spec, pools, counts, flag_value(flags, "--learning-starts"))
    if spec.get("predicted") and side == "reference":  # CleanRL's predictor mask: torch.rand(minibatch) < proportion
        rand = torch.rand

        def first_part(*size, **kwargs):  # the first round(proportion x n) frames of the minibatch, ours' pick
            if len(size) != 1 or not isinstance(size[0], int):
                return rand(*size, **kwargs)
            u = torch.full((size[0],), 0.5, device=kwargs.get("device"))
            u[: max(1, round(spec["predicted"] * size[0]))] = 0.0
            return u

        torch.rand = first_part
    if "action_dim" in spec and not spec.get("single_envs"):  # TD3: scripted random actions, replays, smoothing noise
        install_td3_draws(spec, pools, counts, flag_value(flags, "--learning-starts"), spec["batch_size"])
    # per optimiser, in the order they are made: its tensors' (role, shape), layers, initial values; each step: (the
    # optimiser's number, its parameters, its moments), all in the reference's layout (ours is it, or a permutation)
    out = {"names": [], "layers": [], "optimisers": [], "initial": [], "steps": [], "losses": []}
    install_reach(out.setdefault("reach", {}))
    if start is not None:
        out["checked"] = []  # ours: each step's verdict against the reference's (compare_step), in place of its tensors
    # each of the reference's steps mapped from disk as ours reaches it, not read in: the Atari DQN pair's are about
    # 10 GB (500 steps of the Nature CNN and Adam)
    reference = torch.load(start, weights_only=True, mmap=True) if start is not None else None
    optimisers, layouts = [], []  # layouts: tensors in the optimiser's order -> ours'
    numbers = []  # the reference's optimiser each stands for: its own position, or an earlier one's over the same tensors

    def init(optimizer, params, *args, **kwargs):
        cls = next(cls for cls in OPTIMISERS if isinstance(optimizer, cls))
        params, k = list(params), len(optimisers)
        found = optimised_module(params, roles)
        critics = found is None or type(found[1]).__name__ == "QNetwork"  # CleanRL's critics, one or two
        if critics and spec.get("layout") == "critics" and side == "reference":
            names, layout = [f"{part}.{i}" for part in ("weights", "biases") for i in range(3)], as_critics
            module, kinds = None, ["critic"] * len(names)
        elif found is None:
            raise SystemExit("lockstep.py: error: no module holds exactly the optimiser's parameters")
        else:
            (names, module), kinds = found, [role_of(name, roles) for name in found[0]]
            order = sorted(range(len(params)), key=lambda i: (ROLES + ("?",)).index(kinds[i]))
            names, kinds = [names[i] for i in order], [kinds[i] for i in order]
            layout = lambda tensors, order=order: [tensors[i] for i in order]  # noqa: E731  by role (ROLES)
        optimisers.append(optimizer)
        layouts.append(layout)
        out["names"].append([(role, tuple(t.shape)) for role, t in zip(kinds, layout(params), strict=True)])
        out["layers"].append(layer_ids(names))
        out["optimisers"].append(OPTIMISERS[cls])
        numbers.append(k)
        if start is not None:
            if k >= len(reference["names"]) or out["names"][k] != reference["names"][k]:
                # an optimiser over the same parameters as one before it (PPG's auxiliary Adam) stands for that one
                numbers[k] = next((numbers[i] for i in range(k) if out["names"][i] == out["names"][k]), None)
            if numbers[k] is None:
                mine, theirs = out["names"][k], reference["names"][k] if k < len(reference["names"]) else []
                i = next(
                    (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), min(len(mine), len(theirs))
                )
                raise SystemExit(
                    f"lockstep.py: error: {pair}: the networks differ at tensor {i} of {len(mine)}, ours "
                    f"{mine[i : i + 1]}, the reference's {theirs[i : i + 1]} (of {len(theirs)}); the weights are copied by "
                    "position only where roles and shapes match"
                )
            k = numbers[k]
            with torch.no_grad():
                mine = layout(params)
                targets = target_copies(module)  # ours' target networks, made as copies before the optimiser
                for p, value in zip(mine, reference["initial"][k], strict=True):
                    p.copy_(value)
                for target in targets:
                    for p, value in zip(target.parameters(), module.parameters(), strict=True):
                        p.copy_(value)
        out["initial"].append([t.detach().clone() for t in layout(params)])
        if spec.get("fixed"):  # a network in no optimiser (RND's target): the reference's values too
            fixed = fixed_network(params, spec["fixed"])
            out["fixed"] = [t.detach().clone() for t in fixed]
            if start is not None:
                if [t.shape for t in fixed] != [t.shape for t in reference["fixed"]]:
                    raise SystemExit(f"lockstep.py: error: {pair}: the networks differ, ours' {spec['fixed']} network too")
                with torch.no_grad():
                    for t, value in zip(fixed, reference["fixed"], strict=True):
                        t.copy_(value)
        inits[cls](optimizer, params, *args, **kwargs)

    inits = {cls: cls.__init__ for cls in OPTIMISERS}
    for cls in OPTIMISERS:
        cls.__init__ = init

    def after_step(optimizer, args, kwargs):
        i = next(i for i, o in enumerate(optimisers) if o is optimizer)
        params, k, layout = [p for group in optimizer.param_groups for p in group["params"]], numbers[i], layouts[i]
        # a tensor no loss has reached yet (PPG's auxiliary head in the policy phase) has no moments: zeros
        keys = MOMENTS[out["optimisers"][i]]
        state = [optimizer.state[p] or {m: torch.zeros_like(p) for m in keys} for p in params]
        moments = [layout([s[m] for s in state]) for m in keys]
        moments = [m for each in zip(*moments, strict=True) for m in each]  # each tensor's, side by side
        mine = (k, [p.detach().clone() for p in layout(params)], [m.clone() for m in moments])
        out["losses"].append(sum(pending))  # the step's loss: the sum of the backward passes since the last step
        pending.clear()
        if start is None:  # the reference writes each step to a file of its own beside its record, and holds none
            name = f"{Path(record).name}.step{len(out['steps'])}"
            torch.save(mine, Path(record).parent / name)
            out["steps"].append((k, name, None))
            return
        out["steps"].append((k, None, None))  # ours compares each step at once and keeps the verdict alone
        if len(out["steps"]) <= len(reference["steps"]):  # in step: go on from the reference's
            theirs = reference_step(Path(start), reference["steps"][len(out["steps"]) - 1])
            out["checked"].append(compare_step(len(out["steps"]), mine, theirs, reference))
            if theirs[0] == k:  # else compare reports the steps out of order
                with torch.no_grad():
                    for tensor, value in zip(layout(params) + moments, theirs[1] + theirs[2], strict=True):
                        tensor.copy_(value)
            loss, theirs_loss = out["losses"][-1], reference["losses"][len(out["steps"]) - 1]
            found = out["checked"][-1][2] or not abs(loss - theirs_loss) <= TOLERANCE * (1 + abs(theirs_loss))
            if plant and found:  # a planted change, found: the steps after it tell no more
                out["stopped"] = True
                raise SystemExit(0)
        if spec.get("stop_early") and len(out["steps"]) == len(reference["steps"]):
            raise SystemExit(0)  # ours has taken the reference's steps; what it does next, the reference does not

    register_optimizer_step_post_hook(after_step)
    backward = torch.Tensor.backward

    pending = []  # ours may take a minibatch's loss in parts (RND: PPO's, then the predictor's), each backward on its own

    def recorded_backward(loss, *args, **kwargs):
        pending.append(float(loss.detach()))
        return backward(loss, *args, **kwargs)

    torch.Tensor.backward = recorded_backward
    sys.argv = [script, *flags]
    try:
        if same or plant:  # ours imported (its definitions), edited, then its main as its `if __name__ == "__main__"` calls it
            import importlib.util

            found = importlib.util.spec_from_file_location("lockstep_ours", script)
            sys.modules["lockstep_ours"] = module = importlib.util.module_from_spec(found)
            text = patched(Path(script).read_text(), same)
            exec(compile(planted(text, pair) if plant else text, script, "exec"), vars(module))
            make_same(vars(module), same)
            module.run_main(module.main, module.parse_args())
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code:
            raise
    torch.save(out, record)


# ---------------------------------------------------------------------------------------------------------------------
# The comparison, in this process
# ---------------------------------------------------------------------------------------------------------------------
def compare(ours: dict, reference: dict) -> tuple[float, int, int, str | None]:
    """(the largest difference over the tolerance's scale, a kinked unit's left out; the optimiser steps compared; the
    steps where a ReLU sat at its kink; the first mismatch or None). A step matches when every tensor is within the
    tolerance, or when what is not lies in one unit (a row or output channel, its bias and their moments) of a layer
    of several, and in the layers beneath it of the same role: one ReLU whose input was within rounding of 0 in one
    sample, on one side only, turns that unit's gradient on or off there, and with it what flows through that unit to
    the layers below. Ours goes on from the reference's values after each step (run_side), so such a step leaves
    nothing behind. A change of the maths moves the loss, more than one unit of the highest layer it reaches, a
    one-unit head (a value or a Q-value), or layers of two roles."""
    stopped = ours.get("stopped")  # ours stopped at the step where it first differed (a planted change): those compared
    if (len(ours["steps"]) != len(reference["steps"]) and not stopped) or not reference["steps"]:
        return float("nan"), 0, 0, f"{len(ours['steps'])} optimiser steps against the reference's {len(reference['steps'])}"
    worst, kinks = 0.0, 0
    for k, (mine, theirs) in enumerate(zip(ours["steps"], reference["steps"], strict=not stopped), 1):
        # ours' side compares each step as it makes it (run_side); a record that kept its tensors is compared here
        step_worst, kinked, mismatch = (
            ours["checked"][k - 1] if "checked" in ours else compare_step(k, mine, theirs, reference)
        )
        if mismatch:
            return worst, k, kinks, mismatch
        worst, kinks = max(worst, step_worst), kinks + kinked
        loss_ours, loss_ref = ours["losses"][k - 1], reference["losses"][k - 1]
        if not abs(loss_ours - loss_ref) <= TOLERANCE * (1 + abs(loss_ref)):
            return worst, k, kinks, f"DIFFERS at step {k}, the loss ({loss_ours:.7g} against {loss_ref:.7g})"
    return worst, len(reference["steps"]), kinks, None


def reference_step(record: Path, step: tuple) -> tuple:
    """A step of the reference's record, (optimiser, parameters, moments), mapped from its own file where it has one."""
    if not isinstance(step[1], str):
        return step
    return torch.load(record.parent / step[1], weights_only=True, mmap=True)


def compare_step(k: int, mine: tuple, theirs: tuple, reference: dict) -> tuple[float, bool, str | None]:
    """Step k's tensors, (optimiser, parameters, moments) on each side: (the largest difference over the tolerance's
    scale, a kinked unit's left out; whether a kink was left out; the mismatch or None), by compare's rule."""
    if mine[0] != theirs[0]:
        return 0.0, False, f"DIFFERS at step {k}: optimiser {mine[0] + 1} stepped, the reference's {theirs[0] + 1}"
    names = [f"{role} {i} {shape}" for i, (role, shape) in enumerate(reference["names"][theirs[0]])]
    kind = reference["optimisers"][theirs[0]]
    keys = MOMENTS[kind]
    names += [f"{n}: {kind}'s {m}" for n in names for m in keys]
    layers = reference["layers"][theirs[0]]  # a weight and its bias: one layer; then their moments, each tensor's
    role = {layer: r for layer, (r, _) in zip(layers, reference["names"][theirs[0]], strict=True)}
    layers = layers + [layer for layer in layers for _ in keys]
    units, sizes = [], {}  # (layer, unit, name, difference over the tolerance's scale) of every unit; units a layer
    for layer, name, a, b in zip(layers, names, [*mine[1], *mine[2]], [*theirs[1], *theirs[2]], strict=True):
        rows = (a - b).transpose(1, 2).flatten(0, 1) if a.dim() == 3 else (a - b)  # stacked critics: (critic, out)
        per_unit = rows.abs().reshape(len(rows), -1).amax(dim=1) / (1.0 + b.abs().max().item())
        units += [(layer, unit, name, diff) for unit, diff in enumerate(per_unit.tolist())]
        sizes[layer] = len(per_unit)
    over = [u for u in units if not u[3] <= TOLERANCE]
    kinked = {(layer, unit) for layer, unit, _, _ in over}
    top = max((layer for layer, _ in kinked), default=None)  # the kink's layer; what it passes back reaches below
    one_kink = sum(layer == top for layer, _ in kinked) == 1 and sizes[top] > 1
    if kinked and not (one_kink and all(role[layer] == role[top] for layer, _ in kinked)):
        _, unit, name, diff = max(over, key=lambda u: u[3])
        return 0.0, False, f"DIFFERS at step {k}, {name} unit {unit} (difference {diff:.3g} of its scale)"
    return max([0.0] + [diff for layer, unit, _, diff in units if (layer, unit) not in kinked]), bool(over), None


def side_process(side: str, pair: str, script: Path, flags: list[str], record: Path, start: Path | None, deps: str,
                 ends: bool = False, same: list[str] = (), plant: bool = False) -> str:  # fmt: skip
    """One side in a child process (run_side) in a folder of its own; '' when it ran, else its last line."""
    cleanrl_utils = [str(Path(script).parent.parent)] if side == "reference" else []  # the tree CleanRL's file is in
    paths = [deps, *cleanrl_utils, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONWARNINGS": "ignore"}
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, __file__, "--side", side, "--pair", pair, "--script", str(script), "--record", str(record)]
    cmd += (["--start", str(start)] if start else []) + (["--ends"] if ends else []) + (["--same", *same] if same else [])
    cmd += ["--plant"] if plant else []
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run([*cmd, "--", *flags], cwd=cwd, env=env, capture_output=True, text=True)
    return "" if proc.returncode == 0 else (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]


def pair_line(pair: str, ours: Path, reference: Path) -> str:
    worst, steps, kinks, mismatch = compare(*(torch.load(r, weights_only=True, mmap=True) for r in (ours, reference)))
    if mismatch:
        return f"{pair}: {mismatch}"
    kinked = f" (and one unit at a ReLU's kink in {kinks} of them)" if kinks else ""
    return f"{pair}: max difference {worst:.2g} after {steps} optimiser steps{kinked}: match"


def write_reference(path: str, tree: Path, clone: str | None) -> Path:
    """CleanRL's file under tree (ported), with the helpers of cleanrl_utils that its scripts import; or ("sb3:a2c")
    the script that runs Stable-Baselines3's A2C."""
    if path == "sb3:a2c":
        (tree / "sb3_a2c.py").write_text(SB3_A2C)
        return tree / "sb3_a2c.py"
    cache = Path.home() / ".cache" / "cleanrl_speed"
    for helper in ("cleanrl_utils/atari_wrappers.py", "cleanrl_utils/buffers.py"):
        write_ported(helper, tree, clone, cache)
    (tree / "cleanrl_utils" / "__init__.py").write_text("")
    return write_ported(path, tree, clone, cache)


def commands(pair: str, ends: bool) -> tuple[list[str], list[str]]:
    """Ours' command and the reference's for a scenario: the first with the pair's push (both sides' flags that drive
    its clips), the second, with episode ends, as PAIRS has them (each side's defaults)."""
    _, our_cmd, cleanrl, spec, _, _ = PAIRS[pair]
    push = [] if ends else list(spec.get("push", ()))
    return our_cmd + push, cleanrl + push


def run_plant(pair: str, tree: Path, deps: str, ours: Path, reference: Path, same: list[str] = ()) -> str:
    """Ours with the pair's PLANTED change (and the departures in `same` made CleanRL's) against the reference's record:
    where it first differs ("DIFFERS at step ..."), else why not."""
    our_cmd, record = commands(pair, False)[0], tree / f"{pair}_ours_planted.pt"
    if failed := side_process("ours", pair, ours / our_cmd[0], our_cmd[1:], record, reference, deps, False, same, True):
        return f"ours failed: {failed}"
    mismatch = compare(*(torch.load(r, weights_only=True, mmap=True) for r in (record, reference)))[3]
    return mismatch or "matched as well: the data does not reach it"


def notes(pair: str, reference: Path, plant: str | None = None) -> dict:
    """A row's notes: what the reference's run reached of its clips, and (scenario 1) the planted change's verdict."""
    found = {"reach": reach_text(torch.load(reference, weights_only=True, mmap=True).get("reach", {})) or "no clip"}
    if plant is not None:
        found["planted"] = f"{PLANTED[pair][0]}: {plant}"
        found["caught"] = plant.startswith("DIFFERS")
    return found


def run_pair(pair: str, tree: Path, clone: str | None, deps: str, ours: Path) -> tuple[str, dict]:
    """Scenario 1, no episode ends: both sides, the reference first (ours starts from its weights), then ours with the
    pair's planted change; the pair's line and its notes. A pair whose files depart from each other even so
    (spec["departures"]) is run as run_departures does."""
    (our_cmd, cleanrl), spec = commands(pair, False), PAIRS[pair][3]
    if spec.get("departures"):
        return run_departures(pair, tree, clone, deps, ours, False, spec["departures"])
    records = {side: tree / f"{pair}_{side}.pt" for side in ("reference", "ours")}
    reference = write_reference(cleanrl[0], tree, clone)
    for side, script, flags, start in (
        ("reference", reference, cleanrl[1:], None),
        ("ours", ours / our_cmd[0], our_cmd[1:], records["reference"]),
    ):
        if failed := side_process(side, pair, script, flags, records[side], start, deps):
            return f"{pair}: the {side} side failed: {failed}", {}
    plant = run_plant(pair, tree, deps, ours, records["reference"])
    return pair_line(pair, records["ours"], records["reference"]), notes(pair, records["reference"], plant)


def run_departures(pair: str, tree: Path, clone: str | None, deps: str, ours: Path, ends: bool, differences):
    """The reference, then ours with every one of `differences` made CleanRL's (which must match) and with each left as
    ours in turn (which must not: each difference is real and the data exercises it). Scenario 2 (ends: episodes end)
    with DIFFERENCES at an episode's end; scenario 1 of a pair whose files differ without them (PPG), where ours with
    them all made CleanRL's then runs with the pair's planted change too. The line and its notes."""
    (our_cmd, cleanrl), spec = commands(pair, ends), PAIRS[pair][3]
    always = list(spec.get("departures", ())) if ends else []  # with ends: scenario 1's departures made CleanRL's too
    where, label = ("ends", " with episode ends") if ends else ("phase", "")
    reference = tree / f"{pair}_{where}_reference.pt"
    script = write_reference(cleanrl[0], tree, clone)
    if failed := side_process("reference", pair, script, cleanrl[1:], reference, None, deps, ends=ends):
        return f"{pair}{label}: the reference side failed: {failed}", {}
    results = {}
    for left in (None, *differences):  # None: all made CleanRL's; else that one left as ours
        record = tree / f"{pair}_{where}_ours_{left or 'none'}.pt"
        same = always + [d for d in differences if d != left]
        failed = side_process("ours", pair, ours / our_cmd[0], our_cmd[1:], record, reference, deps, ends, same)
        if failed and left and "the networks differ" in failed:  # a difference of shape: refused before any step
            results[left] = (float("nan"), 0, 0, "DIFFERS before the first step: " + failed.split(": ", 3)[-1])
            continue
        if failed:
            return f"{pair}{label}: ours failed: {failed}", {}
        results[left] = compare(*(torch.load(r, weights_only=True, mmap=True) for r in (record, reference)))
    found = notes(pair, reference, None if ends else run_plant(pair, tree, deps, ours, reference, list(differences)))
    named = ", ".join(DIFFERENCES[d] for d in differences[:-1]) + f" and {DIFFERENCES[differences[-1]]}"
    named = f"{named} (beside the {len(always)} details of the first scenario)" if always else named
    worst, steps, kinks, mismatch = results[None]
    if mismatch:
        return f"{pair}{label}, {named} made CleanRL's: {mismatch}", found
    if idle := [DIFFERENCES[d] for d in differences if results[d][3] is None]:
        return f"{pair}{label}: leaving ours' {', '.join(idle)} changed nothing (the data does not reach it)", found
    each = "; ".join(f"{DIFFERENCES[d]} left as ours: {results[d][3]}" for d in differences)
    kinked = f" (one unit at a ReLU's kink in {kinks})" if kinks else ""
    return (f"{pair}{label}: with {named} made CleanRL's, max difference {worst:.2g} after {steps} optimiser "
            f"steps{kinked} ({each}): match"), found  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cleanrl", default=None, help="a clone of vwxyzjn/cleanrl (default: fetch its files from GitHub)")
    p.add_argument("--deps", default="/tmp/cleanrl_deps", help="PYTHONPATH entries for CleanRL's extra needs (':')")
    p.add_argument("--only", nargs="*", default=None, choices=list(PAIRS), help="pairs to run (default: all)")
    p.add_argument("--ours", default=str(ROOT / "algorithms"), help="the folder of our files (default: this checkout's)")
    p.add_argument("--out", default=None, help="also write the table as markdown here")
    p.add_argument("--keep", default=None, help="a folder to keep each side's record in (<pair>_<side>.pt)")
    p.add_argument("--side", choices=["ours", "reference"], help=argparse.SUPPRESS)
    p.add_argument("--pair", help=argparse.SUPPRESS)
    p.add_argument("--script", help=argparse.SUPPRESS)
    p.add_argument("--record", help=argparse.SUPPRESS)
    p.add_argument(
        "--scenarios",
        type=int,
        nargs="+",
        default=[1, 2],
        choices=[1, 2],
        help="1: no episode ends; 2: episodes end, and each of ours' named differences is shown to be the only one",
    )
    p.add_argument("--start", help=argparse.SUPPRESS)
    p.add_argument("--ends", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--same", nargs="*", default=[], choices=list(DIFFERENCES), help=argparse.SUPPRESS)
    p.add_argument("--plant", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("flags", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side:
        run_side(args.side, args.pair, args.script, args.flags, args.record, args.start, args.ends, args.same, args.plant)
        return 0
    if args.cleanrl:  # CleanRL's files are read from the clone's history at the pinned commit: one line if it has none
        cleanrl_file("cleanrl/ppo.py", args.cleanrl, Path())
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(args.keep or tmp)
        tree.mkdir(parents=True, exist_ok=True)
        for pair in args.only or list(PAIRS):
            for scenario in [k for k in args.scenarios if k == 1 or isinstance(PAIRS[pair][5], tuple)]:
                start = time.time()
                where = (tree, args.cleanrl, args.deps, Path(args.ours))
                ran = run_pair(pair, *where) if scenario == 1 else run_departures(pair, *where, True, PAIRS[pair][5])
                lines.append((pair, scenario, *ran))
                print(f"{ran[0]} ({time.time() - start:.0f} s)", flush=True)
                for key, label in (("reach", "clips reached"), ("planted", "planted")):
                    if key in ran[1]:
                        print(f"    {label}: {ran[1][key]}", flush=True)
    matched = sum(line.endswith(": match") for _, _, line, _ in lines)
    planted = [found.get("caught", False) for _, k, _, found in lines if k == 1]
    summary = f"{matched} of {len(lines)} pairs match; {sum(planted)} of {len(planted)} planted changes differ"
    print(summary)
    if args.out:
        scenarios = {1: "no episode ends", 2: "episodes end"}
        pushed = {p: f" ({' '.join(PAIRS[p][3]['push'])} on both sides)" for p in PAIRS if "push" in PAIRS[p][3]}
        rows = "\n".join(
            f"| {PAIRS[pair][0]} | {scenarios[k]}{pushed.get(pair, '') if k == 1 else ''} | {line.split(': ', 1)[1]} | "
            f"{found.get('reach', '')} | {found.get('planted', '')} |"
            for pair, k, line, found in lines
        )
        if 2 in args.scenarios:  # the pairs without a second scenario, with why
            ran = dict.fromkeys(pair for pair, _, _, _ in lines)
            rows += "".join(
                f"\n| {PAIRS[p][0]} | {scenarios[2]} | {PAIRS[p][5]} | | |" for p in ran if isinstance(PAIRS[p][5], str)
            )
        Path(args.out).write_text(
            f"# Lockstep against CleanRL at {CLEANRL_COMMIT[:8]}\n\n"
            "Each pair: our file and CleanRL's on the same scripted data, from the same initial weights, with the same "
            "actions and minibatch orders, on the CPU in float32 ([benchmark/studies/lockstep.py](../studies/lockstep.py) "
            "says how). After every optimiser step, every parameter and the optimiser's moments (Adam's two, RMSprop's "
            "mean square) are compared with the "
            "reference's; the difference is the largest |ours - reference| over 1 + the reference tensor's largest "
            f"magnitude, and a match needs it within {TOLERANCE:g} (float32 rounding) and each minibatch's loss as close. "
            "Ours then goes on from the reference's values, so each step is judged on its own. A step where one unit "
            "alone is off, with the layers beneath it (a ReLU whose input sat within rounding of 0 in one sample, and "
            "the gradient it passes back), is counted, not failed. In the "
            "second scenario the scripted env ends episodes (about one env step in 20, a third of them by a time limit) "
            "with the next-step autoreset; ours departs from CleanRL there on purpose, bootstrapping a truncation and "
            "masking out the reset step ([docs/ppo.md](../../docs/ppo.md), with the sources). With both departures made "
            "CleanRL's way the pair must match, and with each left as ours it must differ: each is real, and they are "
            "the only differences; with memory (ppo-lstm) a third, where the memory is zeroed, is made CleanRL's and left "
            "as ours in the same way. Where a pair has no second scenario, its row says why. "
            "ppg_procgen.py departs from CleanRL's file even without episode ends (its auxiliary phase's own Adam, "
            "no leftover policy gradient in that phase's first step, the advantages' population std: "
            "[docs/ppg_procgen.md](../../docs/ppg_procgen.md)); its pair is run as the second scenario is, each "
            "departure made CleanRL's for the match and left as ours alone for a difference. So is the RND pair, for "
            "the seven details where rnd_ppo.py follows openai/random-network-distillation "
            "([docs/rnd_ppo.md](../../docs/rnd_ppo.md), detail 10). a2c.py has no CleanRL counterpart: its reference is "
            "Stable-Baselines3's A2C (2.4.1), run with its defaults by a script the study writes.\n\n"
            "A match says nothing about a detail the data never reaches, so the study checks itself. In the first "
            "scenario the PPO pairs (ppo.py's four, PPG and RND) run at a larger learning rate on both sides (the "
            "scenario column names it), which takes the policy ratio, the value change and the gradient norm past their "
            "clips; the second scenario keeps each side's defaults. The fourth column gives how far the reference's run "
            "went past each clip: the share of each clamp's inputs outside its bounds (PPO's ratio, 1 +- clip_coef; its "
            "value change, +- clip_coef; TD3's smoothing noise; others where a file clamps), and the steps whose gradient "
            "norm was over its bound. And in the first scenario ours runs once more with a change of the detail that "
            "defines the pair's algorithm planted in its copy (the last column), stopping at the first step that "
            "differs: each must be reported as differing, or the study fails.\n\n"
            f"    python benchmark/studies/lockstep.py{' --only ' + ' '.join(args.only) if args.only else ''}\n\n"
            "| pair | scenario | result | clips reached (the reference's run) | planted change |\n|---|---|---|---|---|\n"
            f"{rows}\n\n{summary}.\n"
        )
    return 0 if matched == len(lines) and all(planted) else 1


if __name__ == "__main__":
    sys.exit(main())
