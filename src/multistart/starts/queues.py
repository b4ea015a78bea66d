"""Where a freed slot's next start comes from: one protocol for every queue of starts.

A search's slots are its population's rows. When a start ends, its slot can take a new start
from a queue, at a host sync (:mod:`multistart.host.decide` says which slots, the
:class:`multistart.starts.refill.Refiller` writes them). Three queues plug in the same way:

- :class:`multistart.starts.strategies.CandidateReserve`: the broad-start filter's finite
  candidates that were not chosen, best first (resurrection of starts that died in a
  non-finite region);
- :class:`multistart.starts.strategies.StreamReserve`: fresh draws of the start strategy
  (resurrection when no filter ran);
- :class:`multistart.starts.tiktak.TikTakQueue`: the filter's candidates, each blended towards
  the best point so far (TikTak), with TikTak's rediscovery stop rule.

No JAX import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["StartQueue"]


class StartQueue:
    """A source of new starts for freed slots (subclasses implement :meth:`take`).

    Attributes:
      kind: what it is, for the log (``"the filter's reserve"``).
      routine: refilling is what the queue is for (TikTak: logged at DEBUG), rather than a
        repair (resurrection: logged at INFO, running out at WARNING).
      needs_best: :meth:`take` blends its starts towards the best point found so far, which
        the caller then passes.

    Every queue is deterministic given the seed: the run state records every ``take(m)``
    (:class:`multistart.starts.refill.Lineage`), and a resumed search replays them (:meth:`replay`).
    """

    kind = "a queue of starts"
    routine = False
    needs_best = False

    def available(self) -> int | None:
        """How many starts it can still hand out (``None``: no end)."""
        return None

    def take(self, m: int, best: Any = None) -> Any:
        """Up to ``m`` new starts (physical params, leading axis), or ``None`` if none is left.

        ``best`` is the best point so far (one start's physical params) when
        :attr:`needs_best`; without it (a checkpoint being replayed) the queue only advances.
        """
        raise NotImplementedError

    def observe(self, records: Sequence[Any]) -> None:
        """The local searches whose slots were just refilled, in the order they ended."""

    @property
    def refills_pruned(self) -> bool:
        """May a slot the halving schedule pruned take a start now? A queue hands its starts
        to any freed slot (this default); one whose refills pay only where local searches are
        short waits until they have shown it
        (:attr:`multistart.starts.tiktak.TikTakQueue.refills_pruned`)."""
        return True

    @property
    def stop_reason(self) -> str | None:
        """The rule by which this queue hands out no more starts before it is empty (``None``:
        none did). The local searches running then still run to their ends, and the search
        that ends with them stopped for this reason."""
        return None

    def replay(self, takes: Sequence[int]) -> None:
        """Bring a freshly made queue to where another one stood after ``takes``."""
        for m in takes:
            self.take(int(m))
