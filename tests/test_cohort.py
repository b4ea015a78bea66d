"""A cohort's fit as a user reads it: L-BFGS's steps sized by the parameters, and an
end-of-search line that says when no start converged."""

import logging

import jax.numpy as jnp

import multistart as ms
from multistart.host.config import steps_for


def test_lbfgs_steps_are_sized_by_the_parameters_when_the_fit_starts(x64):
    assert [steps_for(n) for n in (1, 500, 501, 3005, 7500, 9005)] == [
        1000,
        1000,
        1002,
        6010,
        15000,
        15000,
    ]
    search = ms.MultiStartLBFGS(n_starts=2)
    assert search.n_steps == "auto" and ms.MultiStartAdam().n_steps == 1000

    def bowl(p):
        return jnp.sum((p["x"] - 0.5) ** 2)

    for n, steps in ((3, 1000), (600, 1200)):
        result = search.fit(bowl, {"x": ms.Uniform(-1.0, 1.0, shape=(n,))})
        assert result.config["n_steps"] == steps
    assert ms.MultiStartLBFGS(n_steps=7).n_steps == 7


def test_the_end_of_search_line_says_no_start_converged(caplog, monkeypatch):
    def bowl(p):
        return jnp.sum((p["x"] - 0.5) ** 2)

    space = {"x": ms.Uniform(-1.0, 1.0, shape=(3,))}
    monkeypatch.setenv("MULTISTART_LOG_LEVEL", "INFO")
    with caplog.at_level(logging.INFO, logger="multistart"):
        ms.MultiStartLBFGS(n_starts=3, n_steps=2, n_candidates=0, log_every=0).fit(bowl, space)
        ms.MultiStartLBFGS(n_starts=3, n_steps=200, n_candidates=0, log_every=0).fit(bowl, space)
    short, long = [r.getMessage() for r in caplog.records if r.getMessage().startswith("done")]
    assert "no start converged" in short and "max_steps 3" in short
    assert "distinct minim" not in short
    assert "1 distinct minimum" in long and "no start converged" not in long
