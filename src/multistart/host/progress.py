"""What a person sees while a search runs: the progress bar and the progress lines in the log.

``tqdm.auto`` draws a widget in a notebook and a line in a terminal. By default the bar is on
when the output is interactive (stderr is a terminal, or the code runs in a Jupyter kernel)
and off otherwise, so a batch job's log holds no bar redraws; ``progress=True`` or ``False``
on the search forces it. The bar is redrawn at most every ``REFRESH_S`` seconds, which is also
the only time the loop reads the best figure of merit for it from the device. Progress lines
go to the log every ``log_every`` steps or, with ``log_every=None``, every ``LOG_EVERY_S``
seconds (so a short fit logs none and a long cluster job's log never looks dead).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import time

import jax
import numpy as np

from ..common import log
from ..common.status import Status

__all__ = ["Display", "interactive", "fits_of", "REFRESH_S", "LOG_EVERY_S"]

REFRESH_S = 0.2
LOG_EVERY_S = 30.0  # a progress line this often with log_every=None (the default)
_ROWS_PER_FIT: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "multistart_rows_per_fit", default=None
)


@contextlib.contextmanager
def fits_of(rows: int):
    """Within the block, a search's rows are a batch of fits of ``rows`` starts each
    (``curve_fit(batched=True)``): its progress says fits done and left, not a best over all
    of them (which would be the best over different datasets)."""
    token = _ROWS_PER_FIT.set(int(rows))
    try:
        yield
    finally:
        _ROWS_PER_FIT.reset(token)


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


class Display:
    """The bar and the progress lines of one run (only process 0 of a job draws the bar).

    Args:
      options: the search's options (``log_every``, ``progress``, ``n_steps``).
      n: the number of starts; ``initial``: the step the run starts at (a resumed search's).
    """

    def __init__(self, options, *, n: int, initial: int):
        shown = interactive() if options.progress is None else options.progress
        self.every, self.n_steps, self.n = options.log_every, options.steps, n
        self.t_last, self.evals_last = time.perf_counter(), 0
        self.evals = 0  # evaluations stepped by this run (for the rates shown)
        self._bar, self._drawn, self._step = None, 0.0, initial
        self.per_fit = _ROWS_PER_FIT.get()
        self._t0 = time.perf_counter()
        if shown and jax.process_index() == 0:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=self.n_steps, initial=initial, unit="step", desc="multistart", leave=True
            )

    def swept(self, rows: int) -> None:
        self.evals += rows

    def due(self, step: int, last: bool, by_steps_only: bool) -> tuple[bool, bool]:
        """``(line, bar)``: is a progress line or a redraw due? ``by_steps_only``: by the step
        count alone (a mesh over several processes syncs on no clock)."""
        if by_steps_only:
            return self._line_due_by_steps(step, last), False
        redraw = self._bar is not None and time.perf_counter() - self._drawn >= REFRESH_S
        return self._line_due(step, last), redraw or last

    def _line_due(self, step: int, last: bool) -> bool:
        if self.every is None:
            return time.perf_counter() - self.t_last >= LOG_EVERY_S
        return self._line_due_by_steps(step, last)

    def _line_due_by_steps(self, step: int, last: bool) -> bool:
        every = self.every
        return every is not None and every > 0 and (step % every == 0 or last)

    def report(self, step: int, best: float, status: np.ndarray, extra: str = "") -> None:
        """A progress line if one is due, and a redraw: the step, the best, the starts alive,
        the rate, and ``extra`` (the rungs' occupancy under the halving schedule)."""
        alive = int(np.sum(status == Status.RUNNING.code))
        now = time.perf_counter()
        if self._line_due(step, step == self.n_steps):
            if log.logger.isEnabledFor(logging.INFO):
                rate = (self.evals - self.evals_last) / max(now - self.t_last, 1e-12)
                conv = int(np.sum(status == Status.CONVERGED.code))
                stalled = int(np.sum(status == Status.STALLED.code))
                if self.per_fit is None:
                    line = log.progress_line(
                        step, self.n_steps, best, alive, conv, self.n, rate, stalled=stalled
                    )
                else:
                    done, fits = self._fits_done(status)
                    line = log.batch_progress_line(step, self.n_steps, done, fits, alive, rate)
                log.logger.info(f"{line}  {extra}" if extra else line)
            self.t_last, self.evals_last = now, self.evals
        if self._bar is not None:
            rate = self.evals / max(now - self._t0, 1e-12)
            if self.per_fit is None:
                text = f"best {best:.6g}, running {alive}/{self.n}, {rate:.3g} evals/s"
            else:
                done, fits = self._fits_done(status)
                text = f"fits done {done}/{fits}, {rate:.3g} evals/s"
            self._bar.set_postfix_str(f"{text}, {extra}" if extra else text, refresh=False)
            self._bar.update(step - self._step)
            self._step, self._drawn = step, now

    def _fits_done(self, status: np.ndarray) -> tuple[int, int]:
        """``(done, n_fits)``: the fits none of whose starts still runs."""
        k = int(self.per_fit or 1)
        running = np.asarray(status)[: self.n - self.n % k] == Status.RUNNING.code
        by_fit = running.reshape(-1, k).any(axis=1)
        return int(by_fit.size - by_fit.sum()), int(by_fit.size)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
