"""The README's examples run as printed, print what it shows, and find the line it describes."""

import numpy as np
import pytest
from markdown_blocks import ROOT, python_blocks, run_page

README = ROOT / "README.md"


@pytest.fixture(scope="module")
def readme(tmp_path_factory):
    """Every python block of the README, run once in order (a checkpoint folder lands in a
    temporary directory); each block's printed output is checked against the page."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("readme"))
        mp.setenv("MULTISTART_LOG_LEVEL", "WARNING")
        mp.setenv("MULTISTART_AUTO_WIDTH", "memory")
        return run_page(README)


def test_every_readme_block_runs_and_prints_what_the_readme_shows(readme):
    _, ran = readme
    blocks = python_blocks(README)
    assert len(ran) == len(blocks) and all(b.output is not None for b in blocks), (
        "every README example runs and shows its output"
    )


def test_the_first_example_finds_the_line(readme):
    namespace, _ = readme
    result = namespace["result"]
    assert abs(float(result.best_params["centre"]) - 37.0) < 0.5
    assert abs(float(result.best_params["width"]) - 4.0) < 0.5
    assert result.stats["n_compiles"] == 1 and np.isfinite(result.best_fom)
    # its error bars are those of a peak this well sampled: a few hundredths of a pixel
    assert 0.0 < result.errors["centre"] < 0.1


def test_the_readme_stays_a_newcomers_page():
    # the newcomer's path at most 12 KB; the rest belongs in docs/
    assert len(README.read_bytes()) <= 12 * 1024, "move detail from the README to docs/"
