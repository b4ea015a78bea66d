"""The benchmark suite under profiling/, run as a user runs it: a script's ``--quick`` mode writes
a record (``--json PATH``) whose shape ``python -m profiling.compare`` reads.

Never a time: the records' figures are whatever this machine measured; what is asserted is that
each benchmark runs, records the machine and commit, and that every ratio is an arm's figure
over its peer's, both finite and measured in the same run.
"""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import pytest
from markdown_blocks import ROOT

# Benchmarks with scipy peer arms (and fresh-process arms), at their quick sizes (seconds)
QUICK = {
    "fixed_cost": ["profiling/fixed_cost.py", "--quick", "--problems", "DanWood"],
    "curve_fit_many": ["profiling/curve_fit_many.py", "--quick"],
    "cube": ["profiling/cube.py", "--quick"],
    "nist_strd": ["profiling/nist_strd.py", "--quick", "--problems", "DanWood", "--seeds", "0,2"],
    "cohort": ["profiling/cohort.py", "--quick"],
}


def _python(*argv, timeout=600):
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


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Each quick benchmark's record and printed output."""
    folder = tmp_path_factory.mktemp("records")
    out = {}
    for name, argv in QUICK.items():
        path = folder / f"{name}.json"
        run = _python(*argv, "--json", path)
        assert run.returncode == 0, run.stderr[-3000:]
        out[name] = (path, json.loads(path.read_text()), run.stdout)
    return out


@pytest.mark.subprocess
@pytest.mark.parametrize("name", list(QUICK))
def test_a_quick_benchmark_writes_a_record_of_its_machine_commit_and_figures(records, name):
    _, record, stdout = records[name]
    assert record["schema"] == 1 and record["benchmark"] == name and record["quick"] is True
    assert record["command"] == f"python {' '.join(QUICK[name])} --json {records[name][0]}"
    machine = record["machine"]
    assert machine["cpu_count"] >= 1 and machine["python"] == ".".join(
        map(str, sys.version_info[:3])
    )
    assert machine["jax"] and machine["device"] and machine["n_devices"] >= 1
    sha = record["commit"]["sha"]
    assert sha is None or (len(sha) == 40 and int(sha, 16) >= 0)
    figures, ratios = record["figures"], record["ratios"]
    assert figures and ratios and f"record written to {records[name][0]}" in stdout
    for label, ratio in ratios.items():
        arm, peer = figures[ratio["arm"]], figures[ratio["peer"]]
        assert math.isfinite(ratio["value"]) and ratio["value"] > 0, (label, ratio)
        assert ratio["value"] == pytest.approx(arm / peer, rel=1e-12), label


@pytest.mark.subprocess
def test_fixed_cost_records_every_arm_against_its_peers(records):
    _, record, stdout = records["fixed_cost"]
    assert set(record["ratios"]) == {
        "DanWood ours 1st / vmap 1st",
        "DanWood ours 2nd / scipy",
        "DanWood ours 2nd / vmap 2nd",
        "curve_fit child ours / vmap",
    }
    figures = record["figures"]
    assert figures["DanWood ours compiles 2nd"] == 0  # the second fit reuses its programs
    assert figures["curve_fit child process_s"] > figures["curve_fit child ours_s"]
    assert stdout.splitlines()[2].startswith("DanWood ")


@pytest.mark.subprocess
def test_the_cube_reports_its_masked_spaxels_and_scipys_degrees_of_freedom(records):
    _, record, stdout = records["cube"]
    figures = record["figures"]
    default = next(k for k in figures if k.endswith("(default) second no_data"))[: -len(" no_data")]
    lines = figures["line spaxels"]
    for arm in ("1 start second", default):
        assert figures[f"{arm} no_data"] == figures["masked spaxels"] > 0
        assert figures[f"{arm} no_data is the masked"] == 1
        assert figures[f"{arm} dof as scipy's"] == 1
        # the nan channels left in: the line spaxels' fits are scipy's, nan dropped
        assert figures[f"{arm} line fits as good as scipy"] >= 0.9 * lines > 0
        assert 0 <= figures[f"{arm} within 3 sigma"] <= 1
    assert {"1 start second / scipy", f"{default} / scipy"} <= set(record["ratios"])
    if importlib.util.find_spec("lmfit") is not None:  # the profiling extra: lmfit's arm ran
        assert figures["lmfit dof as scipy's"] == 1
        assert "lmfit / scipy" in record["ratios"]
    else:
        assert "lmfit / scipy" not in record["ratios"]  # skipped, and said on stderr
    assert "10 x 10 spaxels x 250 channels" in stdout.splitlines()[0]
    assert f"{default}: within 3σ" in stdout


