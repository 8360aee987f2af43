"""The run plumbing is one text copied into every algorithm file (house style: a reader needs one file). This test
fails, printing the diff, when a copy drifts; functions and classes of the same name in several files must read the
same too, unless DIFFERENT below names them with the reason (or GROUPS, two versions each shared by a group of files)."""

import ast
import difflib

import pytest

from conftest import ROOT

ALGORITHMS = sorted(p.stem for p in (ROOT / "algorithms").glob("*.py"))
HEADING = "# " + "=" * 111 + "\n# Run plumbing"

# Same name, different job: each file's own version, on purpose.
DIFFERENT = {
    "Args": "each algorithm's flags",
    "RANGES": "each algorithm's flags",
    "PRESETS": "each algorithm's reference settings",
    "CHECKPOINT_FORMAT": "each file's own checkpoint layout, raised when that file's layout changes",
    "write_checkpoint": "what each algorithm's checkpoint holds (PPG's phase frames, RND's filter state)",
    "preset_defaults": "each algorithm's presets",
    "main": "the algorithm",
    "start_run": "each algorithm's set-up: its checks, spaces, processes and restored state",
    "end_run": "each algorithm's end: its final model, saved, reloaded and evaluated",
    "end_iteration": "each algorithm's logging, evaluation, checkpoint and stop at the end of its loop's iteration",
    "restore_run": "what each algorithm's checkpoint puts back (networks, optimisers, statistics, buffers, phases)",
    "Agent": "a shared-trunk or two-MLP actor-critic (ppo.py, a2c.py) against PPG's policy and value IMPALA networks",
    "env_spaces": "ppg_procgen.py takes only envpool's Procgen ids, whose spaces its spec has",
    "check_args": "each algorithm's spaces and flag combinations",
    "storage": "each algorithm's buffers, reckoned for the shared check_storage",
    "evaluate": "each algorithm's policy",
    "make_env": "each algorithm's env options (Atari wrappers, backend, episode cap)",
    "ReplayBuffer": "dqn.py stores each Atari frame once per env and restacks; ddpg_td3.py keeps flat vectors on the device",
    "select_actions": "epsilon-greedy (dqn.py) against Gaussian exploration noise (ddpg_td3.py)",
    "training_steps": "each algorithm's acting step and update, the functions --compile hands to torch.compile",
    "td_target": "max or Double-DQN argmax (dqn.py) against the minimum over critics (ddpg_td3.py)",
}

# Same name, two versions: each group's files read the same.
GROUPS = {
    # on the host in numpy where a step's row of env output is normalised (vectors, rewards), on the device where
    # frames are (es.py keeps its own ObsStatistics, merged from sums); ppg_procgen.py's copy of the host one, and of
    # the maths below, is wrapped to 110 characters a line, which ppo.py's and a2c.py's are not yet
    "RunningMeanStd": (("a2c", "ppo"), ("ppg_procgen",), ("rnd_ppo",)),
    "annealed_lr": (("a2c", "ppo", "rnd_ppo"), ("ppg_procgen",)),
    "compute_gae": (("a2c", "ppo", "rnd_ppo"), ("ppg_procgen",)),
    "explained_variance": (("a2c", "ppo", "rnd_ppo"), ("ppg_procgen",)),
    "scale_reward": (("a2c", "ppo"), ("ppg_procgen",)),
}


def source(name: str) -> str:
    return (ROOT / "algorithms" / f"{name}.py").read_text()


def plumbing(name: str) -> str:
    text = source(name)
    assert text.count(HEADING) == 1, f"{name}.py has no single '# Run plumbing' heading"
    return text[text.index(HEADING) :]


def diff(a: str, b: str, name_a: str, name_b: str) -> str:
    return "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True), name_a, name_b))


@pytest.mark.parametrize("name", [n for n in ALGORITHMS if n != "ppo"])
def test_the_plumbing_block_is_the_same_text_in_every_file(name):
    reference, copy = plumbing("ppo"), plumbing(name)
    assert copy == reference, "\n" + diff(reference, copy, "ppo.py", f"{name}.py")


def top_level_definitions(name: str) -> dict[str, str]:
    """Source of each top-level function, class and constant before the plumbing block."""
    text = source(name)
    text = text[: text.index(HEADING)] if HEADING in text else text
    tree = ast.parse(text)
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = ast.get_source_segment(text, node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.get_source_segment(text, node)
    return out


def test_same_name_same_text_across_files():
    definitions = {name: top_level_definitions(name) for name in ALGORITHMS}
    problems = []
    for symbol in sorted({s for defs in definitions.values() for s in defs}):
        holders = [n for n in ALGORITHMS if symbol in definitions[n]]
        if len(holders) < 2 or symbol in DIFFERENT:
            continue
        groups = GROUPS.get(symbol, (holders,))
        assert sorted(n for g in groups for n in g) == holders, f"{symbol}: GROUPS names {groups}, held by {holders}"
        for first, *others in groups:
            for other in others:
                a, b = definitions[first][symbol], definitions[other][symbol]
                if a != b:
                    problems.append(diff(a, b, f"{first}.py:{symbol}", f"{other}.py:{symbol}"))
    assert not problems, "same name, different text (make them one, or rename, or add to DIFFERENT):\n" + "\n".join(problems)
