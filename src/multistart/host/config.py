"""A search's configuration: every option stated once, with its type, default and check.

:class:`SearchConfig` is the one object everything reads a search's settings from. It is built
(and checked) by the search's constructor, with the defaults that depend on other options
resolved, so it always says what the search will do. Its options are declared in small typed
groups (:class:`Starts`, :class:`TikTak`, :class:`Stopping`, :class:`Execution`,
:class:`Uncertainty`, :class:`Output`), each with the checks of its own fields; the
configuration is all of them, and checks what couples them. A function that needs one group
takes that group's type.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import inspect
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..common import checks
from ..common.log import configure as configure_logging
from ..device.distributed import check_devices
from ..solvers.convergence import Convergence
from ..starts.strategies import check_band, check_max_candidates, check_strategy
from .schedule import Halving, Schedule, check_schedule

__all__ = ["SearchConfig", "OnResume", "option", "parameters", "unknown_options"]
__all__ += ["Starts", "TikTak", "Stopping", "Execution", "Uncertainty", "Output", "Coupling"]
__all__ += [
    "ORDER",
    "ordered_fields",
    "resolve_absolute_sigma",
    "check_batch_size",
    "check_dtype",
    "require_orbax",
]
__all__ += ["BATCH_SIZE_HELP", "DEFAULT_STEPS", "steps_for"]

CANDIDATES_PER_START = 10
# start_strategy="band_tiktak" (L-BFGS's default) draws this many candidates a slot instead:
# its BAND_TIKTAK_CYCLES rounds of local searches each start from a candidate of their own
# (issue 41; profiling/HISTORY.md)
BAND_TIKTAK_CANDIDATES_PER_START = 15
DEFAULT_FILTER_BATCH_SIZE = 64
TIKTAK_LOCAL_PER_START = 4  # TikTak's default n_local: this many local searches per slot
# start_strategy="band_tiktak" (L-BFGS's default) runs up to this many of TikTak's weight
# schedules of TIKTAK_LOCAL_PER_START x n_starts local searches, one after another (n_local's
# default): a search whose best keeps moving (many minima) gets another round of blends from
# far to near it; one that re-finds its best ends by max_discoveries as before (issue 41)
BAND_TIKTAK_CYCLES = 3
# TikTak's default max_discoveries: its best re-found this often, no new local search starts
# (issue 41: 81 of 81 NIST fits over 3 seeds at 0.44x the median evaluations without it;
# profiling/HISTORY.md)
TIKTAK_DISCOVERIES = 4
BACKEND_NAMES = ("loop", "scan")
DEFAULT_CONVERGENCE = Convergence()


class OnResume(enum.Enum):
    """How an option may differ between a checkpoint and the search resuming from it."""

    #: It shapes the trajectories: a checkpoint written with another value is refused.
    FIXED = "fixed"
    #: It only decides when the search stops, how wide its chunks are or what it shows: a
    #: resumed search may change it.
    FREE = "free"
    #: ``n_steps``: it may grow (the search runs on), not shrink.
    GROWS = "grows"


BATCH_SIZE_HELP = "batch_size must be a positive int, None, 'auto' or 'tune'"
_BATCH_SIZE_WORDS = ("auto", "tune")


def check_batch_size(batch_size):
    """Validate ``batch_size``: ``None``, a positive int, ``"auto"`` or ``"tune"``.

    Raises:
      ValueError: anything else, naming ``batch_size`` and the options.
    """
    if batch_size is None or (isinstance(batch_size, str) and batch_size in _BATCH_SIZE_WORDS):
        return batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
        raise ValueError(f"{BATCH_SIZE_HELP}; got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"{BATCH_SIZE_HELP}; got {batch_size!r}")
    return int(batch_size)


def require_orbax():
    """Import orbax.checkpoint, or explain how to install it (``checkpoint_dir``'s check)."""
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "checkpoint_dir needs orbax-checkpoint: pip install 'multistart[checkpoint]'"
        ) from e
    configure_logging()  # absl, imported with orbax, may have just given the root logger a handler
    return ocp


