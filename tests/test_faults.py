"""The newcomer's probe: faults a search survives and bad inputs it refuses (docs/faults.md).

Each test here is one row of the table in docs/faults.md: the fault or input, and what the
user sees (a clear error before any compile, a warning with a correct result, or the right
result). Checks of one module's own behaviour live with that module's tests; the table names
them too.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

_DAMAGED_NEWEST = textwrap.dedent(
    r"""
    import glob, os, sys
    import jax.numpy as jnp
    import numpy as np
    import multistart as ms

    folder = sys.argv[1]
    space = {"x": ms.Uniform(-3.0, 3.0), "y": ms.Uniform(-3.0, 3.0)}

    def f(p):
        return (p["x"] - 1) ** 2 + (p["y"] + 0.5) ** 2 + 0.1 * jnp.sin(5 * p["x"])

    def search(n_steps, **kw):
        return ms.MultiStartAdam(
            n_starts=4, batch_size=4, n_steps=n_steps, seed=0, convergence=None, **kw
        )

    kw = dict(checkpoint_dir=folder, checkpoint_every=20)
    search(60, **kw).fit(f, space)
    for name in glob.glob(os.path.join(folder, "60", "**"), recursive=True):
        if os.path.isfile(name):  # every file of the newest step cut to a third
            with open(name, "r+b") as fh:
                fh.truncate(os.path.getsize(name) // 3)
    resumed = search(80, **kw).fit(f, space, resume=True)
    whole = search(80).fit(f, space)
    assert resumed.stats["resumed_from"] == 40, resumed.stats
    np.testing.assert_array_equal(resumed.foms, whole.foms)
    np.testing.assert_array_equal(resumed.history, whole.history)
    print("resumed from 40, as an uninterrupted run")
    """
)


@pytest.mark.subprocess
def test_a_damaged_newest_checkpoint_falls_back_and_the_search_goes_on(tmp_path):
    # Item 1 of issue 24: the fallback then died rewriting the damaged step
    # (StepAlreadyExistsError), and absl printed "ERROR:absl:Failed to json parse" lines.
    # Item 12: once orbax (absl) was imported, lines lost their timestamps.
    script = tmp_path / "child.py"
    script.write_text(_DAMAGED_NEWEST)
    env = {**os.environ, "MULTISTART_LOG_LEVEL": "INFO"}
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ck")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from 40, as an uninterrupted run" in out.stdout
    assert (tmp_path / "ck" / "damaged" / "60").is_dir()
    lines = out.stderr.splitlines()
    assert not [ln for ln in lines if "absl" in ln], out.stderr
    ours = [ln for ln in lines if "multistart" in ln]
    assert any("checkpoint of step 60 is unreadable" in ln for ln in ours)
    assert any("moved the damaged checkpoint of step 60" in ln for ln in ours)
    stamped = re.compile(r"^\d\d:\d\d:\d\d multistart ")
    assert ours and all(stamped.match(ln) for ln in ours), out.stderr
    # A second handler prints every line twice in a row (two fits may log one line alike).
    assert all(a != b for a, b in zip(ours, ours[1:], strict=False)), "a line printed twice"


def test_a_rule_that_ascends_says_so():
    # Item 5: MultiStartGradient(optax.sgd(-0.1)) reported "converged" and a minimum per start.
    import jax.numpy as jnp
    import optax

    import multistart as ms

    space = {"x": ms.Uniform(-3.0, 3.0), "y": ms.Uniform(-3.0, 3.0)}
    search = ms.MultiStartGradient(optax.sgd(-0.1), n_starts=4, batch_size=4, n_steps=30, seed=0)
    with pytest.warns(RuntimeWarning, match="no start improved on its first value"):
        search.fit(lambda p: (p["x"] - 1) ** 2 + jnp.sin(p["y"]), space)
