"""The docs/ pages' code blocks run and print what the pages show; the README links resolve.

A page's plain blocks run in one namespace (markdown_blocks.run_page). Its ``file=NAME`` blocks
(scripts and the modules they import) are written to a folder and run as the page says, each by
a test named in FILE_RUNS; scripts that need a cluster's processes run as subprocesses of the
slow tier (``-m slow``).
"""

import os
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from markdown_blocks import ROOT, check_output, file_blocks, python_blocks, run_page, write_files

import multistart as ms

PAGES = sorted((ROOT / "docs").rglob("*.md"))  # the guide and the API reference (docs/api/)
WITH_BLOCKS = [p for p in PAGES if any(not b.file for b in python_blocks(p))]
SCALE_OUT = ROOT / "docs" / "scale-out.md"

# Every file block of a page, and the test that runs it (here, or in the file named).
ENGINE_SCRIPTS = "test_engines.py::test_the_pages_engine_script_merges_as_one_process"
FILE_RUNS = {
    ("scale-out.md", "mymodel.py"): "every test below imports it",
    ("scale-out.md", "fit_part.py"): "test_the_slurm_array_task_runs_resumes_and_merges",
    ("scale-out.md", "merge.py"): "test_the_slurm_array_task_runs_resumes_and_merges",
    ("scale-out.md", "ray_fit.py"): ENGINE_SCRIPTS,
    ("scale-out.md", "dask_fit.py"): ENGINE_SCRIPTS,
    ("scale-out.md", "submitit_fit.py"): ENGINE_SCRIPTS,
    ("scale-out.md", "job.py"): "test_the_jax_job_scripts_run_as_two_slurm_processes",
    ("scale-out.md", "job_parts.py"): "test_the_jax_job_scripts_run_as_two_slurm_processes",
}


