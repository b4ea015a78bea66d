"""Worked example: the multi-band demo, a galaxy seen in three bands fitted as one factor graph.

Runs what ``multistart demo`` runs (``MultiStartProdigy`` on the demo's factor graph: 24x24,
32x32 and 48x48 pixel bands, shape shared, fluxes per band) into a temporary folder and asserts
the outcome: the best fit is at least as good as the truth (its figure of merit, chi-squared
minus twice the log-prior, is no worse than at the true parameters), the search compiled its
step once, every output was written and the saved result reloads. Run
``python workspace_tests/multiband_demo.py`` (add ``--quick`` for the CI size).
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

import multistart as ms
from multistart import demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small, for CI")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as out:
        run = demo.run(out, quick=args.quick, quiet=True)
        result, truth_fom = run.result, run.truth_fom
        assert result.stats["n_compiles"] == 1, result.stats
        # Noise moves the optimum away from the truth, so the best fit must do at least as well.
        assert result.best_fom <= truth_fom + 1e-4 * abs(truth_fom), (result.best_fom, truth_fom)
        centre = np.asarray(result.best_params["centre"])
        assert np.all(np.abs(centre - demo.TRUTH["centre"]) < 0.02), centre
        for path in run.files.values():
            assert path.stat().st_size > 0, path
        loaded = ms.Result.load(run.files["result"])
        np.testing.assert_array_equal(loaded.foms, result.foms)
        print(
            f"fom at best fit {result.best_fom:.3f}, at truth {truth_fom:.3f}; {run.wall_s:.1f} s"
        )


if __name__ == "__main__":
    main()
