"""The shape of an algorithm file (CONTRIBUTING.md, "Three parts"): the algorithm from the top to a line that begins
`# The algorithm ends here`, holding everything a learner needs (Args, the networks, the maths the Makefile's MATHS
lists, the update step, main) and taking few names from below it, then this file's machinery, then the shared block,
each within the limits benchmark/studies/form.py counts. Reads the files' text only: no import, no run."""

import ast
import re

import pytest

from benchmark.studies import form
from conftest import ROOT

MARKER = "# The algorithm ends here"
SHARED = "# Run plumbing"

# What part 1 must hold besides Args, main and the file's maths: the networks and the update step
PART_ONE = {
    "ppo": ["Agent", "training_steps", "ppo_update"],
    "a2c": ["Agent", "training_steps"],
    "dqn": ["QNetwork", "training_steps"],
    "ddpg_td3": ["Actor", "Critics", "critic_update", "actor_update"],
    "es": ["Policy", "rollout"],
    "qlearning": [],
    "ppg_procgen": ["ImpalaCNN", "Agent", "policy_update", "aux_update"],
    "rnd_ppo": ["Agent", "RNDModel", "rnd_ppo_update"],
}


def maths_entries() -> list[str]:
    """The Makefile's MATHS: `<file>.<function>`, the pure maths functions the mutation tests reach."""
    text = (ROOT / "Makefile").read_text()
    return re.search(r"^MATHS = (.*?)\n\n", text, re.S | re.M).group(1).replace("\\\n", " ").split()


def maths(name: str) -> list[str]:
    """The MATHS entries of this file (its functions' names)."""
    return [entry.split(".", 1)[1] for entry in maths_entries() if entry.split(".", 1)[0] == name]


def parts(name: str):
    text = (ROOT / "algorithms" / f"{name}.py").read_text()
    lines = text.splitlines()
    markers = [i for i, line in enumerate(lines) if line.startswith(MARKER)]
    assert len(markers) == 1, f"{name}.py needs one line that begins '{MARKER}', has {len(markers)}"
    shared = next(i for i, line in enumerate(lines) if line.startswith(SHARED))
    return text, markers[0], shared


def test_the_makefile_lists_maths_for_every_file_but_none_for_a_name_it_does_not_know():
    """Every file has MATHS entries, and every entry is `<file>.<function>` of a known file (part 1 of which must define
    the function: the budget test below); an entry for a file that is not there would be skipped by mutmut unseen."""
    assert sorted(PART_ONE) == sorted(p.stem for p in (ROOT / "algorithms").glob("*.py"))
    assert all(maths(name) for name in PART_ONE)
    unknown = [e for e in maths_entries() if e.count(".") != 1 or e.split(".")[0] not in PART_ONE or not e.split(".")[1]]
    assert not unknown, f"the Makefile's MATHS names {unknown}, which are not <file>.<function> of algorithms/"


@pytest.mark.parametrize("name", sorted(PART_ONE))
def test_the_algorithm_comes_first_and_holds_what_a_learner_needs(name):
    text, marker, shared = parts(name)
    needed = PART_ONE[name]
    assert marker < shared, f"{name}.py: the marker stands below the shared block"
    tree, where = ast.parse(text), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            assert node.name not in where, f"{name}.py defines {node.name} twice"
            where[node.name] = node
    for symbol in ["Args", *needed, *maths(name), "main"]:
        assert symbol in where, f"{name}.py has no {symbol}"
        assert where[symbol].end_lineno <= marker, f"{name}.py: {symbol} stands below the marker; part 1 must hold it"
    # the module docstring opens the file and carries the reading guide, which names the marker
    assert "algorithm ends here" in (ast.get_docstring(tree) or "")


@pytest.mark.parametrize("name", sorted(PART_ONE))
def test_part_one_uses_nothing_from_another_file_of_this_project(name):
    text, marker, _ = parts(name)
    top = ast.parse("\n".join(text.splitlines()[:marker]))
    imported = [a.name for n in ast.walk(top) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(top) if isinstance(n, ast.ImportFrom)]
    own = {p.stem for p in (ROOT / "algorithms").glob("*.py")} | {"algos", "tblog", "benchmark", "conftest"}
    assert not [m for m in imported if m.split(".")[0] in own]


def test_the_readme_gives_each_file_the_lines_a_learner_reads():
    """The README's table counts part 1 of each file; a change that moves the marker changes the count there too."""
    readme = (ROOT / "README.md").read_text()
    for name in PART_ONE:
        row = next(line for line in readme.splitlines() if line.startswith(f"| [`{name}.py`]"))
        counted = int(row.split(" | ")[-2].split(" ")[0])
        assert counted == parts(name)[1], f"README.md says part 1 of {name}.py is {counted} lines; it is {parts(name)[1]}"


@pytest.mark.parametrize("name", sorted(PART_ONE))
def test_part_one_stands_alone_in_short_lines_and_the_file_does_not_grow_back(name):
    """Part 1 takes at most form.LIMITS names from below its marker, has at most form.LIMITS lines over 110 characters and
    is at most a fifth longer than before the redesign; the file, its machinery and the shared block stay within the
    ceilings form.py records (each at most its size when the redesign last reached it, on the way to form.TOTAL)."""
    counts = form.form(name)
    borrowed = counts["names_from_below"]
    assert len(borrowed) <= form.LIMITS["names_from_below"], f"{name}.py: part 1 uses {borrowed} from below the marker"
    assert counts["long_lines"] <= form.LIMITS["long_lines"], f"{name}.py: {counts['long_lines']} long lines in part 1"
    assert counts["part_one"] <= 1.2 * form.BEFORE[name][1], f"{name}.py: part 1 is {counts['part_one']} lines"
    ceiling = form.CEILING[name]
    for part in ("total", "machinery", "shared"):
        assert counts[part] <= ceiling[part], f"{name}.py: {part} {counts[part]} lines, over its ceiling {ceiling[part]}"
