"""The docs/ pages' code blocks run and print what the pages show; the README links resolve."""

import re

import pytest
from markdown_blocks import ROOT, check_output, python_blocks, run_page

PAGES = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_blocks_run_and_print_what_the_page_shows(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, ran = run_page(page)
    assert len(ran) == sum(not b.skip for b in python_blocks(page))


def test_few_blocks_are_skipped():
    skipped = [(p.name, b.line) for p in PAGES for b in python_blocks(p) if b.skip]
    # the checkpoint illustration (20,000 steps) and scale-out.md's four cluster scripts (a
    # Slurm array task, a Ray job, a jax.distributed job and its retry guard): they need a
    # scheduler or several processes (tests/test_parts.py runs two processes for real)
    assert len(skipped) <= 5, skipped


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_relative_links_resolve(page):
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_output_check_catches_a_wrong_figure_and_a_wrong_word():
    check_output("best 395.68134 {'converged': 30}\n", "best 395.6813 {'converged': 30}", "x")
    check_output("best 395.68134\n", "best 395.7", "x")  # rounded as the page shows it
    with pytest.raises(AssertionError, match="395.4"):
        check_output("best 395.68134\n", "best 395.4", "x")
    with pytest.raises(AssertionError, match="printed 31"):
        check_output("{'converged': 31}\n", "{'converged': 30}", "x")
    with pytest.raises(AssertionError, match="prints"):
        check_output("worst 1.0\n", "best 1.0", "x")
