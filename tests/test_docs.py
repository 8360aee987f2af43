"""The documentation as a user meets it: links and images that resolve, the README figure remade from the committed
data, every benchmark report in the results index, --help that reads in whole sentences, and no work notes."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import figure
from algos import ROOT
from benchmark.studies import form
from conftest import only_run, run_algorithm

SCRIPTS = sorted(p.stem for p in (ROOT / "algorithms").glob("*.py"))
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS_PAGES = sorted(p for p in (ROOT / "benchmark" / "results").rglob("*.md") if "/runs/" not in p.as_posix())
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# work notes that have no place in what users read: issue numbers, dates of work, borrowed machines
WORK_NOTES = re.compile(r"\bissues? #?\d+|\b20\d\d-\d\d-\d\d\b|\blent\b|\blease\b|\bsession\b", re.IGNORECASE)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+\s+(.*)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_a_page_without_the_linked_file_or_anchor_fails_the_link_check(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [gone](missing.md) ![img](pic.png) [bad](#nowhere) [web](https://x.org)\n")
    assert broken_links(page) == ["missing.md", "pic.png", "#nowhere"]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES + RESULTS_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page):
    assert broken_links(page) == []


def test_readme_links_every_algorithm_page_and_shows_the_figure():
    readme = (ROOT / "README.md").read_text()
    for name in SCRIPTS:
        assert f"docs/{name}.md" in readme and (ROOT / "docs" / f"{name}.md").is_file()
    assert "benchmark/results/overview.png" in readme


def test_the_readme_figure_is_made_again_from_the_committed_data(tmp_path):
    out = tmp_path / "overview.png"
    assert figure.draw(out) == len(figure.PANELS)
    assert out.stat().st_size > 50_000  # ten panels of curves, not an empty canvas
    folders = [folder for _, folder, *_ in figure.PANELS]
    assert len(set(folders)) == len(folders)  # one panel per benchmark


def test_every_benchmark_report_is_in_the_results_index():
    results = ROOT / "benchmark" / "results"
    index = (results / "README.md").read_text()
    reports = [p.relative_to(results).as_posix() for p in results.rglob("report.md") if "/runs/" not in p.as_posix()]
    assert [r for r in reports if f"({r})" not in index] == []


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_gives_each_flag_its_docstring_in_one_piece(name):
    """tyro keeps an indented docstring's line breaks; each flag's text must come out whole, wrapped only by width."""
    env = {**os.environ, "COLUMNS": "1000"}
    text = subprocess.run(
        [sys.executable, str(ROOT / "algorithms" / f"{name}.py"), "--help"], capture_output=True, text=True, env=env
    ).stdout
    source = (ROOT / "algorithms" / f"{name}.py").read_text()  # each field, and the docstring below it
    helps = [" ".join(doc.split()) for doc in re.findall(r'^    \w+: [^\n]*\n    """(.*?)"""', source, re.M | re.S)]
    assert len(helps) > 10
    lines = [" ".join(line.strip("│ ").split()) for line in text.splitlines()]
    for help_text in helps:
        if "(computed)" not in help_text:  # fields computed at start-up are not flags
            assert any(help_text in line for line in lines), help_text
    assert not WORK_NOTES.search(text)


def test_no_work_notes_where_users_read():
    files = PAGES + [p for p in (ROOT / "benchmark").rglob("*") if p.suffix in {".md", ".sh", ".py", ".csv", ".txt"}]
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in files
        if "/runs/" not in p.as_posix()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if WORK_NOTES.search(line)
    ]
    assert hits == []


# The files of a run's folder as docs/conventions.md's table names them, and the code in algorithms/ that writes each
RUN_FILES = {
    "events.out.tfevents.*": "SummaryWriter(self.dir",
    "checkpoint.pt": 'os.path.join(self.dir, "checkpoint.pt")',
    "phase_<iteration>_process<rank>.u8": 'f"phase_{iteration}_process{run.rank}.u8"',
    "finished": 'os.path.join(self.dir, "finished")',
    "<script>.model": 'os.path.join(self.dir, f"{SCRIPT[:-3]}.model")',
    "videos/eval_<step>.mp4": 'os.path.join(self.dir, "videos", f"eval_{at}.mp4" if at else "final.mp4")',
    "videos/final.mp4": 'os.path.join(self.dir, "videos", f"eval_{at}.mp4" if at else "final.mp4")',
}


def run_files_table() -> dict[str, str]:
    """docs/conventions.md's table of what a run writes: each file name, and the row that says when."""
    page = (ROOT / "docs" / "conventions.md").read_text()
    section = page[page.index("### What a run writes") :].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name: row for row in rows for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])}


