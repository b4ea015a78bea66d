"""A population pharmacokinetic cohort as a factor graph: compile, fit and errors at scale.

The model (ours, made for this benchmark): a one-compartment model with first-order absorption
after one oral dose of 100 mg, ``C(t) = D ka / (V (ka - ke)) (exp(-ke t) - exp(-ka t))`` with
``ke = CL / V``; each patient's clearance, volume and absorption rate are the population's times
``exp(eta)``, the clearance also scaled by body weight, ``(wt / 70) ** theta_wt``. Log
concentrations carry a normal error ``sigma``; samples below the limit of quantification
(LOQ) enter by the M3 likelihood, ``log Phi((log LOQ - log C) / sigma)``. Each patient is one
``ms.Factor`` (6-10 samples at times of its own; the graph pads them to 10,
``pad_to_common_shape=True``, the weight ``w`` zero there), with three random effects of its
own under ``ms.Normal(0, 0.3)``; five population parameters are shared.

Arms, every one in one run (each in a fresh process, the persistent compilation cache off):

- ``compile``: ``result.stats["compile_s"]`` of ``MultiStartLBFGS`` fits of 50 and of N
  patients (default 3,000), 30 steps, ``--repeats`` fresh processes of each interleaved,
  medians: the ratio N / 50 (the issue's target: at most 1.5).
- ``fit``: the whole fit of N patients, ``MultiStartLBFGS(n_starts=8)`` from 8 given starts,
  against scipy's L-BFGS-B looping over the same 8 starts on the same MAP written as one array
  objective (``jit(value_and_grad)`` of an ``(N, 3)`` array of random effects), its compile
  included; both walls from the fit's call to its answer, and the best figure of merit each
  reached (target: at most 2x scipy's wall); ``fit`` runs it with ``diagonal=False`` (one
  scale for L-BFGS's initial inverse Hessian), ``fit-diagonal`` at the default
  ``diagonal="auto"``, which chooses a scale a coordinate (docs/rules.md) for a cohort past 500
  parameters (the record notes what it chose).
- ``errors``: Laplace errors of the shared parameters at N patients from the graph's
  structure (``ms.laplace(graph, params).shared_covariance``: the arrow of the Hessian, a
  Schur complement) against the dense Hessian of the array objective and its inverse:
  ``jax.hessian`` up to 1,000 patients, past that its products a chunk of 1,000 columns a
  call (``jax.hessian`` at once needs about 20 GB at 3,000 patients; in chunks it is faster
  too) (target: at most 1x; the arm's peak memory under 2 GB). Both at the same point,
  scipy's optimum from the first start.

``--quick``: 50 and 200 patients, 2 starts, 30 steps, for the test suite. ``--json PATH``
writes the record. Run: ``python profiling/cohort.py`` (from the repository root).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

DOSE = 100.0
MAX_SAMPLES = 10
OMEGA = 0.3  # the random effects' prior sigma
#: the truth the cohort is drawn from (log CL, log V, log ka, theta_wt, log sigma)
TRUTH = {
    "lcl": np.log(5.0),
    "lv": np.log(50.0),
    "lka": np.log(1.2),
    "theta_wt": 0.75,
    "lsigma": np.log(0.15),
}
LOQ = 0.15  # mg/L: about one sample in ten falls below it


def shared_space():
    import multistart as ms

    return {
        "lcl": ms.Normal(1.5, 1.0),
        "lv": ms.Normal(4.0, 1.0),
        "lka": ms.Normal(0.0, 1.0),
        "theta_wt": ms.Normal(0.75, 0.5),
        "lsigma": ms.Uniform(-5.0, 0.0),
    }


def own_space():
    import multistart as ms

    return {k: ms.Normal(0.0, OMEGA) for k in ("eta_cl", "eta_v", "eta_ka")}


def concentration(xp, lcl, lv, lka, theta_wt, eta, t, wt):
    """``C(t)`` of one patient (``eta``: ``(eta_cl, eta_v, eta_ka)``; NumPy or jax.numpy)."""
    cl = xp.exp(lcl + eta[0]) * (wt / 70.0) ** theta_wt
    v, ka = xp.exp(lv + eta[1]), xp.exp(lka + eta[2])
    ke = cl / v
    return DOSE * ka / (v * (ka - ke)) * (xp.exp(-ke * t) - xp.exp(-ka * t))


def make_cohort(n: int, seed: int = 0) -> list[dict]:
    """``n`` patients' data (6 to ``MAX_SAMPLES`` samples each) and their random effects."""
    rng = np.random.default_rng(seed)
    patients = []
    for _ in range(n):
        m = int(rng.integers(6, MAX_SAMPLES + 1))
        t = np.sort(rng.uniform(0.25, 24.0, m))
        wt = float(rng.normal(70.0, 12.0))
        eta = rng.normal(0.0, OMEGA, 3)
        c = concentration(
            np, TRUTH["lcl"], TRUTH["lv"], TRUTH["lka"], TRUTH["theta_wt"], eta, t, wt
        )
        y = np.log(c) + rng.normal(0.0, np.exp(TRUTH["lsigma"]), m)
        bloq = y < np.log(LOQ)
        patients.append(
            {
                "t": t,
                "y": np.where(bloq, np.log(LOQ), y),
                "bloq": bloq.astype(np.float64),
                "w": np.ones(m),
                "wt": np.float64(wt),
                "eta": eta,
            }
        )
    return patients


