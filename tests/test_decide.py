"""The host's decision at a sync, as a table: readings in, decisions out (no JAX, no compile)."""

import numpy as np
import pytest

from multistart.common.status import Status
from multistart.host.decide import (
    Decision,
    Due,
    Reading,
    Rules,
    StopReason,
    TailPrice,
    decide,
    refill_slots,
    resumed,
)
from multistart.host.schedule import Halving, Rungs

R, C, N, M, P = (
    s.code
    for s in (Status.RUNNING, Status.CONVERGED, Status.NONFINITE, Status.MAX_STEPS, Status.PRUNED)
)
SYNC = Due(on_schedule=True)


def reading(status, *, best=None, evals=None, due=SYNC, **kw) -> Reading:
    status = np.asarray(status, np.int8)
    best = np.arange(1.0, status.size + 1) if best is None else np.asarray(best, float)
    evals = np.full(status.size, 10) if evals is None else np.asarray(evals)
    n_swept = kw.pop("n_swept", int(np.sum(status == R)))
    return Reading(
        step=kw.pop("step", 7),
        status=status,
        best_fom=best,
        n_evals=evals,
        due=due,
        n_swept=n_swept,
        **kw,
    )


RESURRECT = Rules(refills=frozenset({N}))
# a tail decision at step 64 of a sweep 250 wide: one start of 250 runs, as it did at step 32
TAIL_READ = reading([R] + [C] * 249, step=64, due=Due(tail=True), width=250, tail_since=32)
TIKTAK = Rules(refills=frozenset({N, C, M}), checkpoints=True)

# (name, reading, rules, expected decision as plain values)
TABLE = [
    ("all running: go on", reading([R, R]), Rules(), dict(stop=None, rows=None)),
    ("one ended: repack", reading([R, C], n_swept=2), Rules(), dict(stop=None, rows=[0])),
    ("none running: all ended", reading([C, N]), Rules(), dict(stop="all ended")),
    ("last step", reading([R, C], due=Due(last=True)), Rules(), dict(stop="n_steps")),
    (
        "all ended wins over the last step",
        reading([C, C], due=Due(last=True)),
        Rules(),
        dict(stop="all ended"),
    ),
    ("a signal", reading([R], signal="SIGTERM"), Rules(), dict(stop="SIGTERM")),
    (
        "the signal wins over a budget",
        reading([R], signal="SIGINT", out_of_time=True),
        Rules(),
        dict(stop="SIGINT"),
    ),
    ("out of time", reading([R], out_of_time=True), Rules(), dict(stop="max_time_s")),
    (
        "target reached",
        reading([R, R], best=[3.0, 0.5]),
        Rules(target_fom=0.5),
        dict(stop="target_fom"),
    ),
    ("target not reached", reading([R], best=[0.6]), Rules(target_fom=0.5), dict(stop=None)),
    (
        "evaluations, replaced starts' included",
        reading([R, R], evals=[4, 4], evals_replaced=2),
        Rules(max_evals=10),
        dict(stop="max_evals"),
    ),
    ("evaluations below the budget", reading([R], evals=[9]), Rules(max_evals=10), dict(stop=None)),
    (
        "resurrection refills the dead slots in order",
        reading([N, R, N, C], available=5, n_swept=1),
        RESURRECT,
        dict(stop=None, refill=[0, 2], rows=[0, 1, 2]),
    ),
    (
        "as far as the queue goes",
        reading([N, R, N], available=1, n_swept=1),
        RESURRECT,
        dict(refill=[0], short=1, rows=[0, 1]),
    ),
    (
        "an endless queue",
        reading([N, N], available=None, n_swept=0),
        RESURRECT,
        dict(refill=[0, 1], rows=[0, 1]),
    ),
    (
        "an empty queue: the slots stay ended, all ended",
        reading([N, C], available=0),
        RESURRECT,
        dict(stop="all ended", short=1),
    ),
    (
        "off schedule: no refill",
        reading([N, R], available=3, due=Due(logging=True), n_swept=1),
        RESURRECT,
        dict(stop=None, refill=[]),
    ),
    (
        "refills made, so the search goes on",
        reading([C, M, N], available=3, n_swept=0),
        TIKTAK,
        dict(stop=None, refill=[0, 1, 2], checkpoint=False, rows=[0, 1, 2]),
    ),
    (
        "stopping: refills left pending, a checkpoint written",
        reading([C, R], available=3, signal="SIGINT"),
        TIKTAK,
        dict(stop="SIGINT", refill=[], pending=True, checkpoint=True),
    ),
    (
        "the last step: refills left pending",
        reading([C, R], available=3, due=Due(last=True, on_schedule=True, checkpoint=True)),
        TIKTAK,
        dict(stop="n_steps", refill=[], pending=True, checkpoint=True),
    ),
    (
        "a checkpoint due by the step count",
        reading([R], due=Due(checkpoint=True)),
        Rules(checkpoints=True),
        dict(stop=None, checkpoint=True),
    ),
    (
        "no checkpoints, nothing written when stopping",
        reading([C]),
        Rules(),
        dict(stop="all ended", checkpoint=False),
    ),
]