def test_the_files_a_run_writes_are_listed_once_as_the_code_writes_them():
    """One table says what a run's folder holds; every other page that lists it links there, and no page says that
    every run writes checkpoint.pt (only --checkpoint-every N or a stop writes one)."""
    table = run_files_table()
    assert sorted(table) == sorted(RUN_FILES)
    code = "".join((ROOT / "algorithms" / f"{name}.py").read_text() for name in SCRIPTS)
    assert [name for name, writes in RUN_FILES.items() if writes not in code] == []
    assert "--checkpoint-every N" in table["checkpoint.pt"] and "SIGTERM" in table["checkpoint.pt"]
    for page in PAGES:
        for paragraph in page.read_text().split("\n\n"):
            if re.search(r"run writes `runs/", paragraph) and page.name != "conventions.md":
                assert "conventions.md#what-a-run-writes" in paragraph, (page.name, paragraph)
                assert "`checkpoint.pt`" not in paragraph or "--checkpoint-every" in paragraph, (page.name, paragraph)


def test_a_run_writes_only_the_files_the_table_names(tmp_path):
    """A default run leaves its events and `finished`; --checkpoint-every and --save-model add checkpoint.pt and the
    model; nothing else appears, and each file matches a name of the table."""
    names = [re.escape(name.replace("<script>", "ppo")).replace(r"\*", ".*") for name in run_files_table()]
    patterns = [re.sub(r"<\w+>", "[^/]+", name) for name in names]
    made = {}
    for flags in ((), ("--checkpoint-every", "512", "--save-model", "--eval-episodes", "1")):
        cwd = tmp_path / str(len(flags))
        cwd.mkdir()
        run_algorithm("ppo", "--env-id", "CartPole-v1", "--total-timesteps", "1024", *flags, cwd=cwd)
        run_dir = only_run(cwd)
        made[flags] = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
        assert all(any(re.fullmatch(pattern, name) for pattern in patterns) for name in made[flags]), made[flags]
    assert [re.sub(r"\..*", "", name) for name in made[()]] == ["events", "finished"]
    assert {"checkpoint.pt", "ppo.model", "finished"} < set(made[flags])


def test_the_ppg_pages_small_run_is_the_learning_checks_run():
    """docs/ppg_procgen.md offers a small run as the learning check of tests/test_learning.py: the same flags (the
    test adds its seed), so that the page's run learns what the test shows it learns, in the time the page gives."""
    page = (ROOT / "docs" / "ppg_procgen.md").read_text()
    command = next(b for b in page.split("```bash\n")[1:] if "JumperEasy-v0" in b.split("```")[0]).split("```")[0]
    words = command.replace("\\\n", " ").split()[2:]  # past `python algorithms/ppg_procgen.py`
    test = (ROOT / "tests" / "test_learning.py").read_text()
    argv = re.findall(r'"([^"]+)"', test[test.index('"--env-id", "JumperEasy-v0"') :].split("])")[0]) + ["--no-cuda"]
    seed = argv.index("--seed")
    assert words == argv[:seed] + argv[seed + 2 :], (words, argv)


def test_the_readme_counts_the_lines_a_learner_reads_as_the_files_have_them():
    """The README's algorithms table gives each file's length down to its `# The algorithm ends here` line (what
    benchmark/studies/form.py prints as part 1): a file that grows or shrinks there changes the table with it."""
    table = {}
    for row in (ROOT / "README.md").read_text().splitlines():
        if row.startswith("| [`") and (found := re.search(r"\| ([\d,]+) \([^)]*\) \|", row)):
            table[re.search(r"`(\w+)\.py`", row).group(1)] = int(found.group(1).replace(",", ""))
    assert table == {name: form.form(name)["part_one"] for name in SCRIPTS}
