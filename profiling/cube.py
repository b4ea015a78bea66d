"""An integral-field cube as an astronomer fits it (issue 72): missing data left in, every fit
reported, against scipy's and lmfit's loops on the same cube.

The cube (ours, drawn here): ``--size`` x ``--size`` spaxels (default 48 x 48) x 250 channels
over 6525-6625 Å around H-alpha. Each spectrum: H-alpha and the [NII] doublet (6548, 6583 Å)
with one velocity ``v`` and one dispersion ``disp`` (km/s, an instrumental 40 km/s added in
quadrature), the 6548 line tied to a third of 6583's (``tied={"n1": n2 / 3}``), a linear
continuum (``c0, c1``): 6 free parameters of 7. A rotating disc: ``v`` up to 200 km/s,
``disp`` 60-120 km/s, H-alpha falling from 40 to 5 times the noise at the disc's edge, [NII]
0.35 of it. Outside the disc, sky spaxels (continuum and noise, no line). Missing data, as a
reduced cube has them: a dead column and 1 % of the spaxels dead (every channel nan: 3 % of
the spaxels at 48 x 48), and 1-3 nan channels (cosmic rays) in 10 % of the others. Noise
known per spaxel (0.8-1.2), ``sigma`` given, ``absolute_sigma=True``; one ``p0`` and one box
for every fit.

Arms, side by side in one run, in this process, with a ``MULTISTART_CACHE_DIR`` of its own
(empty at the first arm's first call: no program and no width on record; a later arm finds the
width records the earlier ones left, but its stack's other shape compiles every program anew):

  scipy        ``scipy.optimize.curve_fit`` (trf, the box) looped over the spaxels with the nan
               channels dropped from each (the fully masked ones skipped), one start each, one
               BLAS thread (``harness.one_blas_thread``); timed before the arms and after each,
               the ratios against the median of those loops
  lmfit        lmfit's ``Model`` looped with ``nan_policy="omit"`` (the tie an ``expr``),
               ``scale_covar=False`` (the errors from sigma, as ``absolute_sigma``)
  N starts     ``ms.curve_fit(batched=True, nan_policy="omit", n_starts=N)`` with the nan left
               in: the first call (``first``: its compiles), then a call on a new cube of the
               same shapes (``second``); ``default`` is the batch's default number of starts

Each row: the wall against scipy's loop; over the line spaxels with data (S/N >= 5), the
share whose ``v`` and ``disp`` both lie within 3 of their errors of the truth (a Gaussian
99.73 %), the pulls ``(fit - truth) / error`` of ``v`` and ``disp`` (median, and spread as
1.4826 MAD); the fits as good as scipy's (χ² at most scipy's, to 1e-6); the spaxels reported
masked. Checked, and printed: every arm's degrees of freedom per spaxel equal scipy's
(points left minus free parameters), every fully masked spaxel reported ``no_data``. Then, for
each of our arms, issue 72's measures: within 3σ within 0.2 points of scipy's share, pulls of
median 0 ± 0.05 and spread 1 ± 0.05, and the wall against scipy's loop (one start, warm:
at most 0.1x; the defaults on new data: at most 1x).

    python profiling/cube.py                      # 48 x 48 spaxels, 1 start and the default
    python profiling/cube.py --starts 1,2,4,8,32  # the batch's number of starts, measured
    python profiling/cube.py --quick --json cube.json   # 10 x 10 spaxels; the record
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("MULTISTART_LOG_LEVEL", "ERROR")

import harness  # noqa: E402

C = 299792.458  # km/s
HA, N2B, N2A = 6562.80, 6583.45, 6548.05
INSTRUMENT = 40.0  # km/s, added in quadrature
X = np.linspace(6525.0, 6625.0, 250)
NAMES = ("v", "disp", "ha", "n2", "n1", "c0", "c1")
P0 = [0.0, 100.0, 10.0, 3.0, 1.0, 5.0, 0.0]
LOWER = [-600.0, 5.0, 0.0, 0.0, 0.0, -50.0, -50.0]
UPPER = [600.0, 400.0, 500.0, 500.0, 500.0, 200.0, 50.0]
QUICK_SIZE = 10  # --quick: spaxels a side
SN_CUT = 5.0  # a line spaxel whose H-alpha peaks at this many times its noise counts


def spectrum(xp, x, v, disp, ha, n2, n1, c0, c1):
    """The three lines (one velocity and dispersion) on a linear continuum."""
    width = xp.sqrt(disp**2 + INSTRUMENT**2) / C

    def line(rest, a):
        centre = rest * (1.0 + v / C)
        return a * xp.exp(-0.5 * ((x - centre) / (rest * width)) ** 2)

    return line(HA, ha) + line(N2B, n2) + line(N2A, n1) + c0 + c1 * (x - 6575.0) / 50.0


def model(x, v, disp, ha, n2, n1, c0, c1):
    import jax.numpy as jnp

    return spectrum(jnp, x, v, disp, ha, n2, n1, c0, c1)


def doublet(p):
    """[NII] 6548 at a third of 6583 (a tie, one function: no recompile between calls)."""
    return p["n2"] / 3.0


def scipy_model(x, v, disp, ha, n2, c0, c1):
    return spectrum(np, x, v, disp, ha, n2, n2 / 3.0, c0, c1)


def cube(size: int, seed: int):
    """``(truth (n, 7), ydata (n, 250) with nan, sigma (n, 250), line (n,) bool)``: the
    spaxels in C order of the ``size x size`` grid."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] * (48.0 / size)  # the same disc at every size
    dx, dy = xx - 23.5, (yy - 23.5) / 0.7  # inclined: an ellipse on the sky
    r = np.hypot(dx, dy).ravel()
    cos = np.where(r > 0, dx.ravel() / np.maximum(r, 1e-9), 0.0)
    n = size * size
    line = r < 17.0
    truth = np.zeros((n, 7))
    truth[:, 0] = 200.0 * np.tanh(r / 6.0) * cos + rng.normal(0.0, 5.0, n)
    truth[:, 1] = 60.0 + 60.0 * np.exp(-r / 5.0)
    truth[:, 2] = np.where(line, 40.0 * np.exp(-r / 8.0), 0.0)
    truth[:, 3] = 0.35 * truth[:, 2]
    truth[:, 4] = truth[:, 3] / 3.0
    truth[:, 5] = 2.0 + 20.0 * np.exp(-r / 10.0)
    truth[:, 6] = rng.normal(0.0, 0.5, n)
    noise = rng.uniform(0.8, 1.2, n)
    sigma = np.repeat(noise[:, None], X.size, axis=1)
    y = np.stack([spectrum(np, X, *t) for t in truth]) + rng.normal(0.0, 1.0, sigma.shape) * sigma
    dead = np.zeros(n, dtype=bool)
    dead[np.ravel_multi_index((np.arange(size), np.full(size, size // 8)), (size, size))] = True
    dead[rng.choice(n, max(1, n // 100), replace=False)] = True
    y[dead] = np.nan
    hit = np.flatnonzero(~dead & (rng.random(n) < 0.1))
    for i in hit:  # cosmic rays: 1-3 channels
        y[i, rng.choice(X.size, rng.integers(1, 4), replace=False)] = np.nan
    return truth, y, sigma, line & ~dead & (truth[:, 2] >= SN_CUT * noise)


# -- the arms ---------------------------------------------------------------------------------


def scipy_loop(y, sigma):
    """``(wall, popt (n, 7), errors (n, 7), dof (n,))``: nan channels dropped per spaxel."""
    import scipy.optimize

    n = len(y)
    popt, errors = np.full((n, 7), np.nan), np.full((n, 7), np.nan)
    dof = np.full(n, -1)
    lower, upper = np.delete(LOWER, 4), np.delete(UPPER, 4)
    with harness.one_blas_thread(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # covariance warnings of sky spaxels
        t0 = time.perf_counter()
        for i in range(n):
            keep = np.isfinite(y[i])
            if keep.sum() < 6:
                continue  # a masked spaxel: nothing to fit
            p, c = scipy.optimize.curve_fit(
                scipy_model,
                X[keep],
                y[i, keep],
                p0=np.delete(P0, 4),
                bounds=(lower, upper),
                sigma=sigma[i, keep],
                absolute_sigma=True,
            )
            popt[i] = np.insert(p, 4, p[3] / 3.0)
            errors[i] = np.insert(np.sqrt(np.diag(c)), 4, np.sqrt(c[3, 3]) / 3.0)
            dof[i] = keep.sum() - 6
        return time.perf_counter() - t0, popt, errors, dof


def lmfit_loop(y, sigma):
    """``(wall, popt, errors, dof)``: lmfit's ``Model`` with ``nan_policy="omit"``."""
    import lmfit

    n = len(y)
    popt, errors = np.full((n, 7), np.nan), np.full((n, 7), np.nan)
    dof = np.full(n, -1)
    mod = lmfit.Model(
        lambda x, v, disp, ha, n2, n1, c0, c1: spectrum(np, x, v, disp, ha, n2, n1, c0, c1)
    )
    params = mod.make_params()
    for name, p0, lo, hi in zip(NAMES, P0, LOWER, UPPER, strict=True):
        params[name].set(value=p0, min=lo, max=hi)
    params["n1"].set(expr="n2 / 3.0")
    with harness.one_blas_thread(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        for i in range(n):
            if np.isfinite(y[i]).sum() < 6:
                continue
            out = mod.fit(
                y[i], params, x=X, weights=1.0 / sigma[i], nan_policy="omit", scale_covar=False
            )
            popt[i] = [out.params[k].value for k in NAMES]
            errors[i] = [out.params[k].stderr or np.nan for k in NAMES]
            dof[i] = out.nfree
        return time.perf_counter() - t0, popt, errors, dof


def ours(y, sigma, n_starts):
    """``(wall, popt, errors, fits)``; ``n_starts`` None: the batch's default."""
    import multistart as ms

    starts = {} if n_starts is None else {"n_starts": n_starts}
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sky spaxels' bound and covariance warnings
        popt, pcov, info, _, _ = ms.curve_fit(
            model,
            X,
            y,
            p0=P0,
            sigma=sigma,
            absolute_sigma=True,
            bounds=(LOWER, UPPER),
            tied={"n1": doublet},
            nan_policy="omit",
            batched=True,
            full_output=True,
            log_every=0,
            **starts,
        )
    wall = time.perf_counter() - t0
    return wall, popt, np.sqrt(np.abs(np.diagonal(pcov, axis1=1, axis2=2))), info["fits"]


# -- what the answers are worth -------------------------------------------------------------


def quality(popt, errors, truth, valid) -> dict:
    """Over the ``valid`` spaxels: the share within 3σ of the truth in ``v`` and ``disp``, and
    the pulls' median and spread (1.4826 MAD) of each."""
    pull = (popt[valid][:, :2] - truth[valid][:, :2]) / errors[valid][:, :2]
    inside = np.all(np.abs(pull) < 3.0, axis=1) & np.all(np.isfinite(pull), axis=1)
    med = np.nanmedian(pull, axis=0)
    spread = 1.4826 * np.nanmedian(np.abs(pull - med), axis=0)
    return {"within 3σ": inside.mean(), "pull median": med, "pull spread": spread}


def chi2(popt, y, sigma) -> np.ndarray:
    fit = np.stack([spectrum(np, X, *p) for p in popt])
    return np.nansum(((fit - y) / sigma) ** 2, axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=48, help="spaxels a side")
    parser.add_argument("--starts", default="1,default", help="our arms: starts a fit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-lmfit", action="store_true")
    harness.add_arguments(parser, quick=f"{QUICK_SIZE} x {QUICK_SIZE} spaxels")
    args = parser.parse_args()
    arms = _arms(parser, args.starts)
    size = QUICK_SIZE if args.quick else args.size
    if size < 4:
        parser.error(f"--size must be at least 4; got {size}")
    os.environ["MULTISTART_CACHE_DIR"] = tempfile.mkdtemp(prefix="cube-cache-")
    import jax

    jax.config.update("jax_enable_x64", True)
    import multistart as ms
    from multistart.curve_fit.arguments import N_STARTS_BATCH

    record = harness.Record("cube", args)
    _, first, first_sigma, _ = cube(size, args.seed)
    truth, y, sigma, valid = cube(size, args.seed + 1)
    dead = ~np.isfinite(y).any(axis=1)
    wall, ref, ref_err, ref_dof = scipy_loop(y, sigma)
    _progress(f"scipy's loop {wall:.2f} s")
    walls, rows = [wall], {}
    has_lmfit = importlib.util.find_spec("lmfit") is not None  # the profiling extra's
    if not has_lmfit and not args.skip_lmfit:
        _progress("lmfit not installed (pip install -e '.[profiling]'): its arm skipped")
    if has_lmfit and not args.skip_lmfit:
        rows["lmfit"] = lmfit_loop(y, sigma)
        _progress(f"lmfit's loop {rows['lmfit'][0]:.2f} s")
        walls.append(scipy_loop(y, sigma)[0])
    for k in arms:
        name = f"{N_STARTS_BATCH if k is None else k} start{'s' * (k != 1)}"
        name += " (default)" if k is None else ""
        rows[f"{name} first"] = ours(first, first_sigma, k)
        rows[f"{name} second"] = ours(y, sigma, k)
        walls.append(scipy_loop(y, sigma)[0])
        _progress(
            f"{name}: first {rows[f'{name} first'][0]:.2f} s, second "
            f"{rows[f'{name} second'][0]:.2f} s; scipy's loop {walls[-1]:.2f} s"
        )
    wall = harness.median(walls)
    print(
        f"{size} x {size} spaxels x {X.size} channels, 6 free parameters of 7; {int(dead.sum())}"
        f" fully masked, {int((~dead & ~np.isfinite(y).all(axis=1)).sum())} with nan channels, "
        f"{int(valid.sum())} line spaxels with S/N >= {SN_CUT:g}; {harness.blas_threads()}"
    )
    print(
        f"scipy's loop (nan dropped per spaxel): median {wall:.2f} s of {len(walls)} loops "
        f"({' '.join(f'{w:.2f}' for w in walls)} s)"
    )
    record.figure("scipy s", wall)
    record.figure("scipy s spread", max(walls) / min(walls))
    record.figure("line spaxels", int(valid.sum()))
    record.figure("masked spaxels", int(dead.sum()))
    sky = (truth[:, 2] == 0) & ~dead
    chi_ref = chi2(ref, y, sigma)
    ref_q = quality(ref, ref_err, truth, valid)
    table = [("scipy", 1.0, ref_q, "-", "-", "(skipped)", f"{wall:.2f}")]
    _record_quality(record, "scipy", ref_q)
    checks = []
    for name, (seconds, popt, errors, extra) in rows.items():
        record.figure(f"{name} s", seconds)
        ratio = record.ratio(f"{name} / scipy", f"{name} s", "scipy s")
        if name.endswith("first"):  # another cube (the first call's): its wall alone
            table.append((name, ratio, None, "", "", "", f"{seconds:.2f}"))
            continue
        q = quality(popt, errors, truth, valid)
        _record_quality(record, name, q)
        record.figure(f"{name} within 3 sigma - scipy's", q["within 3σ"] - ref_q["within 3σ"])
        better = chi2(popt, y, sigma) <= chi_ref * (1 + 1e-6)
        record.figure(f"{name} line fits as good as scipy", int(better[valid].sum()))
        record.figure(f"{name} sky fits as good as scipy", int(better[sky].sum()))
        if isinstance(extra, ms.BatchFits):
            fits = extra
            dof_same = bool(np.array_equal(fits.dof[~dead], ref_dof[~dead]))
            said = np.array([s is ms.Status.NO_DATA for s in fits.status])
            masked = f"{int(said.sum())}" + (" (all)" if np.array_equal(said, dead) else " (!)")
            record.figure(f"{name} no_data", int(said.sum()))
            record.figure(f"{name} no_data is the masked", int(np.array_equal(said, dead)))
            checks.append((name, ratio, q, dof_same, np.array_equal(said, dead)))
        else:
            dof_same = bool(np.array_equal(extra[~dead], ref_dof[~dead]))
            masked = "(skipped)"
        record.figure(f"{name} dof as scipy's", int(dof_same))
        good = f"{int(better[valid].sum())}/{int(better[sky].sum())}"
        table.append((name, ratio, q, good, str(dof_same), masked, f"{seconds:.2f}"))
    print(
        f"{'arm':<26}{'wall/scipy':>10}  {'within 3σ':>9}  {'pull v':>12}  {'pull disp':>12}"
        f"  {'χ² <= scipy':>12}  {'dof = scipy':>11}  {'no_data':>9}  {'wall s':>7}"
    )
    for name, ratio, q, good, dof_same, masked, seconds in table:
        if q is None:
            print(f"{name:<26}{ratio:>10.3f}{'':>88}{seconds:>7}")
            continue
        med, spread = q["pull median"], q["pull spread"]
        print(
            f"{name:<26}{ratio:>10.3f}  {100 * q['within 3σ']:>8.2f}%"
            f"  {med[0]:+.3f}/{spread[0]:.3f}  {med[1]:+.3f}/{spread[1]:.3f}"
            f"  {good:>12}  {dof_same:>11}  {masked:>9}  {seconds:>7}"
        )
    print(
        f"within 3σ, pulls (median/spread, 1.4826 MAD, of (fit - truth) / error): over the "
        f"{int(valid.sum())} line spaxels; χ² <= scipy's (to 1e-6): line spaxels / "
        f"{int(sky.sum())} sky spaxels"
    )
    for name, ratio, q, dof_same, masked in checks:  # the measures, arm by arm
        diff = 100 * (q["within 3σ"] - ref_q["within 3σ"])
        med, spread = q["pull median"], q["pull spread"]
        pulls = bool(np.all(np.abs(med) <= 0.05) and np.all(np.abs(spread - 1) <= 0.05))
        print(
            f"{name}: within 3σ {diff:+.2f} points of scipy's (|d| <= 0.2: {abs(diff) <= 0.2}); "
            f"pulls median 0 ± 0.05 and spread 1 ± 0.05: {pulls}; dof = scipy's: {dof_same}; "
            f"masked reported no_data: {bool(masked)}; wall {ratio:.3f}x scipy's loop"
        )
    record.write(args.json)


def _arms(parser, starts: str) -> list[int | None]:
    """``--starts``: ints >= 1 and ``default`` (None), comma-separated."""
    arms = []
    for word in starts.split(","):
        word = word.strip()
        if word == "default":
            arms.append(None)
        elif word.isdigit() and int(word) >= 1:
            arms.append(int(word))
        else:
            parser.error(f"--starts takes ints >= 1 and 'default', comma-separated; got {word!r}")
    return arms


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _record_quality(record, name: str, q: dict) -> None:
    record.figure(f"{name} within 3 sigma", q["within 3σ"])
    for j, param in enumerate(("v", "disp")):
        record.figure(f"{name} pull {param} median", q["pull median"][j])
        record.figure(f"{name} pull {param} spread", q["pull spread"][j])


if __name__ == "__main__":
    main()
