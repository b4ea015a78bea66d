# The search classes' signatures for static tools (IDEs, type checkers), which do not
# run the code that makes them: written by `python tests/api_snapshot.py` from the
# classes; tests/test_search.py checks that they agree.

import os
from collections.abc import Sequence
from typing import Any

from ..host.schedule import Schedule
from ..solvers.convergence import Convergence
from .gradient import MultiStartGradient
from .residuals import LeastSquaresSearch

__all__ = [
    "MultiStartLeastSquares",
]

class MultiStartLeastSquares(LeastSquaresSearch, MultiStartGradient):
    def __init__(
        self,
        *,
        method="lm",
        ftol: float | None = None,
        xtol: float | None = None,
        gtol: float | None = None,
        jacobian: str | None = None,
        covariance: str = "gauss-newton",
        n_starts: int = 32,
        batch_size: int | str | None = "auto",
        backend: str = "loop",
        n_steps: int | str = "auto",
        seed: int = 0,
        convergence: Convergence | None | str = "auto",
        max_nonfinite: int = 8,
        schedule: str | Schedule = "all",
        start_band: tuple[float, float] = (0.15, 0.85),
        start_strategy: str = "auto",
        n_candidates: int | None = None,
        max_candidates: int | None = None,
        filter_batch_size: int | None = None,
        resurrect: int = 0,
        n_local: int | None = None,
        local_steps: int | None = None,
        max_discoveries: int | str | None = "auto",
        target_fom: float | None = None,
        max_evals: int | None = None,
        max_time_s: float | None = None,
        rediscoveries: int | None = None,
        sync_every: int = 1,
        steps_per_call: int | str = "auto",
        flat: bool = True,
        absolute_sigma: bool | None = None,
        n_data: int | None = None,
        max_history: int = 10000,
        log_every: int | None = None,
        progress: bool | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 100,
        devices: int | Sequence[Any] | None = None,
        dtype: str | None = None,
    ) -> None: ...
