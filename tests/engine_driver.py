"""One engine's fault scenarios, run as a script by tests/test_engines.py (slow tier).

``python engine_driver.py ENGINE OUT`` in a folder holding docs/scale-out.md's ``mymodel.py``
(ENGINE: ray, dask or submitit). It starts the engine on this machine (loopback), runs
``ms.fit_parts`` of mymodel's search in parts k=4 through it, with a worker killed mid-part, a
part that raises, a part run twice and a part of another search, stops the engine and writes
each outcome to OUT (Results as .npz, the rest in facts.json) for the test to check against
one process's run.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from pathlib import Path

from engine_faults import faulty

import multistart as ms
from multistart.host.parts import run_part

K = 4


@contextlib.contextmanager
def engine(name: str, out: Path):
    """``(submit with the engine's retries, submit without)`` while the engine runs."""
    if name == "ray":
        import ray

        ray.init(num_cpus=2, include_dashboard=False)

        def submit(fn, *args, retries=3):
            return ray.remote(num_cpus=1, max_retries=retries)(fn).remote(*args).future()

        try:
            yield submit, functools.partial(submit, retries=0)
        finally:
            ray.shutdown()
    elif name == "dask":
        from dask.distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
        )
        with cluster, Client(cluster) as client:
            # pure=False: a part asked for again runs again (Dask would reuse the first)
            yield (
                functools.partial(client.submit, pure=False, retries=2),
                functools.partial(client.submit, pure=False),
            )
    elif name == "submitit":
        import submitit

        executor = submitit.AutoExecutor(folder=str(out / "submitit-logs"), cluster="local")
        executor.update_parameters(timeout_min=30)
        yield executor.submit, executor.submit
    else:
        raise SystemExit(f"unknown engine {name!r}")


def fit_or_rerun(submit, model, facts: dict, name: str):
    """fit_parts; on PartsFailed the facts say what it said, and the missing parts rerun."""
    search, objective, space = model
    try:
        return ms.fit_parts(search, objective, space, K, submit=submit)
    except ms.PartsFailed as error:
        facts[name] = {
            "message": str(error),
            "missing": error.missing,
            "done": sorted(error.done),
            "errors": {i: type(e).__name__ for i, e in error.failed.items()},
        }
        return ms.fit_parts(search, objective, space, K, submit=submit, done=error.done)


def listening() -> list[str]:
    """The addresses this process and its children (the engine's) listen on."""
    import psutil

    me = psutil.Process()
    pids = {me.pid, *(p.pid for p in me.children(recursive=True))}
    return sorted(
        {
            c.laddr.ip
            for c in psutil.net_connections("inet")
            if c.status == "LISTEN" and c.pid in pids
        }
    )


def main(name: str, out: Path) -> None:
    from mymodel import objective, search, space

    model = (search, objective, space)
    faults = out / "faults"
    faults.mkdir(parents=True)
    facts: dict = {}
    with engine(name, out) as (retrying, once):
        facts["listen"] = listening()
        if name != "submitit":  # a fresh process a job there: the page's script runs it plain
            fit_or_rerun(retrying, model, facts, "plain").save(out / "plain.npz")
        killed = faulty(retrying, "kill", 1, str(faults))
        fit_or_rerun(killed, model, facts, "kill").save(out / "kill.npz")
        raising = faulty(once, "raise", 2, str(faults))
        fit_or_rerun(raising, model, facts, "raise").save(out / "raise.npz")
        facts["fault_files"] = sorted(p.name for p in faults.iterdir())
        if name == "submitit":
            (out / "facts.json").write_text(json.dumps(facts, indent=1))
            return
        parts = [once(run_part, search, objective, space, (i, K), {}) for i in range(K)]
        parts = [p.result() for p in parts]
        again = once(run_part, search, objective, space, (1, K), {}).result()
        other = once(run_part, search.replace(seed=8), objective, space, (1, K), {}).result()
    for label, group in (("twice", [*parts, again]), ("other", [parts[0], other, *parts[2:]])):
        try:
            ms.Result.merge(group)
        except ValueError as e:
            facts[f"merge_{label}"] = str(e)
    parts[1].save(out / "part1.npz")
    again.save(out / "part1-again.npz")
    ms.Result.merge(parts).save(out / "parts.npz")
    (out / "facts.json").write_text(json.dumps(facts, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main(sys.argv[1], Path(sys.argv[2]))
