import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import NoCompile

import multistart as ms
from multistart.model.problem import add_note, as_problem, flat_leaves_without_gradient, tracer_hint

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


# -- messages that point at the fix (issue 35, item 4) ------------------------------------------

DECAY = {"a": ms.Uniform(0.0, 10.0), "tau": ms.LogUniform(0.1, 10.0), "offset": ms.Uniform(-1, 1)}


@pytest.mark.parametrize(
    "key, close",
    [("A", "'a'"), ("tua", "'tau'"), ("ofset", "'offset'"), ("width", None)],
)
def test_a_misspelt_parameter_name_lists_the_space_s_names(key, close):
    def misspelt(p):
        return (p[key] - 1.0) ** 2 + p["tau"] ** 2

    search = ms.MultiStartLBFGS(n_starts=2, batch_size=2, n_steps=5)
    for fit in (
        lambda: search.fit(misspelt, DECAY),
        lambda: ms.laplace(misspelt, DECAY, {"a": 1.0, "tau": 1.0, "offset": 0.0}),
    ):
        with NoCompile(), pytest.raises(KeyError) as info:
            fit()
        (note,) = [n for n in info.value.__notes__ if "is not a parameter" in n]
        # the names in the order the space was written in, and the nearest one
        assert f"{key!r} is not a parameter of the space, whose parameters are 'a', 'tau', " in note
        assert "'offset'" in note and (
            f"did you mean {close}?" in note if close else "mean" not in note
        )


def test_a_key_the_space_has_gets_no_parameter_note():
    space = as_problem(lambda p: p["x"], SPACE).space
    assert tracer_hint(KeyError("x"), space) is None  # a data dict's key, not a misspelling
    assert tracer_hint(KeyError(3), space) is None
    assert "is not a parameter" in tracer_hint(KeyError("z"), space)


def test_a_curve_fit_style_model_is_refused_with_the_call_to_make():
    def decay(x, a, tau):
        return a * jnp.exp(-x / tau)

    search = ms.MultiStartLBFGS(n_starts=2, batch_size=2, n_steps=5)
    with NoCompile(), pytest.raises(TypeError) as info:
        search.fit(decay, DECAY)
    message = str(info.value)
    assert message.startswith("the objective 'decay' takes (x, a, tau), but multistart calls ")
    assert "objective(params) -> scalar" in message
    assert "ms.curve_fit(f, xdata, ydata, p0, sigma), which takes f(x, *params)" in message
    assert "lambda p: jnp.sum(((f(x, p['a'], p['tau']) - ydata) / sigma) ** 2)" in message
    with NoCompile(), pytest.raises(TypeError, match="takes \\(\\), but multistart calls"):
        ms.laplace(lambda: 1.0, DECAY, {"a": 1.0, "tau": 1.0, "offset": 0.0})


def test_a_curve_fit_style_model_given_as_residuals_gets_the_call_to_make():
    # the least-squares search traces its residual function without check_call: the note says it
    def decay(x, a, tau):
        return a * jnp.exp(-x / tau)

    search = ms.MultiStartLeastSquares(n_starts=2, batch_size=2, n_steps=5)
    with NoCompile(), pytest.raises(TypeError, match="missing 2 required positional") as info:
        search.fit(decay, DECAY)
    (note,) = [n for n in info.value.__notes__ if "calls your function" in n]
    assert "one argument, the dict of the space's parameters" in note
    assert "ms.curve_fit(f, xdata, ydata, p0, sigma), which takes f(x, *params)" in note
    assert tracer_hint(TypeError("f() takes 1 positional argument but 2 were given")) is None


@pytest.mark.parametrize(
    "objective",
    [
        lambda p, scale=2.0: scale * (p["x"] ** 2 + p["y"] ** 2),  # a default is fine
        lambda *args: args[0]["x"] ** 2 + args[0]["y"] ** 2,
        jax.jit(lambda p: p["x"] ** 2 + p["y"] ** 2),
        np.frompyfunc(lambda p: p, 1, 1),  # no signature to read: left to the trace
    ],
)
def test_objectives_that_take_the_params_pass_the_call_check(objective):
    from multistart.model.problem import check_call

    check_call(objective, "the objective", "objective(params) -> scalar")


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


