"""The compile options of the library's programs (multistart.common.xla)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import multistart as ms
from multistart.common import xla
from multistart.common.monitor import CompileCounter


@pytest.fixture
def no_user_flags(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)


def test_on_a_cpu_the_options_are_the_elemental_emitters(no_user_flags):
    assert jax.default_backend() == "cpu"
    assert xla.options() == {"xla_cpu_use_fusion_emitters": False}
    assert xla.options("cpu") == xla.OPTIONS


def test_no_option_is_set_off_a_cpu_or_where_the_users_flags_name_it(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert xla.options("gpu") is None and xla.options("tpu") is None
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=true")
    assert xla.options() is None
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert xla.options() == xla.OPTIONS


def test_a_jaxlib_that_refuses_the_option_gets_none_and_still_compiles(monkeypatch, no_user_flags):
    """A later XLA may drop the option: a release not known to take it is probed, its refusal
    sets nothing, and a program compiles and runs without it."""
    monkeypatch.setattr(xla, "OPTIONS", {"xla_cpu_no_such_option_for_this_test": False})
    monkeypatch.setattr(xla, "KNOWN_TO_ACCEPT", set())
    xla._accepted.cache_clear()
    try:
        assert xla.options() is None
        jitted = xla.jit(lambda v: jnp.sum(v**2))
        assert float(jitted(jnp.arange(3.0))) == 5.0
    finally:
        monkeypatch.undo()
        xla._accepted.cache_clear()  # the real options' answer, for the tests after this one
    assert xla.options() == xla.OPTIONS


def test_the_probe_is_not_counted_as_a_program_of_a_fit(no_user_flags):
    with CompileCounter() as compiles:
        assert xla._probe()
        jax.jit(lambda v: v + 1.0)(np.float32(1.0))
    assert xla.PROBE_NAME not in " ".join(compiles.counts)
    assert compiles.total == 1


def test_a_release_known_to_take_the_option_is_not_probed(monkeypatch):
    assert xla._release("0.10.2") == (0, 10) and xla._release("dev") == ()
    monkeypatch.setattr(xla, "_probe", lambda: pytest.fail("probed a known release"))
    monkeypatch.setattr(xla.jaxlib, "__version__", "0.10.7")
    xla._accepted.cache_clear()
    try:
        assert xla._accepted()
    finally:
        monkeypatch.undo()
        xla._accepted.cache_clear()


def test_every_program_a_fit_compiles_is_jitted_with_the_options(monkeypatch, no_user_flags):
    """The chunk step, the filter, the physical map, curve_fit's covariance and the Result's
    curvature all go through xla.jit with the options (a spy on jax.jit inside xla.jit)."""
    seen: dict[str, object] = {}
    real = jax.jit

    def spy(fn, **kwargs):
        seen[getattr(fn, "__name__", "?")] = kwargs.get("compiler_options")
        return real(fn, **kwargs)

    monkeypatch.setattr(xla.jax, "jit", spy)
    x = np.linspace(0.0, 1.0, 20)
    ms.curve_fit(
        lambda x, a, b: a * x + b, x, np.stack([2 * x + 1, 3 * x - 1]), p0=[1.0, 0.0],
        bounds=([0.0, -5.0], [5.0, 5.0]), batched=True, n_starts=1, log_every=0,
    )  # fmt: skip
    result = ms.MultiStartAdam(n_starts=4, n_steps=3, batch_size=4, seed=0, log_every=0).fit(
        lambda p: (p["x"] - 0.5) ** 2, {"x": ms.Uniform(-2.0, 2.0)}
    )
    assert np.isfinite(result.errors["x"])
    programs = (
        "multistart_chunk_step",
        "multistart_filter_chunk",
        "to_physical",
        "multistart_curvature",
        "curvature",
    )
    assert {name: seen.get(name) for name in programs} == dict.fromkeys(programs, xla.OPTIONS)


def test_the_counter_skips_the_probe_by_the_name_xla_gives_it():
    from multistart.common import monitor

    assert monitor._NOT_COUNTED == xla.PROBE_NAME
