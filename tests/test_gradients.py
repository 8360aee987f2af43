"""Each optimiser step of the six files that train by backpropagation takes the gradient of its own loss only: the
gradients a step used are cleared before the next loss's arrive, or the next step would add them again (an update that
drops its zero_grad still learns CartPole, and passes every other test of its file). A short run of each, in this
process, watched by torch's own optimiser hooks. es.py is not here: it sets its gradient estimate (.grad =), never adds
to one."""

import functools

import pytest
from torch.optim.optimizer import register_optimizer_step_post_hook

from conftest import CPU, SMOKE_FLAGS, run_in_process

# each file's short run: at least two steps of each of its optimisers (ddpg_td3.py's actor and critics, ppg_procgen.py's
# policy and auxiliary phases), on its own kind of env
RUNS = {
    "ppo": ["--total-timesteps", "512"],
    "a2c": ["--total-timesteps", "100"],
    "dqn": ["--total-timesteps", "700", *SMOKE_FLAGS["dqn"]],
    "ddpg_td3": ["--env-id", "Pendulum-v1", "--total-timesteps", "400", *SMOKE_FLAGS["ddpg_td3"]],
    "ppg_procgen": ["--total-timesteps", "512", *SMOKE_FLAGS["ppg_procgen"]],
    "rnd_ppo": ["--total-timesteps", "128", *SMOKE_FLAGS["rnd_ppo"]],
}
OPTIMISERS = {"ddpg_td3": 2, "ppg_procgen": 2}  # else one


class FirstGradients:
    """Watches every optimiser step in its block and, after each step, the first gradient that reaches each parameter
    it stepped: the parameter's .grad must be None or zero then. Later gradients before the next step may add up (a
    minibatch in chunks)."""

    def __enter__(self):
        self.waiting, self.hooked = {}, set()
        self.steps, self.checked, self.stale = {}, {}, []
        self.handle = register_optimizer_step_post_hook(self.stepped)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def stepped(self, optimizer, _args, _kwargs):
        self.steps[id(optimizer)] = self.steps.get(id(optimizer), 0) + 1
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.waiting[p] = id(optimizer)
                if p not in self.hooked:  # a leaf's hook runs before the gradient is added to its .grad
                    self.hooked.add(p)
                    p.register_hook(functools.partial(self.arrives, p))

    def arrives(self, p, _grad):
        if (optimizer := self.waiting.pop(p, None)) is None:
            return
        self.checked[optimizer] = self.checked.get(optimizer, 0) + 1
        if p.grad is not None and p.grad.any():
            self.stale.append(tuple(p.shape))


@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_optimiser_step_starts_from_cleared_gradients(name, tmp_path):
    argv = [*RUNS[name], CPU]
    with FirstGradients() as watch:
        proc = run_in_process(name, lambda module: module.run_main(module.main, module.parse_args(argv)), tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not watch.stale, f"{name}.py: a gradient was added to the last step's, in parameters of shapes {watch.stale[:4]}"
    # not vacuous: each optimiser stepped, and gradients reached its parameters after a step
    assert len(watch.steps) == OPTIMISERS.get(name, 1) and all(watch.checked.get(o, 0) > 0 for o in watch.steps), (
        watch.steps,
        watch.checked,
    )