#: ``n_steps="auto"``: L-BFGS's steps to converge grew with the parameters on the cohort of
#: ``profiling/cohort.py`` (4,010 at 3,005 parameters, 5,389 at 9,005; docs/profiling.md,
#: "Cohorts"): twice the parameters covers them, between today's 1,000 and scipy's maxfun.
STEPS_PER_PARAMETER = 2
STEPS_AT_LEAST, STEPS_AT_MOST = 1000, 15_000
DEFAULT_STEPS = STEPS_AT_LEAST  # n_steps="auto" of every rule but L-BFGS


def steps_for(n_dims: int) -> int:
    """``n_steps="auto"`` for ``n_dims`` free parameters.

    >>> steps_for(10), steps_for(3005), steps_for(9005)
    (1000, 6010, 15000)
    """
    return max(STEPS_AT_LEAST, min(STEPS_AT_MOST, STEPS_PER_PARAMETER * int(n_dims)))


def option(
    default,
    *,
    on_resume: OnResume = OnResume.FIXED,
    recorded: bool = True,
    program: bool = True,
):
    """A field of :class:`SearchConfig`: an option of every search, its type the field's. Its
    doc is its entry in :class:`multistart.MultiStartGradient`'s docstring, where users read it
    (the suite checks that every option has one).

    Args:
      default: the default value.
      on_resume: see :class:`OnResume`.
      recorded: is it part of :meth:`SearchConfig.record` (the Result's ``config`` and the
        checkpoint identity)? Where a search runs and where it writes are not.
      program: may the compiled programs depend on it? Then it is part of the program cache's
        key (:meth:`SearchConfig.program_key`). A field is unless it says otherwise, so one
        added and forgotten costs a compile, never a stale program.
    """
    meta = {"on_resume": on_resume, "rec": recorded, "program": program}
    return field(default=default, metadata=meta)


def _check_real(value, name: str, *, finite=False, positive=False) -> float | None:
    """``None``, or a real number (finite / positive as asked), as a float."""
    if value is None:
        return None
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real)
    ok = ok and (value == value) and (not finite or abs(value) != float("inf"))
    ok = ok and (not positive or value > 0)
    if not ok:
        kind = "a positive number" if positive else "a finite number"
        raise ValueError(f"{name} must be None or {kind}; got {value!r}")
    return float(value)


def _optional_int(value, name: str, minimum: int) -> int | None:
    return None if value is None else checks.integer(value, name, minimum)


#: The options in the order the searches' signatures and docstrings list them (checked below
#: to be exactly :class:`SearchConfig`'s fields; the suite checks the docstring's order).
ORDER = (
    "n_starts",
    "batch_size",
    "backend",
    "n_steps",
    "seed",
    "convergence",
    "max_nonfinite",
    "schedule",
    "start_band",
    "start_strategy",
    "n_candidates",
    "max_candidates",
    "filter_batch_size",
    "resurrect",
    "n_local",
    "local_steps",
    "max_discoveries",
    "target_fom",
    "max_evals",
    "max_time_s",
    "rediscoveries",
    "sync_every",
    "steps_per_call",
    "flat",
    "absolute_sigma",
    "n_data",
    "max_history",
    "log_every",
    "progress",
    "checkpoint_dir",
    "checkpoint_every",
    "devices",
    "dtype",
)