# A race under a queue (issue 73): rung 0 at 10 evaluations keeps the better half. Slot 0 (4.0)
# falls outside the cut of 1.0, 2.0 and the converged slot 3's 3.0, slot 3 is refilled.
RACE = Rules(refills=frozenset({N, C, M, P}), halving=Halving(r0=10, eta=2, grace=0.0, keep=1))
AT_RUNG_0 = dict(best=[4.0, 1.0, 2.0, 3.0], evals=[10, 10, 10, 5], rungs=Rungs.start(4))
TABLE += [
    (
        "a race's pruned slot takes the queue's next start with the ended one",
        reading([R, R, R, C], **AT_RUNG_0, available=5, n_swept=4),
        RACE,
        dict(stop=None, prune=[0], refill=[0, 3], rows=None),
    ),
    (
        "a queue that does not take pruned slots now: the ended one alone",
        reading([R, R, R, C], **AT_RUNG_0, available=5, n_swept=4, refill_pruned=False),
        RACE,
        dict(stop=None, prune=[0], refill=[3], short=0, rows=[1, 2, 3]),
    ),
    (
        "a slot pruned before takes a start once the queue takes pruned slots",
        reading([P, R, C], rungs=Rungs.start(3), available=5, n_swept=1),
        RACE,
        dict(stop=None, prune=[], refill=[0, 2], rows=[0, 1, 2]),
    ),
    (
        "... and waits while it does not",
        reading([P, R, C], rungs=Rungs.start(3), available=5, n_swept=1, refill_pruned=False),
        RACE,
        dict(stop=None, prune=[], refill=[2], rows=[1, 2]),
    ),
    (
        "waiting pruned slots keep no search going: all ended",
        reading([P, C], rungs=Rungs.start(2), available=0, refill_pruned=False),
        RACE,
        dict(stop="all ended", refill=[], short=1),
    ),
]

REFOUND = Due(refound=True)
FOUND_TWICE = Rules(rediscoveries=2, group=3, xtol=1e-3, ftol=1e-3)
AT_ZERO = np.zeros((6, 1))
TABLE += [
    (
        "a fit found twice ends its running start; the other fit runs on",
        reading([C, C, R, R, C, R], best=[1, 1, 3, 0.5, 2, 2.5], due=REFOUND, best_u=AT_ZERO),
        FOUND_TWICE,
        dict(stop=None, prune=[2], rows=[3, 5]),
    ),
    (
        "not due: nothing ends",
        reading([C, C, R], best=[1, 1, 3], due=SYNC, best_u=AT_ZERO[:3]),
        FOUND_TWICE,
        dict(stop=None, prune=[]),
    ),
    (
        "a running start below the best runs on",
        reading([C, C, R], best=[1, 1, 0.99], due=REFOUND, best_u=AT_ZERO[:3]),
        FOUND_TWICE,
        dict(stop=None, prune=[]),
    ),
    (
        "below a small best by less than the tolerance: it runs on",
        reading([C, C, R], best=[2e-5, 2e-5, 1e-5], due=REFOUND, best_u=AT_ZERO[:3]),
        FOUND_TWICE,
        dict(stop=None, prune=[]),
    ),
    (
        "within the tolerance of the best, but elsewhere: not found",
        reading([C, C, R], best=[1, 1, 3], due=REFOUND, best_u=np.array([[0.0], [0.5], [0]])),
        FOUND_TWICE,
        dict(stop=None, prune=[]),
    ),
    (
        "its last running start ended: all ended",
        reading([C, C, R], best=[1, 1 + 1e-6, 3], due=REFOUND, best_u=AT_ZERO[:3]),
        FOUND_TWICE,
        dict(stop="all ended", prune=[2]),
    ),
    (
        "a ragged last fit, and one settled start at best: no end",
        reading([C, R, R, C, R], best=[1, 2, 3, 1, 2], due=REFOUND, best_u=AT_ZERO[:5]),
        FOUND_TWICE,
        dict(stop=None, prune=[]),
    ),
    (
        "one group: the whole search",
        reading([C, R, R, C, R], best=[1, 2, 3, 1, 2], due=REFOUND, best_u=AT_ZERO[:5]),
        Rules(rediscoveries=2, xtol=1e-3, ftol=1e-3),
        dict(stop="all ended", prune=[1, 2, 4]),
    ),
    (
        "ended at the last step too (a resumed run replays it)",
        reading(
            [C, C, R, R], best=[1, 1, 3, 0.5], due=Due(refound=True, last=True), best_u=AT_ZERO[:4]
        ),
        Rules(rediscoveries=2, xtol=1e-3, ftol=1e-3),
        dict(stop="n_steps", prune=[2]),
    ),
    # the tail (issue 38): one straggler of 250 rows, a tail that lasted since step 32
    (
        "a lasting tail narrows, unpriced",
        TAIL_READ,
        Rules(),
        dict(stop=None, width=16),
    ),
    (
        "a tail that has cost a compile and could repay one narrows",
        TAIL_READ,
        Rules(tail=TailPrice(start_s=2e-4, compile_s=1.0, n_steps=400)),
        dict(stop=None, width=16),
    ),
    (
        "a tail that could repay its compile but has not yet cost one steps on",
        TAIL_READ,
        Rules(tail=TailPrice(start_s=2e-5, compile_s=1.0, n_steps=400)),
        dict(stop=None, width=None),
    ),
    (
        "a cheap model's straggler steps on at the width swept",
        TAIL_READ,
        Rules(tail=TailPrice(start_s=2e-6, compile_s=1.0, n_steps=400)),
        dict(stop=None, width=None),
    ),
    (
        "too few steps left to repay it",
        TAIL_READ,
        Rules(tail=TailPrice(start_s=2e-4, compile_s=1.0, n_steps=64 + 21)),
        dict(stop=None, width=None),
    ),
]


