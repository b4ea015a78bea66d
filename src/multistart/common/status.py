"""Per-start status: an enumeration whose values read well in a table, with a message each."""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["Status", "codes_of", "members", "messages", "words", "settled", "counts"]


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
    NO_DATA = "no_data"

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
    Status.NO_DATA: (
        "No data: its fit has fewer valid points (not nan, masked or of infinite sigma) than "
        "free parameters, so it was not run; its values and errors are nan."
    ),
}

_MEMBER_ARRAY = np.array(_MEMBERS + [None], dtype=object)[:-1]  # an object array of members
_MESSAGE_ARRAY = np.array([_MESSAGES[s] for s in _MEMBERS] + [None], dtype=object)[:-1]
_WORD_ARRAY = np.array([s.value for s in _MEMBERS] + [None], dtype=object)[:-1]
_SETTLED = np.array([s.settled for s in _MEMBERS])


def codes_of(statuses) -> np.ndarray:
    """The codes (``int8``) of an array of statuses: members, or their words, one dict
    lookup each (a member is a ``str`` equal to its word, so either finds it); or codes
    already (integers: checked, no loop over them)."""
    given = np.asarray(statuses)
    if given.dtype.kind in "iu":
        if given.size and (given.min() < 0 or given.max() >= len(_MEMBERS)):
            raise ValueError(f"status codes must lie in 0..{len(_MEMBERS) - 1}")
        return given.astype(np.int8)
    flat = np.asarray(statuses, dtype=object).reshape(-1)
    try:
        codes = np.fromiter(map(_CODES.__getitem__, flat), dtype=np.int8, count=flat.size)
    except KeyError:  # not a status: the enumeration says which
        codes = np.array([Status(s).code for s in flat], dtype=np.int8)
    return codes.reshape(np.shape(statuses))


def members(codes) -> np.ndarray:
    """An object array of the members of ``codes`` (NumPy indexing, no loop over them)."""
    return _MEMBER_ARRAY[np.asarray(codes, dtype=np.int64)]


def messages(codes) -> np.ndarray:
    """An object array of each code's :attr:`Status.message`."""
    return _MESSAGE_ARRAY[np.asarray(codes, dtype=np.int64)]


def words(codes) -> np.ndarray:
    """An object array of each code's word (a plain ``str``: ``"converged"``)."""
    return _WORD_ARRAY[np.asarray(codes, dtype=np.int64)]


def settled(codes) -> np.ndarray:
    """Which of ``codes`` are :attr:`Status.settled`."""
    return _SETTLED[np.asarray(codes, dtype=np.int64)]


def counts(statuses) -> dict[str, int]:
    """How many of ``statuses`` end each way, in the enumeration's order (none omitted as 0)."""
    tally = np.bincount(codes_of(statuses).reshape(-1).astype(np.int64), minlength=len(_MEMBERS))
    return {str(s): int(k) for s, k in zip(_MEMBERS, tally, strict=True) if k}
