import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import multistart as ms
from multistart import __main__ as cli
from multistart import demo


def test_demo_quick_writes_its_outputs(tmp_path, capsys, monkeypatch, caplog):
    monkeypatch.delenv("MULTISTART_LOG_LEVEL")
    # the outputs, not the fit's quality, are under test: a short run writes them all
    monkeypatch.setitem(demo.QUICK, "n_steps", 40)
    logger = logging.getLogger("multistart")
    before = logger.level
    out = tmp_path / "out"
    try:
        logger.setLevel(logging.INFO)
        assert cli.main(["demo", "--quick", "--quiet", "--out", str(out), "--n-starts", "6"]) == 0
        assert not [r for r in caplog.records if r.name == "multistart"]  # --quiet: no lines,
        assert logger.level == logging.INFO  # and the quiet level does not outlive the run
        assert "MULTISTART_LOG_LEVEL" not in os.environ
    finally:
        logger.setLevel(before)
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["demo.png", "result.npz", "starts.csv"]
    result = ms.Result.load(out / "result.npz")
    assert result.n_starts == 6 and result.config["n_steps"] == demo.QUICK["n_steps"]
    assert result.config["search"] == "MultiStartProdigy"
    table = pd.read_csv(out / "starts.csv")
    assert len(table) == 6 and list(table.columns[:8]) == list(demo_columns())
    np.testing.assert_allclose(table["fom"], result.foms)
    png = (out / "demo.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 50_000
    for text in ("truth", "best fit", "centre[0] (x)", "chi2 at truth", "within 1 of the best"):
        assert text in printed
    assert str(out / "demo.png") in printed


def demo_columns():
    return ("index", "fom", "status", "n_steps", "n_evals", "at_bound", "best_step", "minimum")


def test_demo_without_the_plots_extra_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "missing_dependencies", lambda: ["matplotlib"])
    assert cli.main(["demo", "--quick", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "needs matplotlib" in err and "pip install 'multistart[plots]'" in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ImportError, match="needs matplotlib"):
        demo.run(tmp_path / "out", quick=True)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["demo", "--n-starts", "0"], "--n-starts: must be a positive integer"),
        (["demo", "--batch-size", "two"], "--batch-size: must be a positive integer"),
        (["demo", "--seed", "-1"], "--seed: must be an integer >= 0"),
        ([], "required: COMMAND"),
    ],
)
def test_bad_arguments_exit_with_a_message(argv, match, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert match in capsys.readouterr().err


@pytest.mark.subprocess
def test_python_dash_m_multistart_runs_the_command():
    root = str(Path(ms.__file__).resolve().parents[1])  # this copy of the package (src/)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )
    out = subprocess.run(
        [sys.executable, "-m", "multistart", "demo", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    for option in ("--quick", "--out", "--n-starts", "--batch-size", "--seed", "--quiet"):
        assert option in out.stdout
