"""The README's example runs as printed and finds the line it describes."""

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README lost its example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    result = namespace["result"]
    assert abs(float(result.best_params["centre"]) - 37.0) < 0.5
    assert abs(float(result.best_params["sigma"]) - 4.0) < 0.5
    assert result.stats["n_compiles"] == 1 and np.isfinite(result.best_fom)
