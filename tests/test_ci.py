"""`.ci/run` fails when any of its steps fails, and runs every step the README names.

It runs here against stand-ins: a Python whose `-m venv` makes a folder of commands that log
their arguments and succeed, except the one a test makes fail. So what is checked is the
script's control flow (issue 24, item 17: under `set -e` a failure on the left of `&&` did not
stop it, and a failed install skipped the demo with CI still green), not the commands.
"""

import os
import re
import shlex
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


# .ci/run's own bootstrap of its fresh virtual environment: not a command the README names
BOOTSTRAP = ["python -m pip install --quiet --upgrade pip"]


def readme_commands() -> list[list[str]]:
    """The commands the README asks of a user and a contributor, each split into words: the
    lines of the quick start's bash block (``a && b`` is two commands, ``# ...`` a comment) and
    the code spans of the "Contributing:" paragraph before it names CI."""
    text = (ROOT / "README.md").read_text()
    quick = text[text.index("## Quick start") :]
    block = re.search(r"```bash\n(.*?)```", quick, flags=re.S)
    assert block, "README: the quick start's bash block"
    commands = []
    for line in block.group(1).splitlines():
        for part in line.split("#")[0].split("&&"):
            if part.strip():
                commands.append(shlex.split(part))
    contributing = text[text.index("Contributing:") :]
    contributing = contributing[: contributing.index("CI (")]
    for span in re.findall(r"`([^`]+)`", contributing):
        commands.append(shlex.split(" ".join(span.split())))
    return [c for i, c in enumerate(commands) if c not in commands[:i]]


def _names(line: str, commands: list[list[str]]) -> list[str] | None:
    """The longest README command that ``line`` (a command .ci/run ran) starts with; ``None``
    when it runs none (extra words are allowed: the demo runs with ``--quick``)."""
    words = shlex.split(line)
    named = [c for c in commands if words[: len(c)] == c]
    return max(named, key=len) if named else None


@pytest.mark.subprocess
def test_ci_runs_every_step_the_readme_names(tmp_path):
    commands = readme_commands()
    assert ["mypy", "src/multistart"] in commands and ["multistart", "demo"] in commands
    code, log = _run_ci(tmp_path)
    assert code == 0
    steps = [line for line in log if line not in BOOTSTRAP]
    ran = [_names(line, commands) for line in steps]
    unnamed = [line for line, named in zip(steps, ran, strict=True) if named is None]
    assert not unnamed, f"commands .ci/run runs that the README does not name: {unnamed}"
    missing = [" ".join(c) for c in commands if c not in ran]
    assert not missing, f"commands the README names that .ci/run does not run: {missing}"


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "fail", ["pip install -e .[plots]", "ruff format --check .", "mypy src/multistart"]
)
def test_ci_stops_and_fails_at_a_failed_step(tmp_path, fail):
    code, log = _run_ci(tmp_path, fail)
    assert code != 0
    assert log[-1] == fail  # nothing ran after it (the demo did, after a failed install)