def resolve_absolute_sigma(given, *, least_squares: bool | None, n_data) -> bool | None:
    """``absolute_sigma`` resolved: the one place its default and its checks live.

    ``given`` is the option (``True``, ``False`` or ``None``); ``least_squares`` says whether
    the rule fits residuals (``None``: not known, a configuration made without its rule, where
    ``None`` stays ``None``). ``None`` is ``False`` for the least-squares rules (curve_fit's
    default) and ``True`` for the others. ``n_data`` is what a scalar figure of merit needs for
    its reduced χ²; a least-squares fit counts its residuals and takes none.

    Raises:
      TypeError: ``given`` is not ``True``, ``False`` or ``None``.
      ValueError: ``n_data`` with a least-squares rule, or ``absolute_sigma=False`` for a
        scalar figure of merit without ``n_data``.
    """
    if given is not None and not isinstance(given, bool):
        raise TypeError(f"absolute_sigma must be True, False or None; got {given!r}")
    if least_squares is None:
        return given
    if least_squares and n_data is not None:
        raise ValueError(
            "n_data applies to a scalar figure of merit: a least-squares fit counts its "
            "residuals; drop n_data"
        )
    absolute = (not least_squares) if given is None else given
    if not absolute and not least_squares and n_data is None:
        raise ValueError(
            "absolute_sigma=False scales the covariance by the reduced chi-squared "
            "f / (n_data - n): give n_data, the number of data points behind the objective"
        )
    return absolute


@dataclass(frozen=True, kw_only=True)
class _Group:
    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)  # normalising a frozen instance's own field

    def _integers(self, **minimum: int) -> None:
        for name, least in minimum.items():
            self._set(name, checks.integer(getattr(self, name), name, least))


@dataclass(frozen=True, kw_only=True)
class Starts(_Group):
    """Where the local searches start: how many, drawn how, filtered, and replaced."""

    n_starts: int = option(32)
    seed: int = option(0, program=False)
    start_band: tuple[float, float] = option((0.15, 0.85), program=False)
    start_strategy: str = option("auto", program=False)
    n_candidates: int | None = option(None, program=False)
    max_candidates: int | None = option(None, program=False)
    filter_batch_size: int | None = option(None, program=False)
    resurrect: int = option(0)

    def __post_init__(self):
        self._check_starts()

    def _check_starts(self) -> None:
        self._integers(n_starts=1, seed=0, resurrect=0)
        self._set("start_band", check_band(self.start_band))
        if self.start_strategy == "auto":  # a configuration made without its rule: the band
            self._set("start_strategy", "band")
        self._set("start_strategy", check_strategy(self.start_strategy))
        n, given = self.n_starts, self.n_candidates
        if given is None:
            given = self._candidates_per_start * n
        elif (
            isinstance(given, bool)
            or not isinstance(given, numbers.Integral)
            or (given != 0 and given < n)
        ):
            raise ValueError(
                f"n_candidates must be None ({self._candidates_per_start} x n_starts), 0 (no "
                f"filter) or an int >= n_starts ({n}); got {given!r}"
            )
        self._set("n_candidates", int(given))
        self._set("max_candidates", check_max_candidates(self.max_candidates, int(given), n))
        if self.filter_batch_size is not None and self.n_candidates == 0:
            raise ValueError(
                "filter_batch_size has no effect with n_candidates=0 (no filter); drop one"
            )
        width = self.filter_batch_size
        width = DEFAULT_FILTER_BATCH_SIZE if width is None else width
        self._set("filter_batch_size", checks.integer(width, "filter_batch_size", 1))

    @property
    def tiktak(self) -> bool:
        return self.start_strategy in ("tiktak", "band_tiktak")

    @property
    def _candidates_per_start(self) -> int:
        """``n_candidates``'s default, a slot: more under ``"band_tiktak"``, whose rounds of
        local searches each take a candidate."""
        if self.start_strategy == "band_tiktak":
            return BAND_TIKTAK_CANDIDATES_PER_START
        return CANDIDATES_PER_START


@dataclass(frozen=True, kw_only=True)
class TikTak(_Group):
    """TikTak's own options (``start_strategy="tiktak"``; checked with the starts by
    :class:`SearchConfig`)."""

    n_local: int | None = option(None, program=False)
    local_steps: int | None = option(None)
    max_discoveries: int | str | None = option("auto", on_resume=OnResume.FREE, program=False)


