"""Per-start status: an enumeration whose values read well in a table, with a message each."""

from __future__ import annotations

import enum

__all__ = ["Status"]


class Status(str, enum.Enum):
    """How a start ended. ``str(status)`` is its value; ``status.message`` explains it.

    A member is a ``str`` equal to its value, so ``result.status == "converged"`` is an
    elementwise test on the Result's status array, and the array prints as words.

    >>> Status.CONVERGED == "converged", str(Status.MAX_STEPS), repr(Status.NONFINITE)
    (True, 'max_steps', "'nonfinite'")

    On the device a status is its ``code`` (a small int, its place in the enumeration: new
    members go last, so saved codes keep their meaning); the host turns codes back into members.
    """

    RUNNING = "running"
    CONVERGED = "converged"
    MAX_STEPS = "max_steps"
    NONFINITE = "nonfinite"
    INTERRUPTED = "interrupted"
    UNSTARTED = "unstarted"
    STOPPED = "stopped"
    PRUNED = "pruned"
    STALLED = "stalled"
    REFOUND = "refound"

    @property
    def settled(self) -> bool:
        """Did the start end by a test (its rule's optimality test, or the window guard)?"""
        return self in (Status.CONVERGED, Status.STALLED)

    @property
    def code(self) -> int:
        return _CODES[self]

    @property
    def message(self) -> str:
        return _MESSAGES[self]

    @classmethod
    def from_code(cls, code: int) -> Status:
        return _MEMBERS[int(code)]

    def __str__(self) -> str:
        return self.value

    # NumPy prints object arrays with each element's repr: the value reads as a word there
    # (``array(['converged', 'max_steps'], dtype=object)``), as a str array would.
    def __repr__(self) -> str:
        return repr(self.value)


_MEMBERS = list(Status)
_CODES = {s: i for i, s in enumerate(_MEMBERS)}
_MESSAGES = {
    Status.RUNNING: "Still running: the search stopped before this start ended.",
    Status.CONVERGED: "Converged: the rule's own optimality test passed (its gradient, step or "
    "decrease tests, relative to the scale of the figure of merit).",
    Status.MAX_STEPS: "Reached n_steps before converging.",
    Status.NONFINITE: "Non-finite (nan or inf) objective or gradient; the start was stopped.",
    Status.INTERRUPTED: "The search was interrupted before this start ended.",
    Status.UNSTARTED: (
        "Never started: the broad-start filter found fewer finite candidates than n_starts, "
        "so this slot had no start."
    ),
    Status.STOPPED: (
        "Stopped by the search's target or budget (target_fom, max_evals or max_time_s) "
        "before this start ended."
    ),
    Status.PRUNED: (
        "Pruned by the halving schedule: at a rung it was behind the starts that continued and "
        "not improving fast enough to catch up (its best is kept)."
    ),
    Status.STALLED: (
        "Stalled: its best figure of merit improved by less than the convergence window's "
        "tolerance over the window; no optimality test said it reached a minimum."
    ),
    Status.REFOUND: (
        "Ended by the rediscovery rule (rediscoveries): enough settled starts of its fit had "
        "found the best minimum, and this one was not below it (its best is kept)."
    ),
}
