"""Every Result field of a fixed set of fits, as a digest, to compare two versions of the library.

Issue 32 (one run state) rewrote the host side of a fit; its measure is that every result is
bit-identical before and after. This script runs one fit of each kind the host side handles
differently (L-BFGS, Adam, least squares, halving, TikTak, resurrection, a part merge, a
checkpointed run resumed mid-way with pruning and refills pending, two logical devices in a
subprocess) and writes, per fit, a SHA-256 of every Result field (figures of merit, parameters,
statuses, evaluation counts, history, incarnations, rungs, and the statistics that are not times)
to a JSON file. Run it from the repository root on two checkouts and compare the files::

    python tests/run_state_parity.py --out after.json
    PYTHONPATH=/path/to/other/checkout/src python tests/run_state_parity.py --out before.json
    python tests/run_state_parity.py --compare before.json after.json

(exit status 1 when a result differs). Only the public API is used, so any version of the
library runs it: the library imported is the one ``PYTHONPATH`` finds first (printed on stderr;
a checkout from before the ``src/`` layout is named without ``/src``).
It is a correctness check, not a benchmark (no time in it), so it lives with the tests; it was
``profiling/run_state_parity.py`` until the benchmarks became a suite. The compile counts (which
may change without changing a result) are kept apart, under ``"compiles"``, and compared apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from functools import partial

os.environ.setdefault("MULTISTART_CACHE_DIR", "")  # no tuning records, no persistent cache
os.environ.setdefault("MULTISTART_LOG_LEVEL", "WARNING")

# Every field of the Result but those that describe the run (stats, paths, config) or are
# written out below; read from the Result itself, so the check runs against any version.
NOT_FIELDS = ("stats", "paths", "config", "incarnations", "best_fom", "best_index")
COMPILES = (
    "n_compiles",
    "n_compiles_total",
    "n_tune_compiles",
    "n_filter_compiles",
    "n_replace_compiles",  # a stat of versions before 9c635b9: kept so they compare
    "n_cache_hits",
)
NOT_RESULTS = ("width_choice", "tuning", "parts")  # times inside, or per-part times


def _hash(value) -> str | None:
    import jax
    import numpy as np

    if value is None:
        return None
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(value):
        a = np.asarray(leaf)
        if a.dtype == object:
            a = np.array([str(v) for v in a.ravel()], dtype=str).reshape(a.shape)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(str(jax.tree_util.tree_structure(value)).encode())
    return h.hexdigest()[:20]


def digest(result) -> dict:
    """Every field of ``result`` as hashes and plain values; times and compiles left out."""
    names = [f.name for f in dataclasses.fields(result) if f.name not in NOT_FIELDS]
    out: dict = {name: _hash(getattr(result, name)) for name in names}
    out["best_fom"] = repr(float(result.best_fom))
    out["best_index"] = int(result.best_index)
    out["incarnations"] = [
        {k: (_hash(v) if "params" in k else str(v)) for k, v in r.items()}
        for r in result.incarnations
    ]
    stats = {
        k: v
        for k, v in result.stats.items()
        if not k.endswith("_s") and k not in COMPILES + NOT_RESULTS
    }
    out["stats"] = json.loads(json.dumps(stats, default=str))
    out["compiles"] = {k: result.stats.get(k) for k in COMPILES}
    return out


def _fits(folder: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import multistart as ms

    jax.config.update("jax_enable_x64", True)
    quiet = dict(log_every=0, progress=False)

    def rosenbrock(p):
        x = p["x"]
        return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

    def multimodal(p):
        x = p["x"]
        return jnp.sum(x**2 - 2.0 * jnp.cos(3.0 * x)) + 0.1 * p["y"] ** 2

    centres, depths = jnp.array([1.0, 1.7, 2.4, 3.1]), jnp.array([3.0, 2.0, 1.0, 0.0])

    def bowls(p):
        return jnp.min(8.0 * (p["x"] - centres) ** 2 + depths) + 0.0 * jnp.sum(p["y"])

    def nan_right(p):
        x = p["x"]
        return jnp.where(x[0] > 1.0, jnp.nan, jnp.sum((x - 0.5) ** 2))

    def cliff(p):  # finite at every start, but steps to the right of 1 fall into nan
        return jnp.where(p["x"] > 1.0, jnp.nan, (p["x"] - 1.0) ** 2 - 3.0 * p["x"])

    t = np.linspace(0.0, 4.0, 40)
    y = 3.0 * np.exp(-t / 1.3) + 0.4 + 0.05 * np.random.default_rng(0).normal(size=t.size)

    def residuals(p):
        return (p["a"] * jnp.exp(-t / p["tau"]) + p["c"] - y) / 0.05

    rosen_space = {"x": ms.Uniform(-2.0, 2.0, shape=(4,))}
    multi_space = {"x": ms.Uniform(-4.0, 4.0, shape=(3,)), "y": ms.Normal(0.0, 1.0)}
    bowl_space = {"x": ms.Uniform(0.0, 4.0), "y": ms.Uniform(-1.0, 1.0)}
    nan_space = {"x": ms.Uniform(-4.0, 4.0, shape=(2,))}
    ls_space = {"a": ms.Uniform(0.0, 10.0), "tau": ms.LogUniform(0.1, 10.0), "c": ms.Uniform(-2, 2)}
    halving = ms.Halving(r0=8, eta=2, grace=1.0)
    bowl = dict(n_starts=12, batch_size=4, n_steps=120, seed=3, n_candidates=0, **quiet)
    bowl_adam = dict(learning_rate=0.03, convergence=ms.Convergence(window=20, rtol=1e-7))
    nan = dict(n_starts=6, batch_size=4, n_steps=150, seed=0, n_candidates=0, **quiet)

    def adam(**kw):
        return ms.MultiStartAdam(**{**bowl, **bowl_adam, **kw})

    fits = {
        "lbfgs": lambda: ms.MultiStartLBFGS(
            n_starts=8, batch_size=3, n_steps=80, seed=1, **quiet
        ).fit(rosenbrock, rosen_space),
        "adam_filter": lambda: ms.MultiStartAdam(
            n_starts=10, batch_size=4, n_steps=150, seed=2, **quiet
        ).fit(multimodal, multi_space),
        "adam_scan_tree": lambda: ms.MultiStartAdam(
            n_starts=6, batch_size=4, n_steps=60, seed=2, backend="scan", flat=False, **quiet
        ).fit(multimodal, multi_space),
        "least_squares": lambda: ms.MultiStartLeastSquares(
            n_starts=5, batch_size=2, n_steps=60, seed=0, **quiet
        ).fit(residuals, ls_space),
        "halving": lambda: adam(schedule=halving).fit(bowls, bowl_space),
        "halving_lbfgs": lambda: ms.MultiStartLBFGS(
            n_starts=8,
            batch_size=4,
            n_steps=80,
            seed=1,
            n_candidates=0,
            schedule=ms.Halving(r0=6, eta=2),
            **quiet,
        ).fit(rosenbrock, rosen_space),
        "tiktak": lambda: ms.MultiStartLBFGS(
            n_starts=5,
            batch_size=2,
            n_steps=60,
            seed=4,
            start_strategy="tiktak",
            n_local=16,
            local_steps=6,
            max_discoveries=4,
            **quiet,
        ).fit(multimodal, multi_space),
        "tiktak_halving": lambda: adam(
            schedule=halving, start_strategy="tiktak", n_candidates=48
        ).fit(bowls, bowl_space),
        "resurrect": lambda: ms.MultiStartAdam(**nan, resurrect=2).fit(nan_right, nan_space),
        "resurrect_filter": lambda: ms.MultiStartAdam(
            n_starts=4, batch_size=3, n_steps=200, seed=0, resurrect=3, learning_rate=0.3, **quiet
        ).fit(cliff, {"x": ms.Uniform(-2.0, 2.0)}),
        "resurrect_budget": lambda: ms.MultiStartAdam(
            **nan, resurrect=2, sync_every=3, max_evals=500
        ).fit(nan_right, nan_space),
        "merge": lambda: ms.Result.merge(
            [
                ms.MultiStartAdam(n_starts=7, batch_size=3, n_steps=50, seed=5, **quiet).fit(
                    multimodal, multi_space, part=(i, 3)
                )
                for i in range(3)
            ]
        ),
    }
    # The same kinds of fit in one chunk as wide as the population (stepped where it lies)
    one_chunk = dict(n_starts=8, batch_size=8, n_steps=80, seed=1, **quiet)
    fits.update(
        whole_lbfgs=lambda: ms.MultiStartLBFGS(**one_chunk).fit(rosenbrock, rosen_space),
        whole_least_squares=lambda: ms.MultiStartLeastSquares(**one_chunk).fit(residuals, ls_space),
        whole_halving=lambda: adam(schedule=halving, batch_size=12).fit(bowls, bowl_space),
        whole_tiktak=lambda: ms.MultiStartLBFGS(
            **{**one_chunk, "n_starts": 5, "batch_size": 5},
            start_strategy="tiktak",
            n_local=16,
            local_steps=6,
            max_discoveries=4,
        ).fit(multimodal, multi_space),
        whole_resurrect=lambda: ms.MultiStartAdam(**{**nan, "batch_size": 6}, resurrect=2).fit(
            nan_right, nan_space
        ),
        whole_scan=lambda: ms.MultiStartAdam(
            n_starts=6, batch_size=6, n_steps=400, seed=2, backend="scan", **quiet
        ).fit(multimodal, multi_space),
    )
    out = {name: digest(fit()) for name, fit in fits.items()}

    def resumed(name, make, stop_at, fit_args):
        ck = dict(checkpoint_dir=os.path.join(folder, name), checkpoint_every=10)
        make(**ck, n_steps=stop_at).fit(*fit_args)
        return make(**ck).fit(*fit_args, resume=True)

    def halved(**kw):
        return adam(schedule=halving, **kw)

    def resurrecting(**kw):
        return ms.MultiStartAdam(**{**nan, "sync_every": 3, **kw}, resurrect=2)

    def tiktak(**kw):
        return ms.MultiStartLBFGS(
            **{**dict(n_starts=5, batch_size=2, n_steps=60, seed=4, **quiet), **kw},
            start_strategy="tiktak",
            n_local=16,
            local_steps=6,
        )

    for name, make, stop_at, args in (
        ("resume_halving_pending", halved, 32, (bowls, bowl_space)),
        ("resume_halving_mid_rung", halved, 17, (bowls, bowl_space)),
        ("resume_resurrect_pending", resurrecting, 30, (nan_right, nan_space)),
        ("resume_tiktak", tiktak, 25, (multimodal, multi_space)),
        ("whole_resume_tiktak", partial(tiktak, batch_size=5), 25, (multimodal, multi_space)),
    ):
        out[name] = digest(resumed(name, make, stop_at, args))

    def saved_and_loaded():
        path = os.path.join(folder, "saved.npz")
        ms.MultiStartAdam(n_starts=4, batch_size=2, n_steps=40, seed=0, **quiet).fit(
            multimodal, multi_space
        ).save(path)
        loaded = ms.Result.load(path)
        return {**digest(loaded), "errors": _hash(loaded.errors)}

    out["saved_and_loaded"] = saved_and_loaded()
    out.update(_curve_fits())
    return out


def _curve_fits() -> dict:
    """curve_fit's answers (popt, pcov, the record's fields): a single fit, a held one, a
    batch with a shared and a per-fit sigma, ties and a fixed parameter."""
    import jax.numpy as jnp
    import numpy as np

    import multistart as ms

    def peak(x, a, mu, w, b):
        return a * jnp.exp(-0.5 * ((x - mu) / w) ** 2) + b

    rng = np.random.default_rng(7)
    x = np.linspace(-3.0, 3.0, 40)
    truths = rng.uniform((1.0, -1.5, 0.3, -0.5), (3.0, 1.5, 1.0, 0.5), size=(6, 4))
    y = np.stack([t[0] * np.exp(-0.5 * ((x - t[1]) / t[2]) ** 2) + t[3] for t in truths])
    y = y + rng.normal(0.0, 0.1, y.shape)
    box = ([0.0, -3.0, 0.05, -2.0], [10.0, 3.0, 5.0, 2.0])
    quiet = dict(log_every=0, progress=False)
    out = {}

    def record(name, popt, pcov, info=None):
        row = {"popt": _hash(np.asarray(popt)), "pcov": _hash(np.asarray(pcov))}
        if info is not None and "fits" in info:
            fits = info["fits"]
            for key in ("best_fom", "dof", "status", "at_bound", "n_evals", "best_row"):
                row[key] = _hash(np.asarray(getattr(fits, key)))
            row["result"] = digest(fits.result)
        elif info is not None:
            row["result"] = digest(info["result"])
        out[name] = row

    popt, pcov, info, _, _ = ms.curve_fit(
        peak, x, y[0], p0=(1, 0, 1, 0), bounds=box, n_starts=6, seed=1, full_output=True, **quiet
    )
    record("curve_fit", popt, pcov, info)
    popt, pcov = ms.curve_fit(
        peak,
        x,
        y[1],
        p0=(1, 0, 1, 0),
        sigma=np.full(x.size, 0.1),
        absolute_sigma=True,
        n_starts=4,
        seed=2,
        fixed={"b": 0.0},
        **quiet,
    )
    record("curve_fit_fixed_unbounded", popt, pcov)
    popt, pcov, info, _, _ = ms.curve_fit(
        peak,
        x,
        y,
        p0=(1, 0, 1, 0),
        bounds=box,
        n_starts=3,
        batched=True,
        seed=3,
        full_output=True,
        **quiet,
    )
    record("curve_fit_batch", popt, pcov, info)
    popt, pcov, info, _, _ = ms.curve_fit(
        peak,
        x,
        y,
        p0=(1, 0, 1, 0),
        bounds=box,
        sigma=np.full(y.shape, 0.1),
        n_starts=2,
        batched=True,
        seed=4,
        tied={"b": lambda p: 0.1 * p["a"]},
        full_output=True,
        **quiet,
    )
    record("curve_fit_batch_tied", popt, pcov, info)
    return out


def _devices() -> dict:
    """Two logical CPU devices (this script again, in a child process)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    code = subprocess.run(
        [sys.executable, __file__, "--child-devices"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if code.returncode:
        raise RuntimeError(f"the two-device child failed:\n{code.stdout}\n{code.stderr}")
    return json.loads(code.stdout.strip().splitlines()[-1])


def _child_devices() -> None:
    import jax
    import jax.numpy as jnp

    import multistart as ms

    jax.config.update("jax_enable_x64", True)
    assert jax.device_count() == 2, jax.devices()

    def multimodal(p):
        x = p["x"]
        return jnp.sum(x**2 - 2.0 * jnp.cos(3.0 * x)) + 0.1 * p["y"] ** 2

    space = {"x": ms.Uniform(-4.0, 4.0, shape=(3,)), "y": ms.Normal(0.0, 1.0)}
    quiet = dict(log_every=0, progress=False)
    out = {
        "devices_adam": digest(
            ms.MultiStartAdam(n_starts=9, batch_size=2, n_steps=60, seed=1, devices=2, **quiet).fit(
                multimodal, space
            )
        ),
        "devices_tiktak_halving": digest(
            ms.MultiStartLBFGS(
                n_starts=6,
                batch_size=2,
                n_steps=60,
                seed=4,
                devices=2,
                start_strategy="tiktak",
                n_local=14,
                local_steps=8,
                schedule=ms.Halving(r0=4, eta=2),
                **quiet,
            ).fit(multimodal, space)
        ),
    }
    print(json.dumps(out))


def compare(before: dict, after: dict) -> int:
    """Print every difference; returns how many results differ (compiles are only shown)."""
    differ = 0
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            print(f"{name}: only in {'after' if a is None else 'before'}")
            differ += 1
            continue
        fields = [k for k in sorted(set(a) | set(b)) if k != "compiles" and a.get(k) != b.get(k)]
        if fields:
            differ += 1
            print(f"{name}: DIFFERENT in {', '.join(fields)}")
            for k in fields:
                print(f"  {k}: {a.get(k)!r}\n  {' ' * len(k)}  {b.get(k)!r}")
        else:
            print(f"{name}: identical")
        if a.get("compiles") != b.get("compiles"):
            print(f"  compiles: {a.get('compiles')} -> {b.get('compiles')}")
    print(f"{len(set(before) | set(after)) - differ} identical, {differ} different")
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the digests here (JSON)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--child-devices", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_devices:
        _child_devices()
        return
    if args.compare:
        with open(args.compare[0]) as f, open(args.compare[1]) as g:
            sys.exit(1 if compare(json.load(f), json.load(g)) else 0)
    import multistart

    print(f"multistart from {os.path.dirname(multistart.__file__)}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="multistart-parity-") as folder:
        out = _fits(folder)
    out.update(_devices())
    text = json.dumps(out, indent=1, sort_keys=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(f"{len(out)} fits digested" + (f" into {args.out}" if args.out else ""))


if __name__ == "__main__":
    main()
