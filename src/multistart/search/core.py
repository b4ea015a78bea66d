"""What every search class is: a rule and a checked configuration, fixed once made.

A search class names its rule, a factory of the rule's own hyperparameters
(:mod:`multistart.search.rules`), and takes every option of :class:`multistart.SearchConfig`:
its signature is the factory's parameters and then the options, made when the class is
(:meth:`Search.__init_subclass__`) from those two declarations, so an option is declared once,
as the configuration's field. ``gradient.pyi`` and ``least_squares.pyi`` state the same
signatures for static tools; ``tests/api_snapshot.py`` writes them and the suite checks them
against the classes. :meth:`Search.fit` hands the search to :mod:`multistart.host.driver`.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from ..host import driver
from ..host.config import (
    DEFAULT_STEPS,
    ORDER,
    SearchConfig,
    parameters,
    resolve_absolute_sigma,
    unknown_options,
)
from ..result import Result
from ..solvers import LBFGS, LeastSquaresRule, Solver
from ..solvers.convergence import Convergence

if TYPE_CHECKING:
    from typing_extensions import Self  # typing's from Python 3.11

__all__ = ["Search"]


class Search:
    """A rule and a checked configuration: the base of every search class.

    ``class MultiStartAdam(MultiStartGradient, rule=rules.adam)`` makes a search class whose
    constructor takes ``adam``'s parameters and every option (keyword-only), builds the rule
    and the :class:`multistart.SearchConfig`, and keeps both.
    """

    #: The rule's factory: its parameters open the class's signature.
    _rule: ClassVar[Callable[..., Solver]]
    #: The rule every start steps with.
    solver: Solver
    #: The checked options (frozen); each reads as the search's attribute too.
    options: SearchConfig
    #: What :meth:`replace` calls the class with: the arguments, defaults applied.
    _made_with: tuple[tuple, dict[str, Any]]

    def __init_subclass__(cls, *, rule: Callable[..., Solver] | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if rule is None:  # a base of search classes (least squares'), not one
            return
        cls._rule = staticmethod(rule)
        own = list(inspect.signature(rule).parameters.values())
        positional = any(p.kind is p.POSITIONAL_ONLY for p in own)
        kind = (
            inspect.Parameter.POSITIONAL_ONLY
            if positional
            else inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        signature = inspect.Signature([inspect.Parameter("self", kind), *own, *parameters()])

        def __init__(self, *args, **kwargs):
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError as e:  # Python's words, with the class and the nearest option
                raise TypeError(_call_error(type(self), e, kwargs)) from None
            self._make(bound)

        __init__.__signature__ = signature  # type: ignore[attr-defined]
        __init__.__qualname__ = f"{cls.__qualname__}.__init__"
        __init__.__module__ = cls.__module__
        setattr(cls, "__init__", __init__)  # noqa: B010 - a class's own constructor, made here

    def _make(self, bound: inspect.BoundArguments) -> None:
        """Build the rule from its own arguments and the configuration from the options."""
        bound.apply_defaults()
        arguments = bound.arguments
        options = {name: arguments[name] for name in ORDER}
        own = inspect.signature(self._rule).parameters.values()
        positional = [arguments[p.name] for p in own if p.kind is p.POSITIONAL_ONLY]
        keyword = {p.name: arguments[p.name] for p in own if p.kind is not p.POSITIONAL_ONLY}
        solver = self._rule(*positional, **keyword)
        _resolve_auto(solver, options)
        config = SearchConfig(**options)
        object.__setattr__(self, "solver", solver)
        object.__setattr__(self, "options", config)
        object.__setattr__(self, "_made_with", (bound.args[1:], bound.kwargs))
        for name in ORDER:
            object.__setattr__(self, name, getattr(config, name))

    def __setattr__(self, name: str, value) -> None:
        hint = f"; use search.replace({name}={value!r}) for a search with another {name}"
        known = name in inspect.signature(type(self)).parameters
        raise AttributeError(f"a search is fixed once it is made{hint if known else ''}")

    def left_auto(self, name: str) -> bool:
        """Whether the rule's hyperparameter ``name`` defaults to ``"auto"`` and was not given
        otherwise: the fit resolves it for its problem when it starts (L-BFGS's
        ``diagonal``, :func:`multistart.host.driver.diagonal_for`)."""
        own = inspect.signature(self._rule).parameters.get(name)
        if own is None or own.default != "auto":
            return False
        return self._made_with[1].get(name, "auto") == "auto"

    def replace(self, **changes) -> Self:
        """A search of the same kind and rule with some options (or hyperparameters) changed.

        Options whose default depends on others (``n_candidates``, ``n_local``, ...) are
        derived again unless given.

        >>> import multistart as ms
        >>> ms.MultiStartAdam(n_starts=8).replace(n_starts=16).options.n_candidates
        160
        """
        args, kwargs = self._made_with
        unknown_options(changes, type(self))
        return type(self)(*args, **{**kwargs, **changes})

    def __repr__(self) -> str:
        options = self.options
        return (
            f"{type(self).__name__}(n_starts={options.n_starts}, "
            f"batch_size={options.batch_size!r}, n_steps={options.n_steps}, seed={options.seed})"
        )

    def config(self) -> dict[str, Any]:
        """The configuration as plain values (recorded in the Result)."""
        return {
            "search": type(self).__name__,
            "rule": self.solver.name,
            **self.options.record(),
            "hyperparameters": self.solver.hyperparameters(),
        }

    def fit(self, objective, space=None, *, starts=None, resume: bool = False, part=None) -> Result:
        """Minimise ``objective(params) -> scalar`` over ``space``, or fit a model.

        Args:
          objective: a callable of the physical params pytree returning a real scalar, or a
            :class:`multistart.FactorGraphModel` (then ``space`` is omitted).
          space: a (nested) dict of priors.
          starts: your own starts, used as given in the first slots: a params pytree whose
            leaves have a leading axis of ``k <= n_starts`` starts, or a list of ``k`` params
            dicts. The other ``n_starts - k`` slots are drawn (and filtered) as usual.
          resume: continue from the newest checkpoint in ``checkpoint_dir`` (a fresh start
            when there is none); one of another model or configuration is refused.
          part: ``(i, k)``: run only the ``i``-th (from 0) of ``k`` contiguous blocks of slots
            (as ``np.array_split``) of the whole run's start plan, each start's record the
            whole run's; :meth:`multistart.Result.merge` joins the parts. Not with
            ``resurrect``, ``start_strategy="tiktak"``, ``target_fom`` or ``max_evals``.

        Returns:
          A :class:`multistart.Result` (with ``part``, the part's starts only).

        Raises:
          TypeError / ValueError: bad arguments (a user start outside its prior's bounds is
            named by index and parameter), or an objective that does not return a real
            scalar; raised after one trace and before any compile.
          multistart.NoFiniteStartsError: the filter found no candidate with a finite figure
            of merit (and no user start was given); the message names the region tried.
          multistart.SearchInterrupted: Ctrl-C or SIGTERM stopped the search; it carries the
            partial result (``.result``) and, with ``checkpoint_dir``, a checkpoint was written.
          multistart.CheckpointError: a checkpoint could not be written (``.result`` holds the
            search so far; the previous checkpoint is intact) or none could be read.
        """
        return driver.run(self, objective, space, starts=starts, resume=resume, part=part)


def _call_error(cls: type, error: TypeError, given: dict[str, Any]) -> str:
    """``error`` (``Signature.bind``'s) naming ``cls``, and the option nearest a misspelt one."""
    known = list(inspect.signature(cls).parameters)
    unknown = [k for k in given if k not in known]
    near = difflib.get_close_matches(unknown[0], known, n=1) if unknown else []
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    keyword_only = " (every option is keyword-only)" if "positional" in str(error) else ""
    return f"{cls.__name__}(): {error}{hint}{keyword_only}"


def _is_auto(value) -> bool:
    return isinstance(value, str) and value == "auto"


def _resolve_auto(solver: Solver, options: dict) -> None:
    """The options whose default depends on the rule, resolved in ``options``.

    ``convergence``: no window guard where the rule has optimality tests of its own.
    ``start_strategy``: TikTak for the least-squares rules (where it can run), whose local
    searches are short and end by their own tests (``profiling/README.md``); for L-BFGS the
    band's starts, refilled as TikTak's while the local searches are short (``"band_tiktak"``:
    its first wave is the band's, and a fit whose local searches are long runs as the band's);
    the band for the others, whose local searches can be long.
    """
    if _is_auto(options["convergence"]):
        options["convergence"] = None if solver.tests_convergence else Convergence()
    if _is_auto(options["start_strategy"]):
        can = options["n_candidates"] != 0 and not options["resurrect"]
        if can and isinstance(solver, LeastSquaresRule):
            options["start_strategy"] = "tiktak"
        elif can and isinstance(solver, LBFGS):
            options["start_strategy"] = "band_tiktak"
        else:
            options["start_strategy"] = "band"
    if _is_auto(options["n_steps"]) and not isinstance(solver, LBFGS):
        options["n_steps"] = DEFAULT_STEPS  # L-BFGS's is sized by the problem when it is fitted
    options["absolute_sigma"] = resolve_absolute_sigma(
        options["absolute_sigma"],
        least_squares=isinstance(solver, LeastSquaresRule),
        n_data=options["n_data"],
    )
