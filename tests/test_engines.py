"""Scale-out on real engines (slow tier): Ray, Dask, submitit and a one-node Slurm, each started
here on loopback by the test and stopped at its end, no process left behind.

docs/scale-out.md's scripts run as the page shows them (its model, k=4 parts of a 64-start
fit); tests/engine_driver.py adds the faults (a worker killed mid-part, a part that raises, a
part run twice, a part of another search). Every merged Result is compared, exactly, with one
process's run of the same search.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from markdown_blocks import ROOT, write_files

import multistart as ms

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

SCALE_OUT = ROOT / "docs" / "scale-out.md"
TOKEN = "MULTISTART_ENGINE_TEST"  # in the environment of every process a test starts
ENGINES = ("ray", "dask", "submitit")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The page's files written out, as a user's project folder."""
    out = tmp_path_factory.mktemp("scale-out")
    write_files(SCALE_OUT, out)
    return out


@pytest.fixture(scope="module")
def whole(folder):
    """mymodel's search in one process."""
    sys.path.insert(0, str(folder))
    try:
        sys.modules.pop("mymodel", None)
        from mymodel import objective, search, space
    finally:
        sys.path.remove(str(folder))
    return search.fit(objective, space)


def assert_as_one_process(result: ms.Result, whole: ms.Result) -> None:
    assert result.stats["n_parts"] == 4 and result.n_starts == whole.n_starts == 64
    for name in ("foms", "status", "n_evals", "n_steps", "best_step"):
        np.testing.assert_array_equal(getattr(result, name), getattr(whole, name), err_msg=name)
    for key in whole.params:
        np.testing.assert_array_equal(result.params[key], whole.params[key], err_msg=key)
    assert result.best_index == whole.best_index and result.best_fom == whole.best_fom


def environment(folder: Path | None, token: str, **extra) -> dict:
    """The environment a test's processes start with; ``folder`` (the model's) on the path
    too, unless ``None``: then the workers must find ``mymodel`` as the engine gives it."""
    path = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), str(ROOT / "tests"), *([str(folder)] if folder else [])]
    )
    return {
        **os.environ,
        "PYTHONPATH": path,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "MULTISTART_LOG_LEVEL": "WARNING",
        "RAY_USAGE_STATS_ENABLED": "0",  # Ray reports nothing anywhere
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray on 127.0.0.1, not the routed address
        TOKEN: token,
        **extra,
    }


def leftovers(token: str, wait_s: float = 60.0) -> list[str]:
    """The processes still running with ``token`` in their environment, once ``wait_s`` has
    let them end; those left are killed (they are this test's) and named."""
    import psutil

    def carrying():
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.pid != os.getpid() and p.environ().get(TOKEN) == token:
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return found

    deadline = time.monotonic() + wait_s
    while (found := carrying()) and time.monotonic() < deadline:
        time.sleep(0.5)
    names = [f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}" for p in found]
    for p in found:
        with_gone = psutil.NoSuchProcess, psutil.AccessDenied
        try:
            p.kill()
        except with_gone:
            pass
    return names


def run(args, cwd: Path, env: dict, timeout: float = 900) -> str:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    return out.stdout


# -- the page's scripts, as they are ---------------------------------------------------------


@pytest.mark.parametrize(
    "script, args",
    [("ray_fit.py", []), ("dask_fit.py", []), ("submitit_fit.py", ["local"])],
    ids=["ray", "dask", "submitit-local"],
)
def test_the_pages_engine_script_merges_as_one_process(folder, whole, tmp_path, script, args):
    pytest.importorskip(script.split("_")[0].replace("dask", "distributed"))
    work = tmp_path / "work"
    shutil.copytree(folder, work)
    token = uuid.uuid4().hex
    out = run([sys.executable, script, *args], work, environment(None, token))
    assert out.strip().splitlines()[-1] == "64 4"  # what the page shows
    assert_as_one_process(ms.Result.load(work / "result.npz"), whole)
    assert leftovers(token) == []


# -- faults, on each engine ------------------------------------------------------------------


@pytest.fixture(scope="module", params=ENGINES)
def driven(request, folder, tmp_path_factory):
    """tests/engine_driver.py's scenarios on one engine: (engine, outputs, facts, leftovers)."""
    engine = request.param
    pytest.importorskip({"ray": "ray", "dask": "distributed", "submitit": "submitit"}[engine])
    out = tmp_path_factory.mktemp(f"driven-{engine}")
    token = uuid.uuid4().hex
    driver = ROOT / "tests" / "engine_driver.py"
    run([sys.executable, str(driver), engine, str(out)], folder, environment(folder, token))
    facts = json.loads((out / "facts.json").read_text())
    return engine, out, facts, leftovers(token)