def padded(patients: list[dict], key: str) -> np.ndarray:
    """``(N, MAX_SAMPLES)`` of one data key, zero-padded as the graph pads it."""
    return np.stack([np.pad(p[key], (0, MAX_SAMPLES - p[key].size)) for p in patients])


def patient_loglike(p, d):
    """One patient's log-likelihood (M3 for the samples below the LOQ). A zero-padded sample
    (``w`` 0) contributes nothing: its time is moved off 0, where ``log C`` is ``-inf`` and
    would make the gradient nan."""
    import jax.numpy as jnp
    from jax.scipy.stats import norm

    eta = jnp.stack([p["eta_cl"], p["eta_v"], p["eta_ka"]])
    t = jnp.where(d["w"] > 0, d["t"], 1.0)
    c = concentration(jnp, p["lcl"], p["lv"], p["lka"], p["theta_wt"], eta, t, d["wt"])
    sigma = jnp.exp(p["lsigma"])
    z = (d["y"] - jnp.log(c)) / sigma
    seen = norm.logpdf(z) - p["lsigma"]
    below = norm.logcdf(z)  # y holds log LOQ there
    return jnp.sum(d["w"] * jnp.where(d["bloq"] > 0, below, seen))


def cohort_graph(patients: list[dict]):
    import multistart as ms

    data_keys = ("t", "y", "bloq", "w", "wt")
    factors = [
        ms.Factor(
            patient_loglike,
            {k: p[k] for k in data_keys},
            space=own_space(),
            name=f"patient_{i:05d}",
        )
        for i, p in enumerate(patients)
    ]
    return ms.FactorGraphModel(
        factors, space=shared_space(), pad_to_common_shape=True, name="PK cohort"
    )


# -- the same MAP as one array objective (the peer's) ------------------------------------------

SHARED_ORDER = ("lcl", "lv", "lka", "theta_wt", "lsigma")


def array_objective(patients: list[dict]):
    """``(fom, data)``: ``fom(x, data)`` over ``x = [5 shared, eta (N, 3) raveled]``, the
    graph's figure of merit (the same priors, their constants included)."""
    import jax
    import jax.numpy as jnp
    from jax.scipy.stats import norm

    data = {k: padded(patients, k) for k in ("t", "y", "bloq", "w")}
    data["wt"] = np.array([p["wt"] for p in patients])
    space = shared_space()

    def fom(x, d):
        s = dict(zip(SHARED_ORDER, x[:5], strict=True))
        eta = x[5:].reshape(-1, 3)
        p = {**s, "eta_cl": eta[:, 0], "eta_v": eta[:, 1], "eta_ka": eta[:, 2]}
        ll = jax.vmap(
            patient_loglike,
            in_axes=({**{k: None for k in s}, "eta_cl": 0, "eta_v": 0, "eta_ka": 0}, 0),
        )(p, d)
        prior = sum(space[k].log_prob(s[k]) for k in SHARED_ORDER)
        prior = prior + jnp.sum(norm.logpdf(eta, 0.0, OMEGA))
        return -2.0 * (jnp.sum(ll) + prior)

    return fom, data


def flat_point(params: dict, n: int) -> np.ndarray:
    """A graph params pytree as the array objective's ``x``."""
    shared = [float(params[k]) for k in SHARED_ORDER]
    eta = [
        [float(params[f"patient_{i:05d}"][k]) for k in ("eta_cl", "eta_v", "eta_ka")]
        for i in range(n)
    ]
    return np.concatenate([shared, np.ravel(eta)])