@pytest.mark.subprocess
def test_nist_strd_fits_the_problems_and_seeds_it_is_given(records):
    _, record, stdout = records["nist_strd"]
    figures = record["figures"]
    seeds = {(arm, seed) for arm in ("lm", "lbfgs", "trf box32", "trf s1") for seed in (0, 2)}
    have = {(a, s) for a, s in seeds if f"DanWood {a} seed {s} worst" in figures}
    # the seeded arms (ours and scipy's box loop) per seed; a fixed start once
    assert have == seeds - {("trf s1", 2)}
    assert not any(name.startswith("Misra1a") for name in figures)  # --problems beats --quick
    assert record["ratios"]["trf box32 wall / trf box32"]["value"] == 1.0
    assert figures["lm solved"] == 2 and "summary: solved" in stdout  # both seeds solve DanWood


@pytest.mark.subprocess
def test_compare_sets_two_records_side_by_side(records, tmp_path):
    path, record, _ = records["curve_fit_many"]
    same = _python("-m", "profiling.compare", path, path)
    assert same.returncode == 0, same.stderr
    ratio = "200 anywhere 1 start warm / scipy"
    line = next(ln for ln in same.stdout.splitlines() if ln.strip().startswith(ratio))
    assert line.split()[-1] == "1.000"
    slower = dict(record, ratios={ratio: {**record["ratios"][ratio]}})
    slower["ratios"][ratio]["value"] *= 2.0
    (tmp_path / "b.json").write_text(json.dumps(slower))
    both = _python("-m", "profiling.compare", path, tmp_path / "b.json")
    assert both.returncode == 0, both.stderr
    line = next(ln for ln in both.stdout.splitlines() if ln.strip().startswith(ratio))
    assert line.split()[-1] == "2.000"
    table = _python("-m", "profiling.compare", path, "--markdown")
    assert table.returncode == 0, table.stderr
    rows = [ln for ln in table.stdout.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert len(rows) == 1 + len(record["ratios"]) and f"| {ratio} | " in table.stdout
    (tmp_path / "bad.json").write_text("{}")
    bad = _python("-m", "profiling.compare", path, tmp_path / "bad.json")
    assert bad.returncode == 1 and "is not a benchmark record" in bad.stderr


def _anchor(heading: str) -> str:
    """The anchor GitHub (and mkdocs' toc) gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_profiling_index_names_every_script_and_every_section_of_the_history():
    folder = ROOT / "profiling"
    index = (folder / "README.md").read_text()
    named = set(re.findall(r"`(\w+\.py)`", index))
    assert {p.name for p in folder.glob("*.py")} <= named
    experiments = (folder / "experiments" / "README.md").read_text()
    listed = set(re.findall(r"^\| `(\w+\.py)` \|", experiments, flags=re.M))
    assert listed == {p.name for p in (folder / "experiments").glob("*.py")}
    history = (folder / "HISTORY.md").read_text()
    sections = [line[3:] for line in history.splitlines() if line.startswith("## ")]
    links = re.findall(r"^- \[(.+)\]\(HISTORY\.md#([\w-]+)\)$", index, flags=re.M)
    assert links == [(s, _anchor(s)) for s in sections]


@pytest.mark.subprocess
def test_cohort_records_compile_fit_and_errors_against_their_peers(records):
    _, record, stdout = records["cohort"]
    assert set(record["ratios"]) == {
        "compile 200 / 50",
        "fit ours / scipy",
        "fit diagonal / scipy",
        "errors arrow / dense",
    }
    assert record["notes"]["errors peer"] == "jax.hessian"
    # the arrow's errors are jax.hessian's (a correctness check riding on the benchmark)
    assert record["figures"]["errors largest relative difference"] < 1e-8
    assert "the whole fit of 200 patients, 2 starts" in stdout


# What a child of the harness does, run by the harness in a process of its own (the suite's tests
# import only the library: profiling/ is run as a user runs it)
_CAPS = r"""
import json, os, sys, time
sys.path.insert(0, "profiling")
import harness

py = sys.executable
out = {}
# a time cap restarted by each progress line: two short phases pass, the third is cut
slow = "import time\nfor p in ('a', 'b', 'c'):\n    print('#phase', p, flush=True)\n"
slow += "    time.sleep({'a': 0.6, 'b': 0.6, 'c': 30}[p])\n"
c = harness.run_child([py, "-c", slow], timeout_s=1.5, progress="#phase ")
out["phased"] = [c.status, c.note, [p for p, _ in c.progress], c.wall_s]
# a child that starts a grandchild and outlives the cap: the whole group goes
spawn = "import subprocess, sys, time\n"
spawn += "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
spawn += "print(g.pid, flush=True)\ntime.sleep(60)"
c = harness.run_child([py, "-c", spawn], timeout_s=2)
grandchild = int(c.lines[0])
time.sleep(0.5)
try:
    os.kill(grandchild, 0)
    alive = open(f"/proc/{grandchild}/stat").read().split()[2] != "Z"
except ProcessLookupError:
    alive = False
out["group"] = [c.status, alive]
grow = "import time\nx = bytearray(600 * 2**20)\nx[::4096] = b'1' * len(x[::4096])\ntime.sleep(30)"
c = harness.run_child([py, "-c", grow], memory_mb=300)
out["memory"] = [c.status, c.note, c.peak_rss_mb]
c = harness.run_child([py, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
out["sigkill"] = [c.status, c.note]
c = harness.run_child([py, "-c", "print('RESULT {\"x\": 2.5}')"])
out["ok"] = [c.status, c.result()]
c = harness.run_child([py, "-c", "import sys; print('RESULT {\"x\": 1}'); sys.exit(3)"])
out["error"] = [c.status, c.note, c.result()]
try:
    harness.run_child([py, "-c", "pass"], timeout_s=0)
except ValueError as e:
    out["refused"] = str(e)
print(json.dumps(out))
"""


@pytest.mark.subprocess
def test_the_harness_caps_a_child_by_phase_and_memory_and_kills_its_whole_group():
    run = _python("-c", _CAPS, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    status, note, phases, wall = out["phased"]
    # each of the first two phases was under the cap, their sum above it: the cap is per phase
    assert status == "timeout" and phases == ["a", "b", "c"] and note == "c did not finish in 1.5 s"
    assert 2.7 < wall < 20
    assert out["group"] == ["timeout", False]  # the grandchild went with its parent's group
    status, note, peak = out["memory"]
    assert status == "memory" and peak > 300
    assert note.startswith("killed above the memory cap of 300 MB")
    assert out["sigkill"][0] == "oom_killed" and "did not send" in out["sigkill"][1]
    assert out["ok"] == ["ok", {"x": 2.5}]
    assert out["error"] == ["error", "exited with status 3", {"x": 1}]
    assert out["refused"] == "timeout_s must be a positive number or None; got 0"


def test_the_profiling_page_is_what_the_records_write():
    """docs/profiling.md's tables are written from profiling/records/ by ``python -m
    profiling.report``: the committed page is what the script writes now."""
    run = _python("-m", "profiling.report", "--check")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_the_report_rewrites_a_block_when_its_record_changes_and_refuses_a_bad_record(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    for path in (ROOT / "profiling" / "records").glob("*.json"):
        (records / path.name).write_text(path.read_text())
    page = tmp_path / "profiling.md"
    page.write_text((ROOT / "docs" / "profiling.md").read_text())
    argv = ["-m", "profiling.report", "--page", page, "--records", records]
    assert _python(*argv, "--check").returncode == 0
    name = "spectra_batch.json"
    record = json.loads((records / name).read_text())
    ratio = next(iter(record["ratios"]))
    record["ratios"][ratio]["value"] = 12.5
    (records / name).write_text(json.dumps(record))
    stale = _python(*argv, "--check")
    assert stale.returncode == 1 and "is not what the records write" in stale.stdout
    assert _python(*argv).returncode == 0 and _python(*argv, "--check").returncode == 0
    text = page.read_text()
    assert f"| {ratio} | **12.5** |" in text and text.count("<!-- /records -->") >= 4
    (records / "broken.json").write_text("{}")
    bad = _python(*argv, "--check")
    assert bad.returncode == 2 and "broken.json is not a benchmark record" in bad.stderr