def _not_on_submitit(engine: str) -> None:
    if engine == "submitit":  # each of its jobs a fresh process: ~10 s a part on 2 cores
        pytest.skip("merge-level faults run on Ray and Dask; submitit's parts: the page's script")


def test_the_parts_on_the_engine_merge_as_one_process(driven, whole):
    engine, out, facts, _ = driven
    _not_on_submitit(engine)
    assert "plain" not in facts  # no part failed
    assert_as_one_process(ms.Result.load(out / "plain.npz"), whole)
    assert_as_one_process(ms.Result.load(out / "parts.npz"), whole)


def test_a_worker_killed_mid_part_is_retried_or_rerun_and_nothing_is_lost(driven, whole):
    engine, out, facts, _ = driven
    files = facts["fault_files"]
    assert "killed" in files and "fit-ended-before-the-kill" not in files  # killed in its fit
    if engine in ("ray", "dask"):  # the engine ran it again by itself
        assert "kill" not in facts and any(f.startswith("kill-reran-") for f in files)
    else:  # submitit retries nothing: fit_parts named it, kept the others, and reran it
        assert facts["kill"]["missing"] == [1] and facts["kill"]["done"] == [0, 2, 3]
        assert "part [1] of 4 failed" in facts["kill"]["message"]
    assert_as_one_process(ms.Result.load(out / "kill.npz"), whole)


def test_a_part_that_raises_is_named_the_others_kept_and_it_is_rerun(driven, whole):
    _, out, facts, _ = driven
    failed = facts["raise"]
    assert failed["missing"] == [2] and failed["done"] == [0, 1, 3]
    assert "part [2] of 4 failed" in failed["message"]
    assert "RuntimeError: this part failed on purpose" in failed["message"]
    assert_as_one_process(ms.Result.load(out / "raise.npz"), whole)


def test_a_part_run_twice_is_refused_by_the_merge_and_both_runs_agree(driven):
    engine, out, facts, _ = driven
    _not_on_submitit(engine)
    assert facts["merge_twice"] == "part [1] of 4 given twice"
    first, again = ms.Result.load(out / "part1.npz"), ms.Result.load(out / "part1-again.npz")
    np.testing.assert_array_equal(first.foms, again.foms)
    np.testing.assert_array_equal(first.params["x"], again.params["x"])


def test_parts_of_two_searches_are_refused_naming_what_differs(driven):
    engine, _, facts, _ = driven
    _not_on_submitit(engine)
    assert facts["merge_other"].endswith("another configuration (seed 7 -> 8)")


def test_the_engine_listened_on_loopback_only_and_left_no_process(driven):
    engine, _, facts, left = driven
    if engine != "submitit":  # submitit's local jobs are plain processes that listen nowhere
        assert facts["listen"], "the engine's processes listened nowhere: were they found?"
    assert all(ipaddress.ip_address(a.removeprefix("::ffff:")).is_loopback for a in facts["listen"])
    assert left == []