@dataclass(frozen=True, kw_only=True)
class Stopping(_Group):
    """When a start, and the search, ends."""

    n_steps: int | str = option("auto", on_resume=OnResume.GROWS)
    convergence: Convergence | None | str = option("auto")
    max_nonfinite: int = option(8)
    schedule: str | Schedule = option("all", program=False)
    target_fom: float | None = option(None, on_resume=OnResume.FREE, program=False)
    max_evals: int | None = option(None, on_resume=OnResume.FREE, program=False)
    max_time_s: float | None = option(None, on_resume=OnResume.FREE, program=False)
    # as target_fom: when starts stop, not how they step
    rediscoveries: int | None = option(None, on_resume=OnResume.FREE, program=False)

    def __post_init__(self):
        self._check_stopping()

    def _check_stopping(self) -> None:
        if self.n_steps != "auto":  # resolved when the fit starts: steps_for
            self._integers(n_steps=1)
        self._integers(max_nonfinite=1)
        conv = self.convergence
        if conv == "auto":  # a configuration made without its rule: the guard
            self._set("convergence", DEFAULT_CONVERGENCE)
        elif conv is not None and not isinstance(conv, Convergence):
            raise TypeError(
                f"convergence must be a multistart.Convergence, None or 'auto'; got {conv!r}"
            )
        self._set("schedule", check_schedule(self.schedule))
        self._set("target_fom", _check_real(self.target_fom, "target_fom", finite=True))
        self._set("max_evals", _optional_int(self.max_evals, "max_evals", 1))
        self._set("max_time_s", _check_real(self.max_time_s, "max_time_s", positive=True))
        self._set("rediscoveries", _optional_int(self.rediscoveries, "rediscoveries", 2))

    @property
    def halving(self) -> Halving | None:
        """The halving schedule, or ``None`` (``schedule="all"``)."""
        return self.schedule if isinstance(self.schedule, Halving) else None

    @property
    def guard(self) -> Convergence | None:
        """The window guard the steps run (``"auto"`` was resolved when the search was made)."""
        conv = self.convergence
        return conv if isinstance(conv, Convergence) else None

    @property
    def window(self) -> int:
        """The convergence window's length (the per-start ring buffer's size)."""
        guard = self.guard
        return 1 if guard is None else guard.window


@dataclass(frozen=True, kw_only=True)
class Execution(_Group):
    """How the starts are stepped: the width, the backend, the devices."""

    batch_size: int | str | None = option("auto", on_resume=OnResume.FREE, program=False)
    backend: str = option("loop")
    sync_every: int = option(1, program=False)
    steps_per_call: int | str = option("auto", on_resume=OnResume.FREE, program=False)
    flat: bool = option(True)
    devices: int | Sequence[Any] | None = option(None, on_resume=OnResume.FREE, recorded=False)
    dtype: str | None = option(None)

    def __post_init__(self):
        self._check_execution()

    def _check_execution(self) -> None:
        self._integers(sync_every=1)
        k = self.steps_per_call
        if k != "auto":
            if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
                raise ValueError(f"steps_per_call must be 'auto' or an int >= 1; got {k!r}")
            self._set("steps_per_call", int(k))
        self._set("batch_size", check_batch_size(self.batch_size))
        if self.backend not in BACKEND_NAMES:
            options = ", ".join(repr(b) for b in BACKEND_NAMES)
            raise ValueError(f"backend must be one of {options}; got {self.backend!r}")
        if not isinstance(self.flat, bool):
            raise ValueError(f"flat must be True or False; got {self.flat!r}")
        self._set("devices", check_devices(self.devices))
        self._set("dtype", check_dtype(self.dtype))


DTYPES = ("float32", "float64")


def check_dtype(dtype) -> str | None:
    """``None``, or ``dtype`` (``"float32"``, ``"float64"``, or a NumPy or JAX float type of
    those) as its name.

    Raises:
      ValueError: anything else, naming ``dtype``.
    """
    if dtype is None:
        return None
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in DTYPES or isinstance(dtype, bool):
        raise ValueError(f"dtype must be None, 'float32' or 'float64'; got {dtype!r}")
    return name


