"""L-BFGS's default with more rounds of TikTak's weights, on scipy's global-optimisation suite.

``start_strategy="band_tiktak"`` runs ``BAND_TIKTAK_CYCLES`` rounds of TikTak's weight
schedule (``multistart.host.config``, 2). This patches the constant to ``--cycles`` (its
``n_local`` is then capped by the ``10 * n_starts`` candidates) and runs ``go_suite.py`` with
the rest of the command line, so the suite's own table gives the solved runs and the median
evaluations to set beside a run of ``go_suite.py`` itself.

    MULTISTART_GO_DIR=PATH python profiling/experiments/tiktak_cycles.py --cycles 3 \\
        --arms ours --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # profiling/: go_suite

import go_suite  # noqa: E402

import multistart.host.config as config  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=config.BAND_TIKTAK_CYCLES)
    args, rest = parser.parse_known_args()
    config.BAND_TIKTAK_CYCLES = args.cycles
    go_suite.main(rest)