def describe(decision: Decision) -> dict:
    """A decision as plain values, for the table's comparisons and messages."""
    return {
        "stop": None if decision.stop is None else decision.stop.value,
        "prune": decision.prune.tolist(),
        "refill": decision.refill.tolist(),
        "short": decision.short,
        "pending": decision.pending,
        "checkpoint": decision.checkpoint,
        "rows": None if decision.rows is None else decision.rows.tolist(),
        "width": decision.width,
    }


@pytest.mark.parametrize("name, r, rules, expected", TABLE, ids=[t[0] for t in TABLE])
def test_decide(name, r, rules, expected):
    got = describe(decide(r, rules))
    want = {k: got[k] for k in expected}
    assert want == expected, got


def test_a_tail_price_is_read_from_a_width_choice_that_priced_its_fit():
    prices = {"n_steps": 400, "fit_s": 1.6, "compile_s": 1.4, "start_s": 2e-6}
    assert TailPrice.of({"prices": prices}, 400) == TailPrice(2e-6, 1.4, 400)
    # a record written by a fit of 40 steps prices a fit of 4,000 at its own steps
    assert TailPrice.of({"prices": {**prices, "n_steps": 40}}, 4000).n_steps == 4000
    # an explicit width, "tune", a record from before the seconds a start were kept: unpriced
    assert TailPrice.of(None, 400) is None and TailPrice.of({"table": []}, 400) is None
    assert TailPrice.of({"prices": {"n_steps": 400, "fit_s": 1.6, "compile_s": 1.4}}, 400) is None
    # 336 steps left x 234 starts x 2 us = 0.16 s: below the compile, above it at 20 us; but
    # at 20 us the 32 steps of the tail so far cost 0.15 s, not yet a compile: 200 us have
    assert not TailPrice(2e-6, 1.4, 400).pays(64, 250, 16, 32)
    assert not TailPrice(2e-5, 1.4, 400).pays(64, 250, 16, 32)
    assert TailPrice(2e-4, 1.4, 400).pays(64, 250, 16, 32)
    assert not TailPrice(2e-4, 1.4, 400).pays(64, 250, 16, 63)  # one step of tail: 0.047 s


def test_decisions_report_when_the_log_or_bar_is_due():
    assert decide(reading([R], due=Due(logging=True)), Rules()).report
    assert decide(reading([R], due=Due(drawing=True)), Rules()).report
    assert not decide(reading([R]), Rules()).report


def test_a_stop_found_while_applying_checkpoints_as_the_decision_would():
    """An all-ended sync renamed to the queue's stop (TikTak's rediscovery rule) writes the
    checkpoint the end writes; the same rename of a resumed search that had already ended
    writes none (its last step is on disk: writing it again failed as "already exists")."""
    ended = decide(reading([C, C], available=0, n_swept=2), TIKTAK)
    assert ended.stop is StopReason.ALL_ENDED and ended.checkpoint
    stopped = ended.stopping(StopReason.MAX_DISCOVERIES)
    assert stopped.stop is StopReason.MAX_DISCOVERIES
    assert stopped.checkpoint and stopped.rows is None
    again = resumed(reading([C, C], available=0, n_swept=2), TIKTAK, pending=False)
    assert again.stop is StopReason.ALL_ENDED and not again.checkpoint
    assert not again.stopping(StopReason.MAX_DISCOVERIES).checkpoint


def test_stop_reasons_read_as_the_words_results_record():
    assert StopReason.ALL_ENDED == "all ended" and str(StopReason.N_STEPS) == "n_steps"
    assert StopReason("SIGTERM").interrupted and not StopReason.TARGET_FOM.interrupted
    assert isinstance(Decision().refill, np.ndarray)


def test_refill_slots_takes_ended_slots_in_order():
    status = np.array([N, R, C, N, M])
    rows, short = refill_slots(status, {N}, None)
    assert rows.tolist() == [0, 3] and short == 0
    rows, short = refill_slots(status, {N, C, M}, 2)
    assert rows.tolist() == [0, 2] and short == 2
