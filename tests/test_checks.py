import optax
import pytest
from conftest import NoCompile

import multistart as ms
from multistart.common import checks

RULES = [ms.MultiStartAdam, ms.MultiStartProdigy, ms.MultiStartADABelief, ms.MultiStartLion]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("lr", [-0.1, 0.0, float("nan"), float("inf"), "0.1", True])
def test_a_learning_rate_must_be_positive(rule, lr):
    with NoCompile(), pytest.raises(ValueError, match="learning_rate must be"):
        rule(learning_rate=lr)


@pytest.mark.parametrize("rule", [ms.MultiStartAdam, ms.MultiStartADABelief, ms.MultiStartLion])
@pytest.mark.parametrize("name", ["b1", "b2"])
@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_decay_rates_must_be_in_the_unit_interval(rule, name, value):
    with NoCompile(), pytest.raises(ValueError, match=rf"{name} must be in \[0, 1\)"):
        rule(**{name: value})


@pytest.mark.parametrize(
    "betas, match",
    [((0.9, 1.0), r"betas\[1\] must be in \[0, 1\)"), ((-0.1, 0.9), r"betas\[0\]"), (0.9, "seq")],
)
def test_prodigy_betas(betas, match):
    with NoCompile(), pytest.raises(ValueError, match=match):
        ms.MultiStartProdigy(betas=betas)


def test_adam_eps_and_good_values():
    with NoCompile(), pytest.raises(ValueError, match="eps must be >= 0"):
        ms.MultiStartAdam(eps=-1e-8)
    with NoCompile():
        ms.MultiStartAdam(learning_rate=1e-3, b1=0.0, b2=0.5, eps=0.0)
        ms.MultiStartAdam(learning_rate=optax.linear_schedule(0.1, 0.01, 100))  # a schedule
        ms.MultiStartProdigy(betas=[0.8, 0.99])


def test_checks_return_the_value_unchanged():
    assert checks.positive(3, "n") == 3
    assert checks.non_negative(0.0, "eps") == 0.0
    assert checks.in_unit_interval(0.0, "b1") == 0.0
    with pytest.raises(ValueError, match="learning_rate must be a real number"):
        checks.positive(lambda t: 0.1, "learning_rate")  # callables only with schedule=True