# -- a gradient that is zero everywhere, found by tracing (issue 24, items 3 and 6) -------------

GRAD_SPACE = {"x": ms.Uniform(-3.0, 3.0), "y": ms.Uniform(-3.0, 3.0, shape=(2,))}


@jax.custom_vjp
def _square(x):
    return x**2


_square.defvjp(lambda x: (x**2, x), lambda r, g: (2 * r * g,))


def _jitted_inner(p):
    return jax.jit(lambda a, b: a**2 + jnp.round(b).sum())(p["x"], p["y"])


def _swap_twice(p):
    swap = lambda i, c: (c[1], c[0])  # noqa: E731 - after two swaps x is back in front
    return jax.lax.fori_loop(0, 2, swap, (p["x"], jnp.round(p["y"][0])))[0]


@pytest.mark.parametrize(
    "objective, without",
    [
        (lambda p: p["x"] ** 2 + jnp.sum(p["y"] ** 2), []),
        (lambda p: 2.0 * p["x"] + jnp.sum(p["y"]), []),  # a constant gradient is not zero
        (lambda p: jax.lax.cond(p["x"] > 0, lambda: p["x"], lambda: p["y"].sum()), []),
        (lambda p: jnp.where(p["x"] > 0, p["x"], 0.0) + jnp.sum(p["y"] ** 2), []),
        (lambda p: _square(p["x"]) + jnp.sum(p["y"]), []),  # custom_vjp: not traced forward
        (lambda p: jnp.round(p["x"]) ** 2 + jnp.sum(jnp.round(p["y"]) ** 2), ["x", "y"]),
        (lambda p: jnp.argmax(jnp.array([p["x"], p["y"][0]])).astype(jnp.float32), ["x", "y"]),
        (lambda p: 3.0, ["x", "y"]),
        (lambda p: jax.lax.stop_gradient(p["x"]) ** 2 + jnp.sum(p["y"] ** 2), ["x"]),
        (_jitted_inner, ["y"]),  # into an inner jit, exactly
        (_swap_twice, ["y"]),  # a loop mixes its carry: x still reaches the output
    ],
)
def test_parameters_without_a_gradient_are_found_by_tracing(objective, without):
    problem = as_problem(objective, GRAD_SPACE)
    with NoCompile():
        assert flat_leaves_without_gradient(problem, jnp.float32) == without


@pytest.mark.parametrize(
    "objective",
    [
        lambda p: jnp.round(p["x"]) ** 2 + jnp.sum(jnp.round(p["y"]) ** 2),
        lambda p: jnp.argmax(jnp.array([p["x"], p["y"][0], p["y"][1]])).astype(jnp.float32),
        lambda p: 3.0,  # a Python float: it was an AttributeError after the filter compiled
    ],
)
def test_a_gradient_zero_everywhere_is_refused_before_any_compile(objective):
    search = ms.MultiStartAdam(n_starts=4, batch_size=4, n_steps=20)
    with NoCompile(), pytest.raises(ValueError, match="gradient that is zero everywhere"):
        search.fit(objective, GRAD_SPACE)


def test_a_parameter_without_a_gradient_is_named_in_a_warning():
    def only_x(p):
        return (p["x"] - 1.0) ** 2 + 0.0 * jnp.sum(jnp.round(p["y"]))

    search = ms.MultiStartAdam(n_starts=4, batch_size=4, n_steps=20, seed=0)
    with pytest.warns(RuntimeWarning, match="zero everywhere along y: none of them"):
        result = search.fit(only_x, GRAD_SPACE)
    np.testing.assert_array_equal(result.params["y"], result.start_params["y"])
