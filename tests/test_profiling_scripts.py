"""The benchmark scripts under profiling/ name only what the library has.

They are not run by the suite (they take minutes), so a renamed module once broke three of them
silently (`from multistart import sweep` after the sweep family was renamed). Every import of
`multistart` in them, at any depth (most import inside the function that needs it), must
resolve. And a script's command line refuses nonsense before it fits anything: run as a user
runs it (no test imports a benchmark; tests/test_benchmarks.py runs the --quick modes).
"""

import ast
import importlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from markdown_blocks import ROOT

SCRIPTS = sorted((ROOT / "profiling").rglob("*.py"))


def _library_imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("multistart"):
            for alias in node.names:
                yield node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("multistart"):
                    yield alias.name, None


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_library_import_of_a_profiling_script_resolves(script):
    for module, name in _library_imports(script):
        imported = importlib.import_module(module)
        if name is None or hasattr(imported, name):
            continue
        importlib.import_module(f"{module}.{name}")  # a submodule not yet imported


def _run(*argv, timeout=600):
    """A profiling command run as a user runs it, from the repository root."""
    path = os.pathsep.join(
        p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    return subprocess.run(
        [sys.executable, *map(str, argv)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path, "MULTISTART_LOG_LEVEL": "WARNING"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--problems", "MGH09,Nope"], "unknown problem(s) Nope;"),
        (["--problems", ","], "unknown problem(s) (none given)"),
        (["--seeds", "0,x"], "--seeds takes comma-separated ints"),
        (["--strategy", "random"], "--strategy: invalid choice: 'random'"),
    ],
)
def test_nist_strd_refuses_nonsense_as_a_usage_error(argv, message):
    run = _run("profiling/nist_strd.py", *argv)
    assert run.returncode == 2 and message in run.stderr, run.stderr[-2000:]


def test_the_accelerator_command_runs_at_tiny_sizes_on_a_cpu(tmp_path):
    """``python -m profiling.accelerator --cpu``: the chip's benchmark runs in its own process
    at tiny sizes, and prints and records each section's arms (here the batch of small fits
    beside its peers, and the memory bound's widths; ``first``'s fresh processes are the slow
    tier's, below)."""
    record = tmp_path / "accelerator.json"
    run = _run("-m", "profiling.accelerator", "--cpu", "--only", "many,memory", "--json", record)
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(record.read_text())
    assert figures["notes"]["platform"] == "cpu" and figures["notes"]["sizes"]["fits"] == 200
    assert figures["benchmark"] == "accelerator" and figures["quick"] is True
    sections = figures["notes"]["sections"]
    assert list(sections) == ["many", "memory"] and all(name in run.stdout for name in sections)
    arms = [r["arm"] for r in sections["many"]]
    assert arms == ["ms.curve_fit, float32", "optimistix LM vmap", "hand-written LM vmap"]
    assert all(np.isfinite(r["ratio"]) and r["good"] > 0 for r in sections["many"])
    assert [r["arm"] for r in sections["memory"]] == ["batch_size='auto'", "batch_size=8"]
    assert all(r["finite"] == 8 for r in sections["memory"])


@pytest.mark.slow
def test_every_section_of_the_accelerator_command_runs_on_a_cpu(tmp_path):
    record = tmp_path / "accelerator.json"
    run = _run("-m", "profiling.accelerator", "--cpu", "--json", record, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]
    sections = json.loads(record.read_text())["notes"]["sections"]
    # "first" runs before the parent opens the chip (only one process may hold a TPU)
    assert list(sections) == ["first", "many", "float64", "image", "memory", "scan"]
    assert all(rows for rows in sections.values())
    assert sections["float64"][0]["good"] == sections["float64"][1]["good"]


@pytest.mark.subprocess
def test_the_accelerator_command_refuses_a_size_that_is_not_positive_or_an_unknown_section():
    run = _run("-m", "profiling.accelerator", "--cpu", "--starts", "0")
    assert run.returncode == 2 and "--starts must be a positive int" in run.stderr, run.stderr
    run = _run("-m", "profiling.accelerator", "--cpu", "--only", "many,gpu")
    assert run.returncode == 2 and "unknown section 'gpu'" in run.stderr, run.stderr


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--patients", "0"], "--patients must be a positive int"),
        (["--steps", "-3"], "--steps must be a positive int"),
        (["--hessian-chunk", "-1"], "--hessian-chunk must be >= 0"),
    ],
)
def test_the_cohort_benchmark_refuses_nonsense_as_a_usage_error(argv, message):
    run = _run("profiling/cohort.py", *argv)
    assert run.returncode == 2 and message in run.stderr, run.stderr[-2000:]


# -- the suite's shape: few scripts, every one on the harness, every link resolving ---------------

PROFILING = ROOT / "profiling"
SUITE = sorted(p for p in PROFILING.rglob("*.py") if "experiments" not in p.relative_to(ROOT).parts)
# the harness's own tools: they read its records rather than measure
TOOLS = {"harness.py", "compare.py", "report.py"}


def test_the_suite_outside_the_experiments_is_at_most_twenty_scripts():
    assert len(SUITE) <= 20, [str(p.relative_to(ROOT)) for p in SUITE]


def _defines_main(tree) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)


def _calls(tree, attribute) -> bool:
    return any(
        isinstance(n, ast.Attribute)
        and n.attr == attribute
        and isinstance(n.value, ast.Name)
        and n.value.id == "harness"
        for n in ast.walk(tree)
    )


@pytest.mark.parametrize("script", SUITE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_main_of_the_suite_is_on_the_harness(script):
    """A benchmark's ``main`` takes the harness's options (``--json``) and writes its record; a
    tool reads records through the harness. Nothing starts a process but the harness."""
    tree = ast.parse(script.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    if script.name != "harness.py":  # processes are the harness's to start, cap and kill
        assert not imported & {"subprocess", "multiprocessing"}, imported
    if not _defines_main(tree) or script.name == "harness.py":
        return
    if script.name in TOOLS:
        assert _calls(tree, "read_record"), f"{script.name} reads records without the harness"
        return
    assert _calls(tree, "Record") and _calls(tree, "add_arguments"), (
        f"{script.name}'s main does not write a harness record"
    )


def _links(text: str):
    text = re.sub(r"(?ms)^```.*?^```", "", text)  # a code block's brackets are not links
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def _anchors(path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text())
    headings = re.findall(r"(?m)^#{1,6} (.+?)\s*$", text)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *PROFILING.rglob("*.md")])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_to_a_file_resolves_and_every_anchor_into_profiling_too(page):
    """``mkdocs build --strict`` checks the pages' links among themselves; this checks the rest:
    every relative link of the README, the pages and profiling/'s own files names a file that
    exists, and an anchor into a page of profiling/ (a history's section) names a heading."""
    for link in _links(page.read_text()):
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.relative_to(ROOT)} links to a missing {link}"
        inside = PROFILING.resolve() in path.parents
        if anchor and path.suffix == ".md" and inside:
            assert anchor in _anchors(path), f"{page.relative_to(ROOT)}: no heading for {link}"