# -- Slurm: one node on this machine ---------------------------------------------------------

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slurm_conf(folder: Path) -> str:
    node = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True)
    node_line = node.stdout.splitlines()[0]  # NodeName=<host> CPUs=... RealMemory=...
    host = node_line.split()[0].split("=")[1]
    return f"""ClusterName=multistart-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=600
{node_line} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory, folder):
    """munged, slurmctld and slurmd on 127.0.0.1, configured here; yields the environment
    that reaches them (SLURM_CONF), stops them at the end and checks nothing is left."""
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(
            f"Slurm is not installed ({', '.join(missing)} not found): apt-get install "
            "-y slurm-wlm munge (.ci/run does)"
        )
    if os.geteuid() != 0:
        pytest.skip("a one-node Slurm is started as root (slurmd runs the jobs as their users)")
    if not Path("/etc/munge/munge.key").exists():
        pytest.skip("munge has no key: /etc/munge/munge.key (Debian's munge package makes one)")
    state = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (state / sub).mkdir()
    (state / "slurm.conf").write_text(_slurm_conf(state))
    token = uuid.uuid4().hex
    env = environment(folder, token, SLURM_CONF=str(state / "slurm.conf"))
    daemons, logs = [], []

    def start(*args):
        logs.append(open(state / f"{Path(args[0]).name}.out", "w"))
        daemons.append(subprocess.Popen(args, env=env, stdout=logs[-1], stderr=subprocess.STDOUT))

    try:
        start(
            "munged",
            "-F",
            "-f",
            f"--socket={state}/munge.socket",
            f"--pid-file={state}/munged.pid",
            f"--seed-file={state}/munged.seed",
            f"--log-file={state}/munged.log",
        )
        _wait(lambda: (state / "munge.socket").exists(), 30, "munged's socket", state)
        start("slurmctld", "-D", "-i")
        time.sleep(1)
        start("slurmd", "-D")
        _wait(lambda: _node_state(env) == "idle", 90, "the node idle in sinfo", state)
        yield env, state
    finally:
        subprocess.run(["scancel", "--user=root"], env=env, capture_output=True, timeout=60)
        for d in reversed(daemons):  # slurmd, slurmctld, munged: each started here, by pid
            d.send_signal(signal.SIGTERM)
            try:
                d.wait(timeout=60)
            except subprocess.TimeoutExpired:
                d.kill()
        for log in logs:
            log.close()
        left = leftovers(token)
        assert left == [], left


def _node_state(env) -> str:
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
    return out.stdout.strip()


def _wait(ready, timeout: float, what: str, state: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            logs = {p.name: p.read_text()[-1500:] for p in state.glob("*.log*")}
            logs.update({p.name: p.read_text()[-1500:] for p in state.glob("*.out")})
            raise AssertionError(f"no {what} after {timeout} s: {logs}")
        time.sleep(0.25)


def _part_sh() -> str:
    """The page's job array script, for 4 parts on this machine's 2 CPUs: only its sizes
    and its cache folder changed (each edit must find its line)."""
    text = SCALE_OUT.read_text()
    script = re.search(r"```bash\n(#!/bin/bash\n#SBATCH --job-name=fit-part\n.*?)```", text, re.S)
    assert script, "scale-out.md's part.sh is gone"
    body = script.group(1)
    for old, new in (
        ("#SBATCH --array=0-15\n", "#SBATCH --array=0-3\n"),
        ("#SBATCH --cpus-per-task=2\n", "#SBATCH --cpus-per-task=1\n"),
        ("K=16\n", "K=4\n"),
        ("/shared/project/multistart-cache", "multistart-cache"),
    ):
        assert body.count(old) == 1, old
        body = body.replace(old, new)
    return body


def _sbatch(env, cwd, *args) -> str:
    return run(["sbatch", "--parsable", *args], cwd, env, timeout=60).strip().split(";")[0]


def _job_states(env, job: str) -> list[str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True
    )
    return re.findall(r"JobState=(\w+)", out.stdout)


def _wait_job(env, job: str, state: Path, timeout: float = 900) -> list[str]:
    ended = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
    _wait(
        lambda: (s := _job_states(env, job)) and set(s) <= ended,
        timeout,
        f"end of job {job}",
        state,
    )
    return _job_states(env, job)


# Task 1's first run dies by SIGKILL (a node lost while the part ran) once its first
# checkpoint is on disk, in its fit: in the task itself, as the fit may take less time than a
# watcher outside needs to see the checkpoint and find the process. Its rerun fits cleanly.
_KILL_AFTER_A_CHECKPOINT = """
if i == 1 and not os.path.exists("part-1-killed"):
    import signal, time
    from pathlib import Path
    from multistart.host.checkpoint import SearchCheckpoints

    def _save_then_die(self, state, _save=SearchCheckpoints.save):
        _save(self, state)
        done = Path(f"checkpoints/part-{i}-of-{k}")
        while not any(p.name.isdigit() for p in done.glob("*")):  # orbax's finished steps
            time.sleep(0.01)
        Path("part-1-killed").touch()
        os.kill(os.getpid(), signal.SIGKILL)

    SearchCheckpoints.save = _save_then_die
"""


def test_the_slurm_array_runs_a_killed_part_rerun_by_hand_and_merges(
    slurm, folder, whole, tmp_path
):
    env, state = slurm
    work = tmp_path / "work"
    shutil.copytree(folder, work)
    (work / "part.sh").write_text(_part_sh())
    script = (work / "fit_part.py").read_text()
    line = "i, k = int(sys.argv[1]), int(sys.argv[2])\n"
    assert script.count(line) == 1, "scale-out.md's fit_part.py reads its part elsewhere"
    (work / "fit_part.py").write_text(script.replace(line, line + _KILL_AFTER_A_CHECKPOINT))
    array = _sbatch(env, work, "part.sh")
    states = _wait_job(env, array, state)
    assert (work / "part-1-killed").exists()  # task 1 was killed in its fit, once
    assert sorted(states).count("COMPLETED") == 3 and "FAILED" in states, states
    assert not (work / "parts" / "part-1-of-4.npz").exists()
    again = _sbatch(env, work, "--array=1", "part.sh")  # as the page says
    merge = _sbatch(env, work, f"--dependency=afterok:{again}", "--wrap", "python merge.py 4")
    assert _wait_job(env, again, state) == ["COMPLETED"]
    assert _wait_job(env, merge, state) == ["COMPLETED"]
    rerun = ms.Result.load(work / "parts" / "part-1-of-4.npz")
    assert rerun.stats["resumed_from"] > 0  # it continued from the killed task's checkpoint
    assert_as_one_process(ms.Result.load(work / "result.npz"), whole)