def starts(n_patients: int, n_starts: int, seed: int = 1) -> list[dict]:
    """``n_starts`` starts: the population parameters drawn across their priors' middle, the
    random effects at 0 (where a user starts a population model)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_starts):
        p = {
            "lcl": rng.uniform(0.5, 2.5),
            "lv": rng.uniform(3.0, 5.0),
            "lka": rng.uniform(-1.0, 1.0),
            "theta_wt": rng.uniform(0.25, 1.25),
            "lsigma": rng.uniform(-3.0, -1.0),
        }
        for i in range(n_patients):
            p[f"patient_{i:05d}"] = {"eta_cl": 0.0, "eta_v": 0.0, "eta_ka": 0.0}
        out.append(p)
    return out


def stacked(given: list[dict]):
    """Starts as one params pytree with a leading axis of starts: the form ``fit(starts=)``
    checks in one pass (a list of thousands-of-leaf dicts is matched path by path, start by
    start: seconds at 3,000 patients)."""
    import jax

    return jax.tree_util.tree_map(lambda *xs: np.array(xs), *given)


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


# -- the arms (each in a fresh process) ---------------------------------------------------------


def arm_compile(n: int, n_starts: int, steps: int) -> dict:
    import jax

    import multistart as ms

    jax.config.update("jax_enable_x64", True)

    graph = cohort_graph(make_cohort(n))
    search = ms.MultiStartLBFGS(n_starts=n_starts, n_steps=steps, seed=0, log_every=0)
    result = search.fit(graph, starts=stacked(starts(n, n_starts)))
    return {"compile_s": result.stats["compile_s"], "wall_s": result.stats["wall_s"]}


def arm_fit(n: int, n_starts: int, steps: int | None, diagonal: bool | str = False) -> dict:
    import jax

    import multistart as ms

    jax.config.update("jax_enable_x64", True)  # float64, as scipy's

    graph = cohort_graph(make_cohort(n))
    given = stacked(starts(n, n_starts))
    options = {} if steps is None else {"n_steps": steps}
    t0 = time.perf_counter()
    diagonal_option = {} if diagonal == "auto" else {"diagonal": diagonal}  # "auto": the default
    search = ms.MultiStartLBFGS(
        n_starts=n_starts, seed=0, log_every=0, **diagonal_option, **options
    )
    result = search.fit(graph, starts=given)
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "diagonal": bool(result.config["hyperparameters"].get("diagonal", False)),
        "compile_s": result.stats["compile_s"],
        "best_fom": float(result.best_fom),
        "n_converged": int(sum(s == "converged" for s in result.status)),
        "n_evals": int(np.sum(result.stats["n_evals"])),
        "peak_gb": peak_gb(),
    }


def arm_scipy(n: int, n_starts: int, steps: int | None) -> dict:
    import jax
    import scipy.optimize

    jax.config.update("jax_enable_x64", True)
    patients = make_cohort(n)
    fom, data = array_objective(patients)
    space = shared_space()
    bounds = [(space[k].lower_bound.item(), space[k].upper_bound.item()) for k in SHARED_ORDER]
    bounds = [(None if np.isinf(lo) else lo, None if np.isinf(hi) else hi) for lo, hi in bounds]
    bounds += [(None, None)] * (3 * n)
    given = [flat_point(p, n) for p in starts(n, n_starts)]
    t0 = time.perf_counter()
    vg = jax.jit(jax.value_and_grad(fom))

    def fun(x):
        v, g = vg(x, data)
        return float(v), np.asarray(g, dtype=np.float64)

    options = {} if steps is None else {"maxiter": steps}
    best, evals, converged = np.inf, 0, 0
    with harness.one_blas_thread():
        for x0 in given:
            res = scipy.optimize.minimize(
                fun, x0, jac=True, method="L-BFGS-B", bounds=bounds, options=options
            )
            best, evals, converged = min(best, res.fun), evals + res.nfev, converged + res.success
    return {
        "wall_s": time.perf_counter() - t0,
        "best_fom": float(best),
        "n_evals": evals,
        "n_converged": converged,
        "peak_gb": peak_gb(),
    }


def _best_params(n: int, steps: int | None):
    """A good point to take errors at: scipy's optimum of the array objective from the first
    start, as a graph params pytree (the errors arms time only the errors)."""
    import jax
    import scipy.optimize

    patients = make_cohort(n)
    fom, data = array_objective(patients)
    vg = jax.jit(jax.value_and_grad(fom))
    x0 = flat_point(starts(n, 1)[0], n)
    res = scipy.optimize.minimize(
        lambda x: tuple(np.asarray(a, np.float64) for a in vg(x, data)),
        x0,
        jac=True,
        method="L-BFGS-B",
        options={} if steps is None else {"maxiter": steps},
    )
    x = res.x
    params = dict(zip(SHARED_ORDER, map(float, x[:5]), strict=True))
    for i, eta in enumerate(x[5:].reshape(-1, 3)):
        params[f"patient_{i:05d}"] = dict(
            zip(("eta_cl", "eta_v", "eta_ka"), map(float, eta), strict=True)
        )
    return patients, params, x


def arm_errors(n: int, steps: int | None) -> dict:
    import jax

    import multistart as ms

    jax.config.update("jax_enable_x64", True)
    patients, params, _ = _best_params(n, steps)
    graph = cohort_graph(patients)
    before = peak_gb()
    t0 = time.perf_counter()
    fit = ms.laplace(graph, params)
    shared = fit.shared_covariance
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "std": np.sqrt(np.diag(shared)).tolist(),
        "names": list(fit.shared_names),
        "peak_gb": peak_gb(),
        "peak_before_gb": before,
    }


def dense_hessian(fom, x, data, chunk: int) -> np.ndarray:
    """The Hessian of ``fom`` at ``x`` by forward-over-reverse: ``jax.hessian`` (``chunk``
    0), or the same products (``jax.jvp`` of ``jax.grad`` along unit vectors) ``chunk``
    columns a compiled call: ``jax.hessian``'s memory grows as ``n`` times the model's."""
    import jax
    import jax.numpy as jnp

    if chunk == 0:
        return np.asarray(jax.jit(jax.hessian(fom))(x, data))
    n = x.size
    chunk = min(chunk, n)

    @jax.jit
    def columns(x, data, lo):
        basis = jax.nn.one_hot(lo + jnp.arange(chunk), n, dtype=x.dtype)
        grad = jax.grad(fom)
        return jax.vmap(lambda t: jax.jvp(lambda v: grad(v, data), (x,), (t,))[1])(basis)

    hess = np.empty((n, n))
    for lo in range(0, n, chunk):
        lo = min(lo, n - chunk)  # the last chunk overlaps the one before: one shape
        hess[lo : lo + chunk] = np.asarray(columns(x, data, lo))
    return hess


def arm_hessian(n: int, steps: int | None, chunk: int) -> dict:
    import jax

    jax.config.update("jax_enable_x64", True)
    patients, _, x = _best_params(n, steps)
    fom, data = array_objective(patients)
    before = peak_gb()
    t0 = time.perf_counter()
    cov = 2.0 * np.linalg.inv(dense_hessian(fom, x, data, chunk))
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "std": np.sqrt(np.diag(cov)[:5]).tolist(),
        "peak_gb": peak_gb(),
        "peak_before_gb": before,
    }


def child_arm(args) -> dict:
    """The arm ``args.arm`` for ``args.n`` patients, in this (fresh) process."""
    n = args.n
    if args.arm == "compile":
        return arm_compile(n, args.starts, args.steps or 30)
    if args.arm == "fit":
        return arm_fit(n, args.starts, args.steps)
    if args.arm == "fit-diagonal":  # the default, which chooses the scale a coordinate here
        return arm_fit(n, args.starts, args.steps, diagonal="auto")
    if args.arm == "scipy":
        return arm_scipy(n, args.starts, args.steps)
    if args.arm == "errors":
        return arm_errors(n, args.steps)
    return arm_hessian(n, args.steps, args.hessian_chunk or 0)


ARMS = ("compile", "fit", "fit-diagonal", "scipy", "errors", "hessian")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=3000)
    parser.add_argument("--small", type=int, default=50, help="the compile arm's reference")
    parser.add_argument("--starts", type=int, default=8)
    parser.add_argument(
        "--steps", type=int, default=None, help="cap on each start's steps (default: each's own)"
    )
    parser.add_argument(
        "--hessian-chunk",
        type=int,
        default=None,
        help="the peer's dense Hessian, this many columns a call (0: jax.hessian at once; "
        "default 0 up to 1,000 patients, else 1,000: at once it needs some 20 GB at 3,000)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="fresh-process compiles of each size (medians)"
    )
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    harness.add_arguments(parser, quick="50 and 200 patients, 2 starts, 30 steps (CI smoke)")
    args = parser.parse_args()
    if args.quick:
        args.patients, args.small, args.starts, args.steps, args.repeats = 200, 50, 2, 30, 1
    for name in ("patients", "small", "starts", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive int")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be a positive int")
    if args.hessian_chunk is not None and args.hessian_chunk < 0:
        parser.error("--hessian-chunk must be >= 0")
    if args.arm:
        harness.child_result(child_arm(args))
        return
    chunk = args.hessian_chunk
    if chunk is None:
        chunk = 0 if args.patients <= 1000 else 1000
    env = {
        "JAX_COMPILATION_CACHE_DIR": None,
        "MULTISTART_CACHE_DIR": "",
        "MULTISTART_LOG_LEVEL": "WARNING",
    }
    common = ["--starts", args.starts] + ([] if args.steps is None else ["--steps", args.steps])

    def child(arm, n, *more):
        return harness.fresh_process(__file__, "--arm", arm, "--n", n, *common, *more, env=env)

    record = harness.Record("cohort", args)
    n, small = args.patients, args.small
    print(f"PK cohort: {n} patients ({3 * n + 5} parameters), {args.starts} starts", flush=True)

    runs = harness.interleave(
        {size: (lambda size=size: child("compile", size)) for size in (small, n)}, args.repeats
    )
    compile_s = {size: harness.median(r["compile_s"] for r in runs[size]) for size in runs}
    record.figure(f"compile {small} s", compile_s[small])
    record.figure(f"compile {n} s", compile_s[n])
    record.ratio(f"compile {n} / {small}", f"compile {n} s", f"compile {small} s")
    harness.print_ratios(
        f"compile of the fit, {n} patients against {small} (medians of {args.repeats})",
        {f"{small} patients": compile_s[small], f"{n} patients": compile_s[n]},
        f"{small} patients",
    )

    fits = {"ours": child("fit", n), "diagonal": child("fit-diagonal", n)}
    fits["scipy"] = child("scipy", n)
    for arm, m in fits.items():
        for key in ("wall_s", "best_fom", "n_evals", "n_converged", "peak_gb", "diagonal"):
            if key in m:  # (what diagonal each of ours ran with; scipy has none)
                record.figure(f"fit {arm} {key}", m[key])
    for arm in ("ours", "diagonal"):
        record.figure(f"fit {arm} compile_s", fits[arm]["compile_s"])
        record.ratio(f"fit {arm} / scipy", f"fit {arm} wall_s", "fit scipy wall_s")
    names = {
        "ours": "MultiStartLBFGS(diagonal=False)",
        "diagonal": "MultiStartLBFGS() (the default: a scale a coordinate past 500 parameters)",
        "scipy": "scipy L-BFGS-B loop",
    }
    harness.print_ratios(
        f"the whole fit of {n} patients, {args.starts} starts",
        {names[arm]: m["wall_s"] for arm, m in fits.items()},
        names["scipy"],
    )
    for arm, m in fits.items():
        print(
            f"  {names[arm]}: best figure of merit {m['best_fom']:.6f} "
            f"({m['n_converged']} converged, {m['n_evals']} evaluations)",
            flush=True,
        )

    arrow, dense = child("errors", n), child("hessian", n, "--hessian-chunk", chunk)
    peer_name = "jax.hessian" if chunk == 0 else f"jax.hessian's products, {chunk} columns a call"
    record.notes["errors peer"] = peer_name
    record.figure("errors arrow s", arrow["wall_s"])
    record.figure("errors dense s", dense["wall_s"])
    record.figure("errors arrow peak GB", arrow["peak_gb"])
    record.figure("errors dense peak GB", dense["peak_gb"])
    record.ratio("errors arrow / dense", "errors arrow s", "errors dense s")
    diff = np.max(np.abs(np.array(arrow["std"]) / np.array(dense["std"]) - 1.0))
    record.figure("errors largest relative difference", diff)
    harness.print_ratios(
        f"Laplace errors of the shared parameters, {n} patients (the peer: {peer_name})",
        {"arrow (Schur)": arrow["wall_s"], "dense": dense["wall_s"]},
        "dense",
    )
    print(
        f"  peak memory of the process: arrow {arrow['peak_gb']:.2f} GB, dense "
        f"{dense['peak_gb']:.2f} GB; the errors agree to {diff:.1e} (relative)"
    )
    record.write(args.json)


if __name__ == "__main__":
    main()
