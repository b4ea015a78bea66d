"""The compile census's machinery: rows from a real child, the caps, the table, the command.

The census is a measuring tool, not the library: its tests live beside it, so nothing under
``tests/`` imports from ``profiling/``; the README's test command runs them too (``testpaths``),
under the suite's settings (its compilation cache, quiet logs, the ``x64`` fixture:
``tests/conftest.py``).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import psutil
import pytest
from jax.experimental.compilation_cache.compilation_cache import reset_cache

from profiling.census import __main__ as census
from profiling.census import cells, probe, report, runner
from profiling.census.supervise import Outcome, run_supervised
from tests.conftest import (  # noqa: F401, F811  (the suite's settings: fixtures found by name)
    _float_type_restored,
    _no_width_env,
    _quiet_logs,
    x64,
)

ROOT = Path(__file__).resolve().parents[2]  # the repository's root

BIG_MB = 1e6  # a memory cap that never triggers


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def tiny_plan(**kwargs) -> runner.Plan:
    args = dict(
        cells=("one",),
        transforms=("vag",),
        widths=(1,),
        n_starts=1,
        size="tiny",
        components=(1,),
        repeats=1,
        phase_cap_s=120.0,
        rss_cap_mb=BIG_MB,
        steady_budget_s=0.02,
    )
    return runner.Plan(**{**args, **kwargs})


# -- rows from a real child, cold then warm ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_tiny_cell_gives_a_cold_row_and_a_warm_row_that_hit_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the cache folders go
    out = tmp_path / "rows.json"
    lines = []
    command = "python -m profiling.census test"
    rows = runner.run_census(tiny_plan(), out, command=command, echo=lines.append)

    assert json.loads(out.read_text()) == rows
    assert [r["cache"] for r in rows] == ["cold", "warm"]
    cold, warm = rows
    for r in rows:
        assert r["status"] == "ok", r
        assert (r["cell"], r["transform"], r["width"], r["n_starts"]) == ("one", "vag", 1, 1)
        for key in ("trace_s", "lower_s", "compile_s", "steady_s", "steady_per_start_s"):
            assert r[key] > 0, key
        assert r["jax_version"] == jax.__version__ and r["jaxlib_version"]
        assert r["cpu_count"] == os.cpu_count() and r["backend"] == jax.default_backend()
        assert r["phase_cap_s"] == 120.0 and r["rss_cap_mb"] == BIG_MB
        assert r["command"] == command
        assert r["n_bands"] == 1 and r["shapes"] == "16x16" and r["components"] == 1
        assert r["peak_rss_mb"] > 0 and r["child_max_rss_mb"] > 0
        assert r["phase"] == "steady" and r["starts_per_call"] == 1
    # cold wrote the entry and read nothing; warm read it back
    assert cold["cache_misses"] >= 1 and cold["cache_hits"] == 0 and cold["cache_bytes"] > 0
    assert warm["cache_hits"] >= 1 and warm["cache_misses"] == 0
    assert cold["hlo_lines"] == warm["hlo_lines"] > 0
    assert len(lines) == 2 and "one K=1 vag w=1 warm" in lines[1]
    assert not list(tmp_path.glob("multistart-census-cache-*"))  # cache folders removed


@pytest.mark.parametrize("transform", ["vmap_vag", "laxmap_vag", "pyloop_vag"])
def test_each_transform_builds_compiles_and_runs(transform, capsys):
    # In this process with the persistent cache off (the suite's cache has compiled these
    # programs before, in an earlier run or test): 3 starts in chunks of 2 (ragged).
    spec = {
        "cell": "one",
        "size": "tiny",
        "transform": transform,
        "width": 2,
        "n_starts": 3,
        "cache_dir": None,
        "steady_budget_s": 0.01,
    }
    before = jax.config.jax_enable_compilation_cache
    try:
        out = probe.measure(spec)
    finally:  # the suite's cache on again, opened afresh at the next compile
        jax.config.update("jax_enable_compilation_cache", before)
        reset_cache()
    markers = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(probe.PHASE)]
    assert [m.split()[1] for m in markers] == ["setup", "trace", "lower", "compile", "steady"]
    assert out["starts_per_call"] == (2 if transform == "vmap_vag" else 3)
    assert out["compile_s"] > 0 and out["steady_calls"] >= 3
    assert out["cache_hits"] == 0
    if transform == "pyloop_vag":
        assert out["chunk_calls_per_sweep"] == 2


def test_unknown_transform_is_named():
    with pytest.raises(ValueError, match="unknown transform 'scan'.*vag, vmap_vag"):
        probe._program(
            {"cell": "one", "size": "tiny", "transform": "scan", "width": 1, "n_starts": 1}
        )


# -- the caps ---------------------------------------------------------------------------------


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether ``pid`` has died (or is a zombie) within ``within_s``: a SIGKILL is delivered
    when the kernel next schedules the process, which on a loaded machine is not at once."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


# The time-cap tests run `sh`, not Python: it announces its first phase within milliseconds, so
# the cap of the phase before the first marker ("start") is never what a loaded machine trips.
# No test asserts how long anything took; each asserts what happened (the status, the phases
# seen, the exit code: a child that ran to its end exits 0, one killed by the cap -9).


@pytest.mark.subprocess
def test_a_phase_past_the_time_cap_is_killed_with_its_process_group(tmp_path):
    pid_file = tmp_path / "grandchild"
    script = (
        f"sleep 600 & echo $! > {pid_file}\n"
        "echo '#census-phase compile'\n"
        "wait\n"
        "echo '#census-phase steady'\n"  # reached only if the cap did not kill the child
    )
    outcome = run_supervised(["sh", "-c", script], phase_cap_s=1.0, rss_cap_mb=BIG_MB)
    assert outcome.status == "timeout" and outcome.phase == "compile"
    assert outcome.note == "compile did not finish in 1 s"
    assert outcome.returncode == -9  # killed: the sleep it waited for did not run out
    assert [p for p, _ in outcome.phases] == ["compile"]
    assert _gone(int(pid_file.read_text()))  # the grandchild went with it


@pytest.mark.subprocess
def test_the_time_cap_is_per_phase_not_per_process():
    # four phases of 0.4 s each under a cap of 1 s: 1.6 s in all, and the child finishes
    script = 'for p in setup trace compile steady; do echo "#census-phase $p"; sleep 0.4; done'
    outcome = run_supervised(["sh", "-c", script], phase_cap_s=1.0, rss_cap_mb=BIG_MB)
    assert outcome.status == "ok" and outcome.returncode == 0
    assert [p for p, _ in outcome.phases] == ["setup", "trace", "compile", "steady"]


@pytest.mark.subprocess
def test_a_child_growing_past_the_memory_cap_is_killed():
    code = (
        "import time\n"
        "print('#census-phase compile', flush=True)\n"
        "hold = []\n"
        "for _ in range(200):\n"
        "    hold.append(b'x' * (20 * 2**20)); time.sleep(0.01)\n"
        "time.sleep(60)\n"
    )
    outcome = run_supervised(_py(code), phase_cap_s=60, rss_cap_mb=150)
    assert outcome.status == "memory_cap" and outcome.returncode == -9
    assert outcome.peak_rss_mb > 150 and outcome.phase == "compile"
    assert "memory cap of 150 MB (in phase compile)" in outcome.note


@pytest.mark.subprocess
def test_sigkill_not_sent_by_the_census_is_recorded_as_the_oom_killer():
    code = "import os, signal\nprint('#census-phase compile', flush=True)\n"
    code += "os.kill(os.getpid(), signal.SIGKILL)\n"
    outcome = run_supervised(_py(code), phase_cap_s=30, rss_cap_mb=BIG_MB)
    assert outcome.status == "oom_killed" and outcome.returncode == -9
    assert "not sent by the census (in phase compile)" in outcome.note
    assert "OOM killer" in outcome.note


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "code, status, note",
    [
        ("raise SystemExit(3)", "error", "exited with status 3"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", "signal", "SIGTERM"),
    ],
)
def test_other_endings_are_classified(code, status, note):
    outcome = run_supervised(_py(code), phase_cap_s=30, rss_cap_mb=BIG_MB)
    assert outcome.status == status and note in outcome.note


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(phase_cap_s=0, rss_cap_mb=1), "phase_cap_s must be a positive number"),
        (dict(phase_cap_s=1, rss_cap_mb=-5), "rss_cap_mb must be a positive number"),
        (dict(phase_cap_s=1, rss_cap_mb=1, poll_s=2), "poll_s must be positive"),
    ],
)
def test_bad_caps_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_supervised(_py("pass"), **kwargs)


# -- rows ---------------------------------------------------------------------------------------


def _outcome(status="ok", result=None, note=""):
    lines = ["#census-phase steady"]
    if result is not None:
        lines.append(f"{probe.RESULT} {json.dumps(result)}")
    rc = {"ok": 0, "timeout": -9}.get(status, 1)
    return Outcome(status, rc, "steady", note, lines, "", 1.0, 100.0, [("steady", 0.5)])


@pytest.mark.parametrize(
    "cache, result, status",
    [
        ("warm", {"cache_hits": 0, "cache_misses": 1}, "no_cache_hit"),
        ("warm", {"cache_hits": 1, "cache_misses": 0}, "ok"),
        ("cold", {"cache_hits": 1, "cache_misses": 0}, "cache_not_cold"),
        ("cold", {"cache_hits": 0, "cache_misses": 1}, "ok"),
        ("cold", None, "error"),
    ],
)
def test_a_warm_figure_needs_a_confirmed_cache_hit(cache, result, status):
    row = runner.make_row({"cell": "one"}, _outcome(result=result), cache)
    assert row["status"] == status and row["cache"] == cache and row["cell"] == "one"


def test_a_killed_child_keeps_its_note_and_stderr():
    outcome = _outcome("timeout", note="compile did not finish in 5 s")
    outcome.stderr_tail = "last words"
    row = runner.make_row({}, outcome, "cold")
    assert row["status"] == "timeout" and row["note"] == "compile did not finish in 5 s"
    assert row["stderr_tail"] == "last words" and row["phase"] == "steady"


def test_measurements_give_vag_width_one_only():
    plan = tiny_plan(
        cells=("one", "homo4"),
        transforms=("vag", "pyloop_vag"),
        widths=(2, 4),
        n_starts=4,
        components=(2, 3),
    )
    assert runner.measurements(plan) == [
        ("one", 2, "vag", 1), ("one", 2, "pyloop_vag", 2), ("one", 2, "pyloop_vag", 4),
        ("homo4", 2, "vag", 1), ("homo4", 2, "pyloop_vag", 2), ("homo4", 2, "pyloop_vag", 4),
        ("one", 3, "vag", 1), ("one", 3, "pyloop_vag", 2), ("one", 3, "pyloop_vag", 4),
        ("homo4", 3, "vag", 1), ("homo4", 3, "pyloop_vag", 2), ("homo4", 3, "pyloop_vag", 4),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(cells=("one", "nope")), r"unknown cells \['nope'\]"),
        (dict(transforms=()), "transforms is empty"),
        (dict(size="huge"), "size must be one of full, quick, tiny"),
        (dict(widths=(4, 0)), "widths must be positive ints"),
        (dict(components=()), "components must be positive ints"),
        (dict(widths=(8,), n_starts=4), r"n_starts must be an int >= the largest width \(8\)"),
        (dict(repeats=0), "repeats must be a positive int"),
        (dict(phase_cap_s=-1.0), "phase_cap_s must be a positive number"),
    ],
)
def test_bad_plans_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny_plan(**kwargs)


# -- cells --------------------------------------------------------------------------------------


def test_cells_have_the_shapes_they_claim():
    facts = {c: cells.describe(c, "tiny") for c in cells.CELLS}
    assert {c: f["distinct_shapes"] for c, f in facts.items()} == {
        "one": 1, "homo4": 1, "hetero2": 2, "hetero4": 4, "padded4": 4,
    }  # fmt: skip
    # what the compiled program sees: stacked groups of one shape each, after any padding
    assert {c: f["compiled_shapes"] for c, f in facts.items()} == {
        "one": 1, "homo4": 1, "hetero2": 2, "hetero4": 4, "padded4": 1,
    }  # fmt: skip
    assert facts["homo4"]["groups"] == 1 and facts["hetero4"]["groups"] == 4
    assert facts["hetero4"]["n_params"] == 5 + 4  # shared centre(2), q, phi, size; a sky per band


def test_padding_the_census_model_is_exact(x64):  # noqa: F811
    assert cells.build("padded4", "tiny").check_padding(rtol=1e-10, atol=1e-8) < 1e-8


def test_components_set_the_model_weight():
    facts = cells.describe("one", "tiny", components=5)
    assert facts["components"] == 5
    assert cells.describe("one", "tiny")["components"] == cells.SIZES["tiny"].components


@pytest.mark.parametrize(
    "args, match",
    [
        (("six",), "unknown census cell 'six'; cells are one, homo4"),
        (("one", "huge"), "unknown census size 'huge'; sizes are full, quick, tiny"),
        (("one", "tiny", 0), "components must be a positive int; got 0"),
    ],
)
def test_bad_cell_arguments_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        cells.build(*args)


# -- the table ----------------------------------------------------------------------------------


def _row(cell, transform, width, cache, compile_s, status="ok", repeat=0, **kw):
    row = {
        "cell": cell,
        "components": 16,
        "transform": transform,
        "width": width,
        "cache": cache,
        "status": status,
        "repeat": repeat,
        "note": kw.pop("note", ""),
        "jax_version": "0.10.2",
        "jaxlib_version": "0.10.2",
        "cpu_count": 2,
        "size": "full",
        "phase_cap_s": 300.0,
        "rss_cap_mb": 8000.0,
        "command": "python -m profiling.census --repeats 3",
        "loadavg_1m": 2.0,
    }
    if status == "ok":
        row.update(
            trace_s=0.25, lower_s=0.25, compile_s=compile_s, steady_per_start_s=0.002,
            starts_per_call=1 if transform == "vag" else 32, hlo_lines=1000, peak_rss_mb=400.0,
            cache_hits=int(cache == "warm"), cache_misses=int(cache == "cold"),
        )  # fmt: skip
    row.update(kw)
    return row


def literal_rows():
    rows = []
    for rep, (one, het) in enumerate([(1.0, 9.0), (3.0, 12.0), (2.0, 6.0)]):
        rows += [
            _row("one", "vag", 1, "cold", one, repeat=rep),
            _row("one", "vag", 1, "warm", 0.1, repeat=rep),
            _row("hetero4", "vag", 1, "cold", het, repeat=rep),
            _row("hetero4", "vag", 1, "warm", 0.3, repeat=rep),
        ]
    rows[-1] = _row("hetero4", "vag", 1, "warm", 0.0, status="no_cache_hit", repeat=2)
    rows += [
        _row("hetero4", "laxmap_vag", 4, "cold", None, status="timeout",
             note="compile did not finish in 300 s"),
        _row("hetero4", "laxmap_vag", 4, "warm", None, status="skipped",
             note="the cold run did not finish (timeout): no cache entry to warm from"),
        _row("one", "laxmap_vag", 4, "cold", 4.0),
        _row("one", "laxmap_vag", 4, "warm", None, status="memory_cap"),
    ]  # fmt: skip
    return rows


def _table_rows(text):
    return {
        tuple(c.strip(" `") for c in line.strip("|").split("|")[:3]): [
            c.strip() for c in line.strip("|").split("|")
        ]
        for line in text.splitlines()
        if line.startswith("| `")
    }


def test_the_table_gives_medians_ratios_and_failures_in_words():
    text = report.markdown(literal_rows())
    table = _table_rows(text)
    # columns: cell, K, transform, width, starts/call, HLO, trace+lower, cold, warm,
    # warm/cold, x one, x vag, steady, peak, runs
    one, het = table[("one", "16", "vag")], table[("hetero4", "16", "vag")]
    assert one[7:12] == ["2.00", "0.10", "0.05", "1.00", "1.00"]
    assert het[7] == "9.00" and het[10] == "4.50"  # median 9 of (9, 12, 6); 9 / 2 = 4.5 x one
    assert het[8] == "0.30" and het[14] == "3/3, 2/3"  # the warm without a hit is no figure
    lax = table[("hetero4", "16", "laxmap_vag")]
    assert lax[7] == "compile did not finish in 300 s" and lax[8] == "–"
    assert table[("one", "16", "laxmap_vag")][11] == "2.00"  # 4.0 / vag's 2.0
    assert "python -m profiling.census --repeats 3" in text and "median of 3 repeats" in text
    assert "jax 0.10.2" in text and "2 CPUs" in text and "phase cap 300 s" in text
    assert "`hetero4` K=16 `vag` width 1 warm (repeat 2): no_cache_hit" in text
    assert "`one` K=16 `laxmap_vag` width 4 warm (repeat 0): memory_cap" in text
    assert "skipped" not in text.split("did not give a figure")[1]


def test_the_generated_block_is_replaced_not_duplicated(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("# Census\n\nFindings written by hand.\n")
    rows = literal_rows()
    report.update_file(path, rows)
    report.update_file(path, rows[:2])
    report.update_file(path, rows[2:4], block="other")
    text = path.read_text()
    begin, end = report.markers()
    assert text.count(begin) == 1 and text.count(end) == 1
    assert text.startswith("# Census\n\nFindings written by hand.\n")
    mine = text.split(begin)[1].split(end)[0]
    assert "| `one` |" in mine and "hetero4" not in mine  # the second table replaced the first
    other = text.split(report.markers("other")[0])[1]
    assert "hetero4" in other and "| `one` |" not in other
    with pytest.raises(ValueError, match="expected one"):
        report.replace_block(text + end, "x")
    with pytest.raises(ValueError, match="block must be"):
        report.markers("no spaces")
    with pytest.raises(ValueError, match="no census rows"):
        report.markdown([])


# -- the command ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--widths", "4,0"], "--widths: must be a comma-separated list of positive integers"),
        (["--cells", "one,six"], "--cells: must be a comma-separated list of one, homo4"),
        (["--transforms", ""], "--transforms: must be a comma-separated list of vag"),
        (["--phase-cap", "-3"], "--phase-cap: must be a positive number"),
        (["--memory-cap-mb", "lots"], "--memory-cap-mb: must be a positive number"),
        (["--components", "x"], "--components: must be a comma-separated list of positive"),
        (["--block", "a b"], "--block: must be letters, digits"),
    ],
)
def test_the_command_rejects_bad_arguments(argv, match, capsys):
    with pytest.raises(SystemExit) as exc:
        census.main(argv)
    assert exc.value.code == 2 and match in capsys.readouterr().err


def test_the_command_rejects_a_plan_wider_than_its_starts(capsys, tmp_path):
    argv = ["--quick", "--widths", "16", "--out", str(tmp_path / "r.json")]
    assert census.main(argv) == 2
    assert "n_starts must be an int >= the largest width (16)" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_the_command_from_json_tabulates_without_measuring(tmp_path, capsys):
    rows_file = tmp_path / "rows.json"
    rows_file.write_text(json.dumps(literal_rows()))
    assert census.main(["--from-json", str(rows_file)]) == 0
    assert "| `hetero4` | 16 | `vag` | 1 |" in capsys.readouterr().out
    md = tmp_path / "README.md"
    assert census.main(["--from-json", str(rows_file), "--markdown", str(md)]) == 0
    assert report.markers()[0] in md.read_text()
    assert "| `one` | 16 | `vag` | 1 |" in md.read_text()
    assert census.main(["--from-json", str(tmp_path / "missing.json")]) == 2
    assert "cannot tabulate" in capsys.readouterr().err


@pytest.mark.subprocess
def test_python_dash_m_profiling_census_runs_from_the_repository_root(tmp_path):
    rows_file = tmp_path / "rows.json"
    rows_file.write_text(json.dumps(literal_rows()))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a fresh checkout's
    out = subprocess.run(
        [sys.executable, "-m", "profiling.census", "--from-json", str(rows_file)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "| `hetero4` | 16 | `vag` | 1 |" in out.stdout
