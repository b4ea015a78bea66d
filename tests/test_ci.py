"""`.ci/run` fails when any of its steps fails, and runs every step the README names.

It runs here against stand-ins: a Python whose `-m venv` makes a folder of commands that log
their arguments and succeed, except the one a test makes fail. So what is checked is the
script's control flow (issue 24, item 17: under `set -e` a failure on the left of `&&` did not
stop it, and a failed install skipped the demo with CI still green), not the commands.
"""

import os
import stat
import subprocess

import pytest
from markdown_blocks import ROOT

_FAKE_PYTHON = r"""#!/bin/sh
# `fakepy -m venv DIR`: a venv whose commands log their arguments to $CI_LOG and succeed,
# unless the command line matches $CI_FAIL.
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  echo "PATH=\"$3/bin:\$PATH\"; export PATH" > "$3/bin/activate"
  for cmd in python pip multistart ruff mypy lint-imports mkdocs; do
    cat > "$3/bin/$cmd" <<EOS
#!/bin/sh
echo "$cmd \$*" >> "\$CI_LOG"
case "$cmd \$*" in "\$CI_FAIL") exit 1 ;; esac
exit 0
EOS
    chmod +x "$3/bin/$cmd"
  done
  exit 0
fi
exit 2
"""


def _run_ci(tmp_path, fail: str = "") -> tuple[int, list[str]]:
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "run").write_text((ROOT / ".ci" / "run").read_text())
    fake = tmp_path / "fakepy"
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "log"
    log.touch()
    env = {**os.environ, "PYTHON": str(fake), "CI_LOG": str(log), "CI_FAIL": fail}
    out = subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run")], env=env, capture_output=True, timeout=60
    )
    return out.returncode, log.read_text().splitlines()


EVERY_STEP = [
    "python -m pip install --quiet --upgrade pip",
    "pip install -e .[plots]",
    "multistart demo --quick --quiet --out",
    "pip install -e .[test]",
    "python -m pytest -q",
    "ruff check .",
    "ruff format --check .",
    "mypy multistart",
    "lint-imports",
    "pip install -e .[docs]",
    "mkdocs build --strict --site-dir",
    "python -m pytest -q -m slow",
    "python -m workspace_tests --quick",
]


@pytest.mark.subprocess
def test_ci_runs_every_step_the_readme_names(tmp_path):
    code, log = _run_ci(tmp_path)
    assert code == 0
    assert len(log) == len(EVERY_STEP)
    for line, step in zip(log, EVERY_STEP, strict=True):
        assert line.startswith(step), (line, step)


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "fail",
    [
        "pip install -e .[plots]",
        "ruff format --check .",
        "mypy multistart",
        "pip install -e .[docs]",
    ],
)
def test_ci_stops_and_fails_at_a_failed_step(tmp_path, fail):
    code, log = _run_ci(tmp_path, fail)
    assert code != 0
    assert log[-1] == fail  # nothing ran after it (the demo did, after a failed install)
