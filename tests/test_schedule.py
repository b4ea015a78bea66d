"""The halving schedule's rule as a table on literal arrays (NumPy only: nothing compiles).

:func:`multistart.host.schedule.prune` is called the way the host loop calls it, once per sync, on
each slot's status, best-so-far and evaluation count; :func:`race` does that over whole
trajectories (``(steps, n)`` best-so-far curves), as
``profiling/experiments/halving_replay.py`` does on recorded runs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from multistart import Halving
from multistart.common.status import Status
from multistart.host.schedule import Rungs, check_schedule, prune

R, C, P, U = (s.code for s in (Status.RUNNING, Status.CONVERGED, Status.PRUNED, Status.UNSTARTED))


def race(curves, halving, ends=None):
    """Race the trajectories ``curves`` (``(steps, n)``, each start's best after each step) with
    one sync per step. ``ends``: ``(n,)`` the step at which each start converges (default: it
    runs every step). Returns ``(evaluations each start made, rungs)``."""
    curves = np.asarray(curves, float)
    steps, n = curves.shape
    ends = np.full(n, steps) if ends is None else np.asarray(ends)
    stop, pruned, rungs = ends.copy(), np.zeros(n, bool), Rungs.start(n)
    for t in range(1, steps):  # no pruning at the last step, as in the host loop
        ev = np.minimum(t, stop)
        alive = (t < ends) & ~pruned
        status = np.where(pruned, P, np.where(alive, R, C)).astype(np.int8)
        out, rungs = prune(rungs, halving, status, curves[ev - 1, np.arange(n)], ev)
        pruned[out], stop[out] = True, t
    return stop, rungs


def bowls(depth, start, rate, steps):
    """Best-so-far of gradient descent on 1-D quadratic bowls ``depth + w x**2``, from where the
    figure of merit is ``start``: each step multiplies the height above the floor by ``rate``."""
    t = np.arange(1, steps + 1)[:, None]
    depth, start, rate = (np.asarray(a, float) for a in (depth, start, rate))
    return depth + (start - depth) * rate ** (t - 1)


# -- the settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(r0=0), "Halving.r0 must be an int >= 1; got 0"),
        (dict(r0=2.5), "Halving.r0 must be an int >= 1; got 2.5"),
        (dict(eta=1), "Halving.eta must be an int >= 2; got 1"),
        (dict(keep=0), "Halving.keep must be an int >= 1; got 0"),
        (dict(keep=True), "Halving.keep must be an int >= 1; got True"),
        (dict(grace=-1.0), "Halving.grace must be a finite number >= 0; got -1.0"),
        (dict(grace=float("inf")), "Halving.grace must be a finite number >= 0; got inf"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        Halving(**kwargs)


def test_check_schedule():
    assert check_schedule("all") == "all"
    assert check_schedule("halving") == Halving()
    h = Halving(r0=7, keep=1)
    assert check_schedule(h) is h
    with pytest.raises(ValueError, match="schedule must be 'all', 'halving' or a multistart"):
        check_schedule("fast")


def test_rungs_are_evaluation_counts():
    assert [Halving(r0=10, eta=3, keep=1).rung(k) for k in range(4)] == [10, 30, 90, 270]


# -- one sync, as a table ----------------------------------------------------------------------


def sync(status, best, evals, halving, rungs=None):
    """``(pruned slots as a list, rungs)`` of one call of ``prune``."""
    status = np.asarray(status, np.int8)
    rungs = Rungs.start(status.size) if rungs is None else rungs
    out, rungs = prune(rungs, halving, status, np.asarray(best, float), np.asarray(evals))
    return out.tolist(), rungs


RANK = Halving(r0=10, eta=3, grace=0.0, keep=1)

# (name, halving, status, best, evals, pruned)
TABLE = [
    ("before rung 0 nobody is judged", RANK, [R] * 4, [4, 3, 2, 1], [9] * 4, []),
    (
        "at a rung the best ceil(n / eta) continue",
        RANK,
        [R] * 7,
        [7, 1, 6, 2, 5, 3, 4],
        [10] * 7,
        [0, 2, 4, 6],
    ),
    (
        "never fewer than keep",
        Halving(r0=10, eta=4, grace=0.0, keep=3),
        [R] * 4,
        [1, 2, 3, 4],
        [10] * 4,
        [3],
    ),
    ("ties at the cut continue", RANK, [R] * 4, [1, 2, 2, 3], [10] * 4, [3]),
    ("a start with no finite value is last", RANK, [R] * 3, [np.nan, 5.0, 6.0], [10] * 3, [0, 2]),
    (
        "a start that ended before the rung counts at its final best",
        RANK,
        [C, R, R],
        [0.5, 1.0, 2.0],
        [4, 10, 10],
        [1, 2],
    ),
    (
        "a pruned start does not count",
        RANK,
        [P, R, R],
        [0.5, 1.0, 2.0],
        [4, 10, 10],
        [2],
    ),
    (
        "an unstarted slot is no competitor",
        RANK,
        [U, R, R, R],
        [np.inf, 1, 2, 3],
        [0, 10, 10, 10],
        [2, 3],
    ),
    ("ended starts are never pruned", RANK, [C, C, R], [3.0, 2.0, 1.0], [10, 10, 10], []),
]


@pytest.mark.parametrize(
    "name, halving, status, best, evals, pruned", TABLE, ids=[t[0] for t in TABLE]
)
def test_one_sync(name, halving, status, best, evals, pruned):
    assert sync(status, best, evals, halving)[0] == pruned


# -- whole races on literal trajectories -------------------------------------------------------


def test_bowls_of_known_depths_keep_the_deepest():
    """Nine bowls, all starting as high and falling alike: the deepest ends best, and every
    setting keeps it while pruning most of the others."""
    depth = np.array([5.0, 2.0, 8.0, 0.0, 7.0, 1.0, 4.0, 6.0, 3.0])
    curves = bowls(depth, 100.0 + depth, np.full(9, 0.8), 200)
    for h in (Halving(), Halving(r0=5, eta=3, grace=0.0, keep=1), Halving(r0=10, eta=2, keep=2)):
        stop, rungs = race(curves, h)
        assert stop[3] == 200, h  # the deepest ran to the end
        assert np.sum(stop < 200) >= 6, h  # most others were pruned
        assert sum(rungs.pruned) == np.sum(stop < 200)


def late_bloomer(steps=60):
    """Three bowls falling slowly and a deeper one that starts far higher and falls fast."""
    return bowls([0.0, 1.0, 2.0, 3.0], [100.0, 12.0, 12.0, 12.0], [0.6, 0.9, 0.9, 0.9], steps)


def test_a_late_bloomer_is_kept_by_its_decrease_not_by_its_rank():
    curves = late_bloomer()
    # At rung 0 (5 evaluations) the deepest bowl is behind the cut (the best 2 of 4) ...
    assert np.argsort(curves[4])[:2].tolist() == [1, 2]
    # ... but it fell 23 between 3 and 5 evaluations, a quarter of which, twice over (eta),
    # puts it below the cut: it continues, and it ends best.
    stop, _ = race(curves, Halving(r0=5, eta=2, grace=0.25, keep=1))
    assert stop[0] == 60 and curves[-1].argmin() == 0
    # Rank alone prunes it at rung 0, and the race ends on a shallower bowl.
    stop, rungs = race(curves, Halving(r0=5, eta=2, grace=0.0, keep=1))
    assert stop[0] == 5 and rungs.pruned[0] == 2


def test_the_decrease_before_rung_0_is_measured_from_ceil_r0_over_eta():
    # A start that falls steeply over its first evaluations and then stalls is not kept at
    # rung 0 by that first fall: its decrease is counted from 3 evaluations (ceil(5 / 2)).
    stall = np.array([1000.0, 500.0, 50.0, 50.0, 50.0, 50.0])
    curves = np.stack([stall, np.full(6, 1.0), np.full(6, 2.0)], 1)
    stop, _ = race(curves, Halving(r0=5, eta=2, grace=10.0, keep=1))
    assert stop.tolist() == [5, 6, 6]


def test_no_decrease_is_read_from_a_non_finite_best():
    # Its best was not finite at 3 evaluations: an infinite "decrease" would keep it forever.
    late = np.array([np.inf, np.inf, np.inf, 40.0, 30.0, 20.0])
    curves = np.stack([late, np.full(6, 1.0), np.full(6, 2.0)], 1)
    stop, _ = race(curves, Halving(r0=5, eta=2, grace=100.0, keep=1))
    assert stop.tolist() == [5, 6, 6]


def test_several_rungs_in_one_sync_are_judged_in_turn():
    # sync_every > 1: eight starts read first at 25 evaluations have passed rungs 5, 10 and 20.
    h = Halving(r0=5, eta=2, grace=0.0, keep=1)
    best = np.array([8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0])
    pruned, rungs = sync([R] * 8, best, [25] * 8, h)
    assert rungs.pruned == (4, 2, 1)
    assert pruned == [0, 2, 3, 4, 5, 6, 7]  # slot 1 (the best) alone continues
    assert rungs.next_rung.tolist() == [0, 3, 0, 2, 0, 1, 0, 1]  # the rung each one left at


def test_asynchronous_arrivals_are_judged_against_those_before():
    """ASHA's rule when few have reached a rung: the first arrival continues; a later one
    continues only if it is among the best 1 / eta of the arrivals so far."""
    h = Halving(r0=10, eta=3, grace=0.0, keep=1)
    rungs = Rungs.start(3)
    out, rungs = sync([R, R, R], [5.0, 6.0, 4.0], [10, 5, 5], h, rungs)
    assert out == []  # alone at rung 0
    out, rungs = sync([R, R, R], [5.0, 6.0, 4.0], [11, 10, 5], h, rungs)
    assert out == [1]  # behind the first of two
    out, rungs = sync([R, P, R], [5.0, 6.0, 4.0], [12, 10, 10], h, rungs)
    assert out == []  # ahead of both
    assert rungs.reached == ((5.0, 6.0, 4.0),) and rungs.pruned == (1,)


def test_prune_is_pure():
    h = Halving(r0=5, eta=2, grace=0.25, keep=1)
    status = np.array([R, R, R, C], np.int8)
    best, evals = np.array([3.0, 1.0, 2.0, 0.5]), np.array([5, 5, 5, 2])
    _, before = sync([R] * 4, [3.5, 1.5, 2.2, 9.0], [3, 3, 3, 2], h)  # small decreases
    copies = [a.copy() for a in (before.next_rung, before.last_f, before.counted)]
    first = prune(before, h, status, best, evals)
    second = prune(before, h, status, best, evals)
    assert first[0].tolist() == second[0].tolist() == [0, 2]
    assert first[1].to_json() == second[1].to_json()
    for a, b in zip(copies, (before.next_rung, before.last_f, before.counted), strict=True):
        np.testing.assert_array_equal(a, b)
    assert before.reached == () and before.ended == ()


def test_rungs_round_trip_through_json():
    h = Halving(r0=2, eta=2, grace=0.0, keep=1)
    _, rungs = sync([R, R, C, U], [1.0, np.nan, np.inf, np.inf], [2, 2, 1, 0], h)
    text = json.dumps(rungs.to_json())  # inf and nan as strings: plain JSON
    back = Rungs.from_json(json.loads(text))
    assert back.to_json() == rungs.to_json()
    np.testing.assert_array_equal(back.last_f, rungs.last_f)


def test_reset_starts_a_slot_again_before_rung_0():
    h = Halving(r0=2, eta=2, grace=0.0, keep=1)
    _, rungs = sync([R, R], [1.0, 2.0], [4, 4], h)
    assert rungs.next_rung.tolist() == [2, 0]
    fresh = rungs.reset(np.array([0]))
    assert fresh.next_rung.tolist() == [0, 0] and np.isnan(fresh.last_f[0])
    assert fresh.reached == rungs.reached  # the rungs' record is kept