@pytest.mark.parametrize("page", WITH_BLOCKS, ids=[p.name for p in WITH_BLOCKS])
def test_page_blocks_run_and_print_what_the_page_shows(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, ran = run_page(page)
    assert ran and len(ran) == sum(not b.file for b in python_blocks(page))


def test_no_block_is_left_out():
    pages = [ROOT / "README.md", *PAGES]
    assert not [p.name for p in pages if "<!-- no-test -->" in p.read_text()]
    files = {(p.name, name) for p in pages for name in file_blocks(p)}
    assert files == set(FILE_RUNS), "a file block without a test that runs it, or a stale entry"
    for test in set(FILE_RUNS.values()) - {"every test below imports it"}:
        file, _, name = test.rpartition("::")
        if file:
            assert f"\ndef {name}(" in (ROOT / "tests" / file).read_text(), test
        else:
            assert callable(globals().get(test)), test


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_relative_links_resolve(page):
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


# -- the output check itself ---------------------------------------------------------------------


def test_output_check_takes_a_rounded_page_and_refuses_a_wrong_digit():
    check_output("best 395.68134 {'converged': 30}\n", "best 395.6813 {'converged': 30}", "x")
    check_output("best 395.68134\n", "best 395.7", "x")  # rounded as the page shows it
    for wrong in ("395.6814", "395.6812", "395.4", "395.68135"):
        with pytest.raises(AssertionError, match=wrong.replace(".", r"\.")):
            check_output("best 395.68134\n", f"best {wrong}", "x")
    with pytest.raises(AssertionError, match="printed 395.68 where"):  # fewer digits than shown
        check_output("best 395.68\n", "best 395.6813", "x")
    with pytest.raises(AssertionError, match="printed 31"):
        check_output("{'converged': 31}\n", "{'converged': 30}", "x")
    with pytest.raises(AssertionError, match="printed 30.0"):  # a count printed as a float
        check_output("{'converged': 30.0}\n", "{'converged': 30}", "x")
    with pytest.raises(AssertionError, match="prints"):
        check_output("worst 1.0\n", "best 1.0", "x")
    check_output("1.5e-05\n", "1.5e-05", "x")
    with pytest.raises(AssertionError):
        check_output("1.6e-05\n", "1.5e-05", "x")


def test_a_count_marked_about_agrees_within_five_per_cent_and_only_a_count_takes_the_mark():
    check_output("13 steps, 948 evaluations\n", "13 steps, ≈933 evaluations", "x")
    check_output("13 steps, 900 evaluations\n", "13 steps, ≈933 evaluations", "x")
    with pytest.raises(AssertionError, match="printed 880 where the page shows ≈933"):
        check_output("13 steps, 880 evaluations\n", "13 steps, ≈933 evaluations", "x")
    with pytest.raises(AssertionError, match="printed 14 where the page shows 13"):  # unmarked
        check_output("14 steps, 933 evaluations\n", "13 steps, ≈933 evaluations", "x")
    with pytest.raises(AssertionError, match="prints"):  # the mark is no word of its own
        check_output("13 steps, about 933 evaluations\n", "13 steps, ≈933 evaluations", "x")
    with pytest.raises(ValueError, match="≈ marks a count"):
        check_output("width 4.009854\n", "width ≈4.00985", "x")


def test_a_whole_number_in_a_numpy_array_is_exact():
    check_output("1 64 [ 1.   -0.   -0.58]\n", "1 64 [ 1.   -0.   -0.58]", "x")
    with pytest.raises(AssertionError, match="printed 0.99 where the page shows 1."):
        check_output("1 64 [ 0.99 -0.   -0.58]\n", "1 64 [ 1.   -0.   -0.58]", "x")
    with pytest.raises(AssertionError, match="printed 0. where the page shows 1."):
        check_output("1 64 [ 0.   0.99 -0.58]\n", "1 64 [ 1.   -0.   -0.58]", "x")


def test_a_rerun_block_runs_twice_and_an_unknown_info_is_refused(tmp_path):
    page = tmp_path / "page.md"
    code = "```python rerun\nruns = globals().setdefault('runs', [])\nruns.append(1)\n"
    page.write_text(code + "print(len(runs))\n```\n\n```text\n1\n```\n")
    with pytest.raises(AssertionError, match=r"page.md:2 \(run again\): printed 2"):
        run_page(page)
    page.write_text("```python skip\nprint(1)\n```\n")
    with pytest.raises(ValueError, match="unknown python fence info 'skip'"):
        python_blocks(page)


# -- scale-out.md's scripts, run as the page says -------------------------------------------------


def _python(script, *args, cwd, env=None, timeout=300):
    out = subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        cwd=cwd,
        env={**os.environ, "MULTISTART_LOG_LEVEL": "WARNING", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.fixture
def scale_out(tmp_path):
    write_files(SCALE_OUT, tmp_path)
    return tmp_path


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_slurm_array_task_runs_resumes_and_merges(scale_out):
    for i in range(2):  # the array's tasks, as `srun python fit_part.py $SLURM_ARRAY_TASK_ID 2`
        _python(scale_out / "fit_part.py", i, 2, cwd=scale_out)
    first = (scale_out / "parts" / "part-1-of-2.npz").read_bytes()
    _python(scale_out / "fit_part.py", 1, 2, cwd=scale_out)  # a re-submitted task resumes
    again = ms.Result.load(scale_out / "parts" / "part-1-of-2.npz")
    assert again.stats["resumed_from"] > 0
    assert (scale_out / "parts" / "part-1-of-2.npz").read_bytes() != first  # written anew
    out = _python(scale_out / "merge.py", 2, cwd=scale_out)
    merged = ms.Result.load(scale_out / "result.npz")
    assert merged.stats["n_parts"] == 2 and out.startswith("Result(best_fom=")


def _slurm_env(job: int, rank: int) -> dict:
    """What srun gives each of two tasks on one node (JAX's Slurm detection reads these)."""
    return {
        "SLURM_JOB_ID": str(job),
        "SLURM_STEP_NODELIST": "127.0.0.1",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_STEP_NUM_NODES": "1",
    }


def _two_tasks(script, cwd) -> list[str]:
    job = 1000 + os.getpid() % 3000  # JAX's coordinator port is derived from the job id
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            cwd=cwd,
            env={**os.environ, "MULTISTART_LOG_LEVEL": "WARNING", **_slurm_env(job, rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return [out for out, _ in outs]


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_jax_job_scripts_run_as_two_slurm_processes(scale_out):
    _two_tasks(scale_out / "job.py", scale_out)
    result = ms.Result.load(scale_out / "result.npz")
    assert result.stats["n_processes"] == 2
    _two_tasks(scale_out / "job_parts.py", scale_out)
    parts = sorted((scale_out / "parts").glob("part-*-of-2.npz"))
    assert len(parts) == 2
    stamps = [p.stat().st_mtime_ns for p in parts]
    _two_tasks(scale_out / "job_parts.py", scale_out)  # resubmitted: both parts are there
    assert [p.stat().st_mtime_ns for p in parts] == stamps
    merged = ms.Result.merge(parts)
    assert merged.best_fom == result.best_fom and (merged.foms == result.foms).all()


def test_every_test_the_faults_page_names_exists():
    text = (ROOT / "docs" / "faults.md").read_text()
    named = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", text)
    assert len(named) > 30
    for path, test in named:
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {test}\(", source, flags=re.M), f"{path}::{test}"


# -- faults.md quotes the messages a user gets ----------------------------------------------------

FAULT_SPACE = {"a": ms.Uniform(0.0, 10.0), "tau": ms.LogUniform(0.1, 10.0)}


# The objectives faults.md's messages name, defined at module level so that Python names them
# as the page does (``f()``, not ``_outer.<locals>.f()``).


def chi2(p):
    return (p["a"] - 1.0) ** 2 + jnp.log(p["tau"]) ** 2


def typo(p):
    return (p["A"] - 1.0) ** 2 + jnp.log(p["tau"]) ** 2


def f(x, a, tau):
    return a * jnp.exp(-x / tau)


def vector(p):
    return jnp.stack([p["a"], p["tau"]])


def summed(p):
    return jnp.sum((p["a"] - jnp.arange(3.0)) ** 2)


def branchy(p):
    if p["a"] > 1.0:
        return p["a"] ** 2
    return p["tau"] ** 2


def numpyish(p):
    return np.exp(p["a"]) + p["tau"] ** 2


def rounded(p):
    return jnp.round(p["a"]) + jnp.round(p["tau"])


def _fault_cases():
    o, S, L = globals(), FAULT_SPACE, ms.MultiStartLBFGS
    return {
        "n_starts": lambda: L(n_starts=0),
        "batch_size": lambda: L(batch_size=0),
        "learning_rate": lambda: ms.MultiStartAdam(learning_rate=0),
        "unknown option": lambda: L(n_start=4),
        "positional": lambda: L(4),
        "schedule": lambda: L(schedule="fast"),
        "method": lambda: ms.MultiStartLeastSquares(method="trf"),
        "prior": lambda: ms.Uniform(1.0, 0.0),
        "log prior": lambda: ms.LogUniform(0.0, 1.0),
        "no space": lambda: L(n_starts=2).fit(o["chi2"]),
        "not a prior": lambda: L(n_starts=2).fit(o["chi2"], {"a": 1.0}),
        "curve_fit model": lambda: L(n_starts=2).fit(o["f"], S),
        "curve_fit residuals": lambda: ms.MultiStartLeastSquares(n_starts=2).fit(o["f"], S),
        "misspelt name": lambda: L(n_starts=2).fit(o["typo"], S),
        "vector": lambda: L(n_starts=2).fit(o["vector"], S),
        "scalar residuals": lambda: ms.MultiStartLeastSquares(n_starts=2).fit(o["summed"], S),
        "python if": lambda: L(n_starts=2).fit(o["branchy"], S),
        "numpy": lambda: L(n_starts=2).fit(o["numpyish"], S),
        "no gradient": lambda: L(n_starts=2).fit(o["rounded"], S),
        "start outside": lambda: L(n_starts=2).fit(o["chi2"], S, starts=[{"a": 20.0, "tau": 1.0}]),
        "start on a bound": lambda: L(n_starts=2).fit(o["chi2"], S, starts=[{"a": 0.0, "tau": 1}]),
        "devices": lambda: L(n_starts=2, devices=5).fit(o["chi2"], S),
        "bad part": lambda: L(n_starts=4).fit(o["chi2"], S, part=(4, 2)),
        "coupled part": lambda: L(n_starts=4, start_strategy="tiktak").fit(
            o["chi2"], S, part=(0, 2)
        ),
        "resume": lambda: L(n_starts=2).fit(o["chi2"], S, resume=True),
    }


def _quoted(text: str) -> list[str]:
    """The page's code spans, whitespace collapsed (a span may wrap across source lines)."""
    return [m.group(2).strip() for m in re.finditer(r"(`+)(.+?)\1", " ".join(text.split()))]


@pytest.mark.parametrize("case", list(_fault_cases()))
def test_the_faults_page_quotes_the_message_a_search_gives_before_compiling(case):
    from conftest import NoCompile

    spans = _quoted((ROOT / "docs" / "faults.md").read_text())
    with NoCompile(), pytest.raises(Exception) as info:
        _fault_cases()[case]()
    e = info.value
    mine = [
        n
        for n in getattr(e, "__notes__", [])
        if n.startswith("multistart: ") and "tracing" not in n
    ]
    # JAX's own tracer errors are quoted by name, with multistart's note; the rest in full
    said = mine if isinstance(e, jax_errors()) else [f"{type(e).__name__}: {e}", *mine]
    for message in said:
        message = " ".join(message.split())
        assert any(
            re.fullmatch(".*?".join(map(re.escape, span.split("..."))), message) for span in spans
        ), f"docs/faults.md does not quote: {message}"


def jax_errors():
    import jax

    return (jax.errors.TracerBoolConversionError, jax.errors.TracerArrayConversionError)
