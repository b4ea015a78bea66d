"""The progress bar: steps, best figure of merit, starts alive and evaluations per second.

``tqdm.auto`` draws a widget in a notebook and a line in a terminal. By default the bar is on
when the output is interactive (stderr is a terminal, or the code runs in a Jupyter kernel)
and off otherwise, so a batch job's log holds no bar redraws; ``progress=True`` or ``False``
on the search forces it. The bar is redrawn at most every ``REFRESH_S`` seconds, which is also
the only time the loop reads the best figure of merit for it from the device.
"""

from __future__ import annotations

import sys
import time

__all__ = ["Progress", "interactive", "REFRESH_S"]

REFRESH_S = 0.2


def interactive() -> bool:
    """Is somebody watching: stderr a terminal, or a Jupyter kernel?"""
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):  # a closed or unusual stream
        pass
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    ip = getattr(shell, "get_ipython", lambda: None)()
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


class Progress:
    """A bar over the search's steps; a no-op when disabled.

    Args:
      enabled: draw it at all.
      total: the search's ``n_steps``.
      initial: the step it starts at (a resumed search).
      n: the number of starts.
    """

    def __init__(self, enabled: bool, *, total: int, initial: int, n: int):
        self.enabled = enabled
        self.n = n
        self._bar = None
        self._last = 0.0
        self._evals0, self._t0 = 0, time.perf_counter()
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total, initial=initial, unit="step", desc="multistart", leave=True
            )
            self._step = initial

    def due(self) -> bool:
        """Is a redraw due (so the caller fetches what the bar shows)?"""
        return self.enabled and time.perf_counter() - self._last >= REFRESH_S

    def update(self, step: int, best: float, alive: int, evals: int, extra: str = "") -> None:
        """Redraw with the step, the best, the starts alive and the rate (and ``extra``: the
        rungs' occupancy under the halving schedule)."""
        if self._bar is None:
            return
        now = time.perf_counter()
        rate = (evals - self._evals0) / max(now - self._t0, 1e-12)
        text = f"best {best:.6g}, alive {alive}/{self.n}, {rate:.3g} evals/s"
        self._bar.set_postfix_str(f"{text}, {extra}" if extra else text, refresh=False)
        self._bar.update(step - self._step)
        self._step, self._last = step, now

    def close(self, step: int | None = None) -> None:
        if self._bar is not None:
            if step is not None and step > self._step:
                self._bar.update(step - self._step)
            self._bar.close()
            self._bar = None