@dataclass(frozen=True, kw_only=True)
class Uncertainty(_Group):
    """How the errors of the best fit are scaled."""

    absolute_sigma: bool | None = option(None, on_resume=OnResume.FREE, program=False)
    n_data: int | None = option(None, on_resume=OnResume.FREE, program=False)

    def __post_init__(self):
        self._check_uncertainty()

    def _check_uncertainty(self) -> None:
        resolve_absolute_sigma(self.absolute_sigma, least_squares=None, n_data=self.n_data)
        self._set("n_data", _optional_int(self.n_data, "n_data", 1))


@dataclass(frozen=True, kw_only=True)
class Output(_Group):
    """What the search keeps, shows and writes as it runs."""

    max_history: int = option(10_000, recorded=False)
    log_every: int | None = option(None, on_resume=OnResume.FREE, recorded=False, program=False)
    progress: bool | None = option(None, on_resume=OnResume.FREE, recorded=False, program=False)
    checkpoint_dir: str | os.PathLike | None = option(
        None, on_resume=OnResume.FREE, recorded=False, program=False
    )
    checkpoint_every: int = option(100, on_resume=OnResume.FREE, recorded=False, program=False)

    def __post_init__(self):
        self._check_output()

    def _check_output(self) -> None:
        self._integers(max_history=1, checkpoint_every=1)
        self._set("log_every", _optional_int(self.log_every, "log_every", 0))
        if self.progress is not None and not isinstance(self.progress, bool):
            raise ValueError(
                f"progress must be None (automatic), True or False; got {self.progress!r}"
            )
        path = self.checkpoint_dir
        if path is not None:
            if not isinstance(path, (str, os.PathLike)) or not str(path):
                raise ValueError(f"checkpoint_dir must be a path or None; got {path!r}")
            require_orbax()


@dataclass(frozen=True)
class Coupling:
    """An option, as given, that couples a search's slots, why, and what may keep it."""

    #: The option as a user writes it (``"resurrect=2"``, ``"schedule='halving'"``).
    option: str
    why: str
    #: A stack of independent fits (one search of several datasets) may keep it: it only
    #: shares one budget (``max_evals``), without ranking or replacing any start.
    stack_may_keep: bool = False
    #: A part of a search (``part=(i, k)``) may keep it: every part makes it the whole run's.
    part_may_keep: bool = False
    #: It ends or replaces starts by a rule of its own, which ``rediscoveries`` (ending running
    #: starts by what the settled ones found) does not combine with.
    ends_starts: bool = False


