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
