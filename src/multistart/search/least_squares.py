"""The least-squares search a user makes: :class:`MultiStartLeastSquares`, the rule's factory
(:func:`multistart.search.residuals.residual_rule`) and the options, which
:mod:`multistart.search.core` makes into its signature; what it does with residuals is
:mod:`multistart.search.residuals`. ``least_squares.pyi`` states the signature for static tools.
"""

from __future__ import annotations

from .gradient import MultiStartGradient
from .residuals import LeastSquaresSearch, residual_rule

__all__ = ["MultiStartLeastSquares"]


class MultiStartLeastSquares(LeastSquaresSearch, MultiStartGradient, rule=residual_rule):
    """Many least-squares local searches of one residual function, one Jacobian a step each.

    ``fit(residuals, space)`` minimises ``‖residuals(params)‖²`` (a χ² when the residuals are
    ``(model - data) / sigma``); ``fit(graph)`` a :class:`multistart.FactorGraphModel` whose
    factors were made with :meth:`multistart.Factor.from_residuals`. Each start runs its own
    Gauss-Newton-type search; ``result.errors`` are ``scipy.optimize.curve_fit``'s. A step's
    Jacobian counts as ``n`` evaluations for ``n`` parameters, so it pays for few parameters
    and many residuals (``docs/least-squares.md`` has the crossover with L-BFGS). It takes
    every option of :class:`MultiStartGradient` too, keyword-only.

    Args:
      method: ``"lm"`` (Levenberg-Marquardt, the default), ``"dogleg"``, ``"gauss-newton"``
        (:class:`multistart.solvers.LeastSquaresSolver`), or an optimistix least-squares solver
        (``optx.LevenbergMarquardt(rtol, atol)``, ``optx.Dogleg``, ``optx.GaussNewton``, ...:
        ``pip install optimistix``).
      ftol, xtol, gtol: stopping tolerances of the built-in methods, as scipy
        ``least_squares``', relative (default ``eps^(3/4)`` of the float type: ``1.8e-12`` in
        float64; ``0`` turns one off).
      jacobian: ``"auto"`` (forward mode unless there are fewer residuals than parameters),
        ``"forward"`` or ``"reverse"``.
      covariance: ``"gauss-newton"`` (curve_fit's ``(JᵀJ)⁻¹``, the default) or ``"hessian"``
        (the full Hessian of ``‖r‖²``: the Laplace approximation), scaled alike.

    Example:
      >>> import jax.numpy as jnp, numpy as np, multistart as ms
      >>> t = np.linspace(0.0, 5.0, 50)
      >>> y = 3.0 * np.exp(-t / 1.5) + 0.2
      >>> def residuals(p):
      ...     return (p["a"] * jnp.exp(-t / p["tau"]) + p["c"] - y) / 0.1
      >>> space = {"a": ms.Uniform(0.0, 10.0), "tau": ms.LogUniform(0.1, 10.0),
      ...          "c": ms.Uniform(-1.0, 1.0)}
      >>> fit = ms.MultiStartLeastSquares(n_starts=8).fit(residuals, space)  # doctest: +SKIP
      >>> fit.best_params, fit.errors  # doctest: +SKIP
    """