@dataclass(frozen=True, kw_only=True)
class SearchConfig(Output, Uncertainty, Execution, Stopping, TikTak, Starts):
    """The options of a search (every one keyword-only; see :class:`MultiStartGradient`).

    It is its groups, each a type of its own with its fields' checks: :class:`Starts`,
    :class:`TikTak`, :class:`Stopping`, :class:`Execution`, :class:`Uncertainty` and
    :class:`Output`; it checks what couples them (``resurrect`` against ``max_nonfinite``,
    TikTak against the filter), lists the options that couple slots (:meth:`couplings`) and
    keys the compiled programs (:meth:`program_key`).
    """

    def __post_init__(self):
        self._check_starts()
        self._check_stopping()
        self._check_execution()
        self._check_uncertainty()
        self._check_output()
        if self.resurrect > self.max_nonfinite:
            raise ValueError(
                f"resurrect must be <= max_nonfinite ({self.max_nonfinite}): a start ends, and "
                f"is replaced, after that many non-finite evaluations; got {self.resurrect}"
            )
        self._resolve_tiktak()
        self._check_rediscoveries()

    def _check_rediscoveries(self) -> None:
        """``rediscoveries`` ends running starts by what the settled ones found: a refill
        (whose ended starts leave the reading) or the halving schedule (which ends starts
        itself) would make that ambiguous."""
        if self.rediscoveries is None:
            return
        for c in self.couplings():
            if c.ends_starts:
                raise ValueError(
                    f"rediscoveries={self.rediscoveries} ends the running starts once the best "
                    f"is found that often, which {c.option} does not combine with (TikTak has "
                    "its own rule, max_discoveries): drop one of them"
                )

    def _resolve_tiktak(self) -> None:
        given = {
            "n_local": self.n_local,
            "local_steps": self.local_steps,
            "max_discoveries": self.max_discoveries,
        }
        if isinstance(self.max_discoveries, str) and self.max_discoveries == "auto":
            self._set("max_discoveries", TIKTAK_DISCOVERIES if self.tiktak else None)
            given["max_discoveries"] = None  # a default, not given
        if not self.tiktak:
            extra = [k for k, v in given.items() if v is not None]
            if extra:
                raise ValueError(
                    f"{', '.join(extra)} only apply with start_strategy='tiktak'; got "
                    f"start_strategy={self.start_strategy!r}"
                )
            return
        if self.n_candidates == 0:
            raise ValueError(
                f"start_strategy={self.start_strategy!r} hands out the broad-start filter's "
                "candidates: n_candidates must not be 0"
            )
        if self.resurrect:
            raise ValueError(
                f"start_strategy={self.start_strategy!r} already gives every ended start's "
                "slot a new start; drop resurrect"
            )
        n_candidates = int(self.n_candidates or 0)
        given_local = self.n_local
        if given_local is None:
            cycles = BAND_TIKTAK_CYCLES if self.start_strategy == "band_tiktak" else 1
            given_local = min(cycles * self._tiktak_round, n_candidates)
        n_local = checks.integer(given_local, "n_local", self.n_starts)
        if n_local > n_candidates:
            raise ValueError(
                f"n_local ({n_local}) local searches need as many candidates: raise "
                f"n_candidates (now {self.n_candidates})"
            )
        self._set("n_local", n_local)
        self._set("local_steps", _optional_int(self.local_steps, "local_steps", 1))
        given_discoveries = self.max_discoveries
        if isinstance(given_discoveries, str):
            raise ValueError(
                'max_discoveries must be "auto", None (off) or an int >= 1; '
                f"got {given_discoveries!r}"
            )
        self._set("max_discoveries", _optional_int(given_discoveries, "max_discoveries", 1))

    # -- derived facts ------------------------------------------------------------------------

    @property
    def _tiktak_round(self) -> int:
        """Local searches in one round of TikTak's weights by default."""
        return TIKTAK_LOCAL_PER_START * self.n_starts

    @property
    def tiktak_cycle(self) -> int | None:
        """How many local searches TikTak's weight schedule runs over before it restarts
        (:class:`multistart.starts.tiktak.TikTakQueue`'s ``cycle``): one round under
        ``"band_tiktak"`` (``BAND_TIKTAK_CYCLES`` of them make its ``n_local``), ``None``
        (one schedule over ``n_local``) otherwise."""
        if self.start_strategy != "band_tiktak":
            return None
        return min(self._tiktak_round, int(self.n_local or 0))

    @property
    def give_up(self) -> int:
        """Non-finite evaluations after which a start ends (``resurrect``'s, when on)."""
        return self.resurrect or self.max_nonfinite

    @property
    def steps(self) -> int:
        """``n_steps`` as a fit runs it: ``"auto"`` is resolved when the fit starts
        (:func:`steps_for`), so a fit's configuration always holds an int."""
        if not isinstance(self.n_steps, int):
            raise ValueError("n_steps='auto' is resolved when the fit starts (steps_for)")
        return self.n_steps

    @property
    def history_stride(self) -> int:
        """History rows are every this many steps."""
        return -(-self.steps // self.max_history)

    def couplings(self) -> list[Coupling]:
        """The options given that couple the search's slots: the one list that a part
        (:func:`multistart.host.parts.check_part`), a stack of fits
        (:func:`multistart.host.parts.check_stack`) and ``rediscoveries`` refuse, each what it
        may not keep."""
        coupled = [
            self.n_candidates
            and Coupling(
                "n_candidates (the broad-start filter)",
                "it ranks the candidates of every slot together",
                part_may_keep=True,
            ),
            self.resurrect
            and Coupling(
                f"resurrect={self.resurrect}",
                "resurrection draws every slot's replacements from one shared reserve",
                ends_starts=True,
            ),
            self.tiktak
            and Coupling(
                f"start_strategy={self.start_strategy!r}",
                "TikTak hands every slot candidates from one queue, blended towards the best "
                "point of all slots (the default of L-BFGS and of the least-squares rules: "
                "start_strategy='band' splits)",
                ends_starts=True,
            ),
            self.target_fom is not None
            and Coupling(
                f"target_fom={self.target_fom!r}",
                "it stops every start once any start reaches it",
            ),
            self.max_evals is not None
            and Coupling(
                f"max_evals={self.max_evals!r}",
                "it stops every start once all of them made that many evaluations",
                stack_may_keep=True,
            ),
            self.rediscoveries is not None
            and Coupling(
                f"rediscoveries={self.rediscoveries}",
                "it ends a start by what the other starts found (a stack of fits: each fit's "
                "by its own starts)",
                stack_may_keep=True,
            ),
            self.halving is not None
            and Coupling(
                "schedule='halving'",
                "a start continues at a rung only if it ranks among the starts of every slot",
                ends_starts=True,
            ),
        ]
        return [c for c in coupled if c]

    def program_key(self) -> tuple:
        """The options the compiled programs may depend on, as one hashable value: every field
        but those declared ``program=False``, so the program cache
        (:func:`multistart.host.identity.programs_key`) can never miss one."""
        fields = dataclasses.fields(self)
        return tuple((f.name, getattr(self, f.name)) for f in fields if f.metadata["program"])

    def record(self) -> dict[str, Any]:
        """The recorded options as plain values (the Result's ``config``, the identity), in
        :data:`ORDER`."""
        out: dict[str, Any] = {}
        for f in ordered_fields():
            if not f.metadata["rec"]:
                continue
            value = getattr(self, f.name)
            if f.name == "convergence":
                value = None if value is None else vars(value).copy()
            elif f.name == "start_band":
                value = list(value)
            elif f.name == "filter_batch_size" and not self.n_candidates:
                value = None
            elif isinstance(value, Schedule):
                value = value.record()
            out[f.name] = value
        return out

    @classmethod
    def resumable(cls, name: str) -> bool:
        """May ``name`` differ between a checkpoint and the search resuming from it?"""
        f = {f.name: f for f in dataclasses.fields(cls)}.get(name)
        return f is not None and f.metadata["on_resume"] is not OnResume.FIXED


def ordered_fields() -> list[dataclasses.Field]:
    """:class:`SearchConfig`'s fields in :data:`ORDER`."""
    by_name = {f.name: f for f in dataclasses.fields(SearchConfig)}
    return [by_name[name] for name in ORDER]


if sorted(ORDER) != sorted(f.name for f in dataclasses.fields(SearchConfig)):
    raise TypeError("config.ORDER must name every field of SearchConfig once")  # pragma: no cover


def parameters() -> list[inspect.Parameter]:
    """The options as keyword-only parameters, in :data:`ORDER`: the part of every search
    class's signature that its rule's own parameters do not make."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter(f.name, keyword, default=f.default, annotation=f.type)
        for f in ordered_fields()
    ]


def unknown_options(given, owner: type) -> None:
    """Raise a ``TypeError`` naming any of ``given`` that is not a keyword argument of the
    search class ``owner`` (an option, a rule's hyperparameter), and the nearest that is."""
    params = inspect.signature(owner).parameters.values()
    known = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    for key in given:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise TypeError(f"{owner.__name__} got an unknown option {key!r}{hint}")
