# Set-up and entry points. Each target installs what it needs first, so each works on a fresh machine.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: install qt5 run test test-fast lint format bench

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
run: install
	$(PYTHON) algorithms/ppo.py --env-id CartPole-v1 --save-model

test: install
	$(PYTHON) -m pytest tests -q -n auto

test-fast: install
	$(PYTHON) -m pytest tests -q -n auto -m "not learning"

# a small real benchmark end to end: 2 envs x 2 seeds of PPO at 50k steps, then its plots and table
bench: install
	$(PYTHON) benchmark/run.py --algo ppo --name bench_smoke --env-ids CartPole-v1 Acrobot-v1 --seeds 2 -- --total-timesteps 50000
	$(PYTHON) benchmark/report.py benchmark/runs/bench_smoke

lint:
	$(PYTHON) -m ruff check . && $(PYTHON) -m ruff format --check .

format:
	$(PYTHON) -m ruff format . && $(PYTHON) -m ruff check --fix .
