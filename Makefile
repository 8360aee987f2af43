# Set-up and entry points. `make install` installs torch and the requirements once; the other targets use what is
# installed, so that a CPU build of torch is never replaced by the default index's.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: install qt5 run test test-fast lint format bench mutation

# TORCH_INDEX picks the build of torch: e.g. https://download.pytorch.org/whl/cpu for the CPU-only one
# (on Linux, PyPI's torch is a CUDA build of several GB)
install: qt5
	$(PIP) install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install --quiet -r requirements.txt

# envpool's Procgen envs need the Qt 5 runtime (libQt5Gui.so.5)
qt5:
	@if ldconfig -p | grep -q libQt5Gui.so.5; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libqt5gui5 >/dev/null; \
	else \
		echo "Procgen needs the Qt 5 runtime: run 'sudo apt-get install -y libqt5gui5' (other algorithms work without it)"; \
	fi

# the main job: PPO on CartPole-v1; ends by printing where its tensorboard logs and saved model are
run:
	$(PYTHON) algorithms/ppo.py --env-id CartPole-v1 --save-model

# --dist worksteal: a worker that runs out of tests takes queued ones from the other, so that the long learning checks
# do not leave one core idle at the end (the whole suite 7% faster on two cores; docs/testing.md has its time)
test:
	$(PYTHON) -m pytest tests -q -n auto --dist worksteal

test-fast:
	$(PYTHON) -m pytest tests -q -n auto --dist worksteal -m "not learning"

# Mutation testing, outside CI: mutmut changes each pure maths function of the eight files in many small ways (an
# operator, a constant, a dropped argument) and runs the tests that reach it on each change; a change no test notices
# survives. docs/testing.md has the score, the time and what each survivor changes.
MATHS = ppo.ppo_loss ppo.compute_gae ppo.masked_mean ppo.update_mean_var_count ppo.normalize_obs ppo.scale_reward \
	ppo.annealed_lr a2c.a2c_loss a2c.compute_gae a2c.masked_mean a2c.update_mean_var_count \
	a2c.normalize_obs a2c.scale_reward a2c.explained_variance a2c.annealed_lr rnd_ppo.update_mean_var_count \
	rnd_ppo.update_frame_stats rnd_ppo.normalize_frames rnd_ppo.forward_filter rnd_ppo.normalize_intrinsic \
	rnd_ppo.compute_gae rnd_ppo.intrinsic_gae rnd_ppo.masked_mean rnd_ppo.standardize rnd_ppo.rnd_ppo_loss \
	rnd_ppo.predictor_loss ppg_procgen.update_mean_var_count ppg_procgen.scale_reward ppg_procgen.compute_gae \
	ppg_procgen.normalize_advantages ppg_procgen.policy_loss ppg_procgen.categorical_kl ppg_procgen.aux_loss \
	dqn.linear_schedule dqn.td_target dqn.q_loss dqn.soft_update ddpg_td3.smoothed_target_actions ddpg_td3.td_target \
	ddpg_td3.soft_update ddpg_td3.exploration_actions es.stack_layers es.population_forward es.update_mean_var_count \
	es.update_from_sums es.normalize_frozen es.perturb es.centered_ranks es.es_gradient qlearning.discretise \
	qlearning.q_update qlearning.linear_interp qlearning.greedy_actions qlearning.exact_return

mutation:
	$(PIP) install --quiet mutmut==3.8.1
	$(PYTHON) -m mutmut run $(foreach f,$(MATHS),"algorithms.$(basename $(f)).x_$(subst .,,$(suffix $(f)))__mutmut_*")
	$(PYTHON) -m mutmut results | grep -v "not checked" || true  # the survivors

# a small real benchmark end to end: 2 envs x 2 seeds of PPO at 50k steps, then its plots and table
bench:
	$(PYTHON) benchmark/run.py --algo ppo --name bench_smoke --env-ids CartPole-v1 Acrobot-v1 --seeds 2 -- --total-timesteps 50000
	$(PYTHON) benchmark/report.py benchmark/runs/bench_smoke

lint:
	$(PYTHON) -m ruff check . && $(PYTHON) -m ruff format --check .

format:
	$(PYTHON) -m ruff format . && $(PYTHON) -m ruff check --fix .
