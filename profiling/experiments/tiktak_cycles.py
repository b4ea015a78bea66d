"""L-BFGS's default with other rounds of TikTak's weights, candidate counts, rediscovery stops
and second-pool shares, on scipy's global-optimisation suite.

``start_strategy="band_tiktak"`` runs ``BAND_TIKTAK_CYCLES`` rounds of TikTak's weight
schedule (``multistart.host.config``, 3) from ``BAND_TIKTAK_CANDIDATES_PER_START x n_starts``
candidates (15), stops once its best is re-found ``TIKTAK_DISCOVERIES`` times (4), and starts
every ``TIKTAK_EXPLORE_EVERY``-th local search (3) from the second pool over the box. This
patches those constants to ``--cycles``, ``--candidates``, ``--discoveries`` and
``--explore-every`` (``n_local`` is capped by the candidates) and runs ``go_suite.py`` with the
rest of the command line, so the suite's own table gives the solved runs and the median
evaluations to set beside a run of ``go_suite.py`` itself. The defaults before 2026-12-06 (two
rounds, 10 candidates a slot):

    MULTISTART_GO_DIR=PATH python profiling/experiments/tiktak_cycles.py --cycles 2 \\
        --candidates 10 --arms ours --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # profiling/: go_suite

import go_suite  # noqa: E402

import multistart.host.config as config  # noqa: E402
import multistart.host.engine as engine  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=config.BAND_TIKTAK_CYCLES)
    parser.add_argument("--candidates", type=int, default=config.BAND_TIKTAK_CANDIDATES_PER_START)
    parser.add_argument("--discoveries", type=int, default=config.TIKTAK_DISCOVERIES)
    parser.add_argument("--explore-every", type=int, default=config.TIKTAK_EXPLORE_EVERY)
    args, rest = parser.parse_known_args()
    config.BAND_TIKTAK_CYCLES = args.cycles
    config.BAND_TIKTAK_CANDIDATES_PER_START = args.candidates
    config.TIKTAK_DISCOVERIES = args.discoveries
    engine.TIKTAK_EXPLORE_EVERY = args.explore_every  # the engine holds its own name
    go_suite.main(rest)
