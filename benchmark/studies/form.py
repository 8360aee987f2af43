"""The form of each algorithm file, counted from its text (CONTRIBUTING.md, "Three parts"): its total lines, part 1 (the
algorithm, from the top to the line that begins `# The algorithm ends here`), the file's own machinery (from that line
to the shared block), the shared block (from its heading to the end), part 1's lines over 110 characters, and the
names part 1 uses that are defined only below its marker. tests/test_shape.py holds every file to the limits below.

    python benchmark/studies/form.py            # the table, with each file's limits
    python benchmark/studies/form.py --names    # and the names part 1 takes from below the marker
"""

import argparse
import ast
import builtins
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
MARKER = "# The algorithm ends here"
SHARED = "# Run plumbing"

# The limits: a file's total lines, its own machinery, the shared block, part 1's long lines and borrowed names
LONG = 110
LIMITS = dict(long_lines=5, names_from_below=8, shared=320)
TOTAL = {"ppo": 1250, "a2c": 1250, "ppg_procgen": 1250, "rnd_ppo": 1250, "dqn": 950, "ddpg_td3": 950, "es": 950,
         "qlearning": 950}  # fmt: skip
# each file's own machinery as it was before the redesign that halved it (counted the same way), and part 1's lines
BEFORE = {"ppo": (789, 399), "a2c": (733, 380), "ppg_procgen": (695, 488), "rnd_ppo": (710, 547), "dqn": (486, 300),
          "ddpg_td3": (387, 330), "es": (416, 307), "qlearning": (448, 231)}  # fmt: skip

# Where the redesign has got to: no file grows back past these while the limits above are still ahead of it
CEILING = {
    "ppo": dict(total=1311, machinery=368, shared=465),
    "a2c": dict(total=1277, machinery=361, shared=465),
    "ppg_procgen": dict(total=1406, machinery=362, shared=465),
    "rnd_ppo": dict(total=1445, machinery=327, shared=465),
    "dqn": dict(total=1048, machinery=224, shared=465),
    "ddpg_td3": dict(total=1027, machinery=174, shared=465),
    "es": dict(total=1053, machinery=235, shared=465),
    "qlearning": dict(total=923, machinery=214, shared=465),
}


def module_names(nodes: list[ast.stmt]) -> set[str]:
    """The names these top-level statements define: functions, classes, assignments, imports."""
    names = set()
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            names.update(module_names(getattr(node, "body", [])))
    return names


def form(name: str) -> dict:
    """The counts of algorithms/<name>.py."""
    text = (ROOT / "algorithms" / f"{name}.py").read_text()
    lines = text.splitlines()
    marker = next(i for i, line in enumerate(lines) if line.startswith(MARKER))
    heading = next(i for i, line in enumerate(lines) if line.startswith(SHARED))
    shared = heading - 1 if lines[heading - 1].startswith("# ===") else heading  # the rule above the heading
    tree = ast.parse(text)
    part_one = [node for node in tree.body if node.lineno <= marker]
    below = module_names([node for node in tree.body if node.lineno > marker])
    nodes = [n for node in part_one for n in ast.walk(node)]
    used = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    bound = {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}  # a local of the same name
    bound |= {n.arg for n in nodes if isinstance(n, ast.arg)}
    borrowed = sorted(used & (below - module_names(part_one) - bound - set(dir(builtins))))
    return dict(
        total=len(lines),
        part_one=marker,
        machinery=shared - marker,
        shared=len(lines) - shared,
        long_lines=sum(len(line) > LONG for line in lines[:marker]),
        names_from_below=borrowed,
    )


def problems(name: str, counts: dict) -> list[str]:
    """Each limit this file breaks, in words."""
    machinery, part_one = BEFORE[name]
    found = [f"{counts['total']} lines, over {TOTAL[name]}"] * (counts["total"] > TOTAL[name])
    over_half = 2 * counts["machinery"] > machinery
    found += [f"its own machinery {counts['machinery']} lines, over half of {machinery}"] * over_half
    found += [f"part 1 {counts['part_one']} lines, over a fifth more than {part_one}"] * (counts["part_one"] > part_one * 1.2)
    found += [f"the shared block {counts['shared']} lines, over {LIMITS['shared']}"] * (counts["shared"] > LIMITS["shared"])
    found += [f"{counts['long_lines']} lines of part 1 over {LONG} characters, over {LIMITS['long_lines']}"] * (
        counts["long_lines"] > LIMITS["long_lines"]
    )
    borrowed = counts["names_from_below"]
    found += [f"part 1 uses {len(borrowed)} names from below the marker, over {LIMITS['names_from_below']}"] * (
        len(borrowed) > LIMITS["names_from_below"]
    )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", action="store_true", help="list the names part 1 takes from below its marker")
    show_names = parser.parse_args().names
    header = "| file | total | part 1 | own machinery | shared block | part 1 over 110 chars | names from below |"
    print(header + "\n|" + "---|" * header.count(" | ") + "---|")
    broken = []
    for name in TOTAL:
        c = form(name)
        print(
            f"| {name}.py | {c['total']:,} | {c['part_one']} | {c['machinery']} | {c['shared']} | {c['long_lines']} "
            f"| {len(c['names_from_below'])} |"
        )
        broken += [f"{name}.py: {p}" for p in problems(name, c)]
    if show_names:
        for name in TOTAL:
            print(f"{name}.py: {', '.join(form(name)['names_from_below'])}")
    print("\n".join(["", "over the limits:", *broken]) if broken else "\nevery file within its limits")


if __name__ == "__main__":
    main()
