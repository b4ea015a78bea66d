import subprocess
import sys

import numpy as np
import pytest

from multistart.device.chunking import chunk_indices, chunk_slices, pad_rows


def test_contract_examples():
    assert chunk_slices(10, 4) == [(0, 4, 0), (4, 8, 0), (8, 10, 2)]
    assert chunk_slices(3, 8) == [(0, 3, 5)]
    assert chunk_slices(0, 4) == []
    assert chunk_slices(8, 4) == [(0, 4, 0), (4, 8, 0)]
    assert chunk_slices(5, 1) == [(i, i + 1, 0) for i in range(5)]


@pytest.mark.parametrize("n_rows", range(0, 23))
@pytest.mark.parametrize("batch_size", [1, 2, 3, 4, 7, 8, 30])
def test_cover_every_row_once_with_full_chunks(n_rows, batch_size):
    chunks = chunk_slices(n_rows, batch_size)
    covered = [i for lo, hi, _ in chunks for i in range(lo, hi)]
    assert covered == list(range(n_rows))
    assert all(hi - lo + pad == batch_size for lo, hi, pad in chunks)
    assert all(pad == 0 for _, _, pad in chunks[:-1])


@pytest.mark.parametrize(
    "args", [(-1, 4), (4, 0), (4, -2), (4, 2.0), (4.0, 2), (True, 2), (4, True), (4, "4")]
)
def test_bad_arguments(args):
    with pytest.raises(ValueError, match="n_rows|batch_size"):
        chunk_slices(*args)


def test_chunk_indices_pad_repeats_and_drops():
    pairs = chunk_indices(np.array([1, 4, 6, 9, 11]), 3, 12)
    assert [g.tolist() for g, _ in pairs] == [[1, 4, 6], [9, 11, 11]]
    assert [s.tolist() for _, s in pairs] == [[1, 4, 6], [9, 11, 12]]
    assert all(g.dtype == np.int32 and s.dtype == np.int32 for g, s in pairs)
    with pytest.raises(ValueError, match="rows must lie"):
        chunk_indices(np.array([0, 12]), 3, 12)


def test_pad_rows_repeats_the_last_row():
    x = np.arange(6).reshape(3, 2)
    padded = pad_rows(x, 2)
    assert padded.tolist() == [[0, 1], [2, 3], [4, 5], [4, 5], [4, 5]]
    assert pad_rows(x, 0) is x
    with pytest.raises(ValueError, match="empty"):
        pad_rows(x[:0], 1)


_NO_JAX_SCRIPT = """
import importlib.util, sys, types
# Load multistart.device.chunking without running multistart/__init__.py, which imports JAX.
spec = importlib.util.find_spec("multistart")
pkg = types.ModuleType("multistart")
pkg.__path__ = list(spec.submodule_search_locations)
sys.modules["multistart"] = pkg
import multistart.device.chunking as chunking
assert chunking.chunk_slices(10, 4)[-1] == (8, 10, 2)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib"))
print(loaded)
sys.exit(1 if loaded else 0)
"""


@pytest.mark.subprocess
def test_chunking_imports_no_jax():
    proc = subprocess.run([sys.executable, "-c", _NO_JAX_SCRIPT], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
