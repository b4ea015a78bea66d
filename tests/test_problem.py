import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import NoCompile

import multistart as ms
from multistart.problem import add_note, tracer_hint

SPACE = {"x": ms.Uniform(-1.0, 1.0), "y": ms.Uniform(-1.0, 1.0)}


def python_if(p):
    if p["x"] > 0:
        return p["x"] ** 2
    return p["y"] ** 2


def numpy_exp(p):
    return np.exp(p["x"]) + p["y"] ** 2


def python_float(p):
    return jnp.asarray(float(p["x"]) ** 2)


@pytest.mark.parametrize(
    "objective, error, hint",
    [
        (python_if, jax.errors.TracerBoolConversionError, "jnp.where"),
        (numpy_exp, jax.errors.TracerArrayConversionError, "jnp.exp"),
        (python_float, jax.errors.ConcretizationTypeError, "jax.numpy functions"),
    ],
)
def test_tracer_errors_keep_their_type_and_get_a_hint(objective, error, hint):
    search = ms.MultiStartAdam(n_starts=2, n_steps=5)
    with NoCompile(), pytest.raises(error) as info:
        search.fit(objective, SPACE)
    notes = info.value.__notes__
    assert any(hint in n for n in notes), notes
    assert any(f"raised while tracing {objective.__name__!r}" in n for n in notes)
    with pytest.raises(error) as info:  # the same for a point's errors
        ms.laplace(objective, SPACE, {"x": 0.5, "y": 0.5})
    assert any(hint in n for n in info.value.__notes__)


def test_other_errors_get_no_hint():
    assert tracer_hint(KeyError("x")) is None
    assert tracer_hint(TypeError("x")) is None


def test_add_note_falls_back_to_the_message_without_notes():
    class NoNotes(ValueError):  # what Python 3.10 exceptions look like
        def __getattribute__(self, name):
            if name == "add_note":
                raise AttributeError(name)
            return super().__getattribute__(name)

    e = NoNotes("bad input")
    add_note(e, "use jnp")
    assert str(e) == "bad input\nuse jnp"
    e = ValueError("bad input")
    add_note(e, "use jnp")
    assert str(e) == "bad input" and e.__notes__ == ["use jnp"]
