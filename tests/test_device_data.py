"""The model's data on the device: a large broadcast leaf sent as its distinct values, and a
batch's covariance reading the copy its search sent, not sending the data again (issue 70)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import multistart as ms
from multistart.device import placement


def _sent(a):
    """What a ``device_put`` was given: an array's shape, or a list of row blocks' count,
    joined shape and type."""
    if isinstance(a, list) and a and all(isinstance(b, np.ndarray) for b in a):
        joined = (sum(len(b) for b in a), *a[0].shape[1:])
        return ("blocks", len(a), joined, a[0].dtype.name)
    return getattr(a, "shape", None)


def test_a_large_broadcast_leaf_is_sent_as_one_row_and_repeated_with_the_same_values(
    monkeypatch,
):
    monkeypatch.setattr(placement, "BROADCAST_BYTES", 1000)
    row = np.linspace(0.0, 1.0, 60)
    shared = np.broadcast_to(row, (500, 60))
    ones = np.broadcast_to(1.0, (500, 60))  # repeated along both axes: sent as one row too
    small = np.broadcast_to(row[:3], (2, 3))  # under the bound: sent as it is
    sent = []
    real = jax.device_put
    monkeypatch.setattr(jax, "device_put", lambda a, *r, **k: sent.append(np.shape(a)) or real(a))
    out = placement.data_on_device({"x": shared, "s": small, "w": ones})
    assert sent == [(2, 3), (1, 60), (1, 60)]  # (tree order: "s", "w", "x")
    np.testing.assert_array_equal(np.asarray(out["w"]), 1.0)
    assert out["x"].shape == (500, 60) and out["x"].dtype == jnp.result_type(float)
    np.testing.assert_array_equal(np.asarray(out["x"]), shared.astype(out["x"].dtype))
    np.testing.assert_array_equal(np.asarray(out["s"]), small.astype(out["s"].dtype))


def test_within_keep_device_copies_an_array_is_sent_once_and_outside_each_time():
    a = np.arange(12.0).reshape(3, 4)
    with placement.keep_device_copies():
        first, second = placement.data_on_device(a), placement.data_on_device(a)
        other = placement.data_on_device(a.copy())
    assert first is second and other is not first
    assert placement.data_on_device(a) is not first  # the copies dropped on exit


def test_the_copies_kept_in_one_thread_are_not_another_thread_s():
    """Two threads' scopes overlapping: neither sees the other's copies, and after both end
    nothing is kept (a copy kept past its scope would hold the device's memory)."""
    import threading

    a = np.arange(12.0).reshape(3, 4)
    inside, leave, seen = threading.Event(), threading.Event(), []

    def other():
        with placement.keep_device_copies():
            seen.append(placement.data_on_device(a))
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    with placement.keep_device_copies():
        mine = placement.data_on_device(a)
        leave.set()
        thread.join()
        assert placement.data_on_device(a) is mine and mine is not seen[0]
    assert placement._copies.get() is None


def test_a_batch_covariance_reads_the_device_copy_its_search_sent(monkeypatch):
    """The data a batch's covariance program is given are the very arrays its search put on
    the device (one transfer of each leaf), not the NumPy data sent again."""
    from multistart.curve_fit import covariance

    x = np.linspace(0.0, 4.0, 20)
    ys = np.stack([2.0 * np.exp(-x / t) + 0.01 * np.sin(5 * x + t) for t in (1.0, 1.5, 2.0)])

    def decay(x, a, tau):
        return a * jnp.exp(-x / tau)

    sent, given = [], []
    real = placement.data_on_device

    def spy(data):
        out = real(data)
        sent.append(jax.tree_util.tree_leaves(out))
        return out

    real_program = covariance._curvature_program

    def program(*args):
        run = real_program(*args)
        return lambda points, data, *rest: given.append(data) or run(points, data, *rest)

    monkeypatch.setattr(placement, "data_on_device", spy)
    monkeypatch.setattr(covariance, "data_on_device", spy)
    monkeypatch.setattr(covariance, "_curvature_program", program)
    kw = dict(p0=[1.0, 1.0], batched=True, n_starts=2, log_every=0, progress=False)
    popt, pcov = ms.curve_fit(decay, x, ys, **kw)
    assert np.all(np.isfinite(pcov)) and len(given) == 2  # the starts' spreads, then pcov
    search = [leaf for leaves in sent for leaf in leaves]
    for leaf in jax.tree_util.tree_leaves(given):
        assert isinstance(leaf, jax.Array) and any(leaf is s for s in search)
    assert len({id(s) for s in search}) == 3  # x, y and the weights, each sent once


def test_sent_ahead_an_array_is_sent_on_a_worker_and_that_copy_is_the_one_data_on_device_gives(
    monkeypatch,
):
    """Within keep_device_copies, a large leaf sent ahead goes to the device on the transfer
    worker, once, as it is in AHEAD_BLOCKS blocks of rows joined there in the type it would
    have had (float32 where float64 is off, float64 where asked for; the values NumPy's
    conversion gives): data_on_device then gives that copy; small and repeated leaves are
    left to data_on_device; outside the context nothing is sent."""
    import threading

    monkeypatch.setattr(placement, "AHEAD_BYTES", 1000)
    monkeypatch.setattr(placement, "BROADCAST_BYTES", 1000)
    big, small = np.random.default_rng(0).normal(size=(300, 4)), np.arange(3.0)
    repeated = np.broadcast_to(np.arange(60.0), (300, 60))
    threads = []
    real = jax.device_put

    def spy(a, *r, **k):
        threads.append((threading.current_thread().name, _sent(a)))
        return real(a, *r, **k)

    monkeypatch.setattr(jax, "device_put", spy)
    data = {"big": big, "small": small, "x": repeated}
    placement.send_ahead(data)
    assert threads == []  # outside the context: nothing
    with jax.enable_x64(False), placement.keep_device_copies():
        placement.send_ahead(data)
        placement.send_ahead(data, x64=True)
        out = placement.data_on_device(data)
        with jax.enable_x64(True):
            wide = placement.data_on_device(data)
    ahead = [t for t in threads if t[0].startswith("multistart-transfer")]
    blocks = ("blocks", placement.AHEAD_BLOCKS, (300, 4), "float64")
    assert ahead == [(ahead[0][0], blocks)] * 2  # big, for float32 and float64, ahead alone
    assert all(not name.startswith("multistart") for name, _ in threads if _ != blocks)
    assert out["big"].dtype == np.float32 and wide["big"].dtype == np.float64
    np.testing.assert_array_equal(np.asarray(out["big"]), big.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(wide["big"]), big)
    np.testing.assert_array_equal(np.asarray(out["x"]), repeated.astype(np.float32))


def test_on_a_chip_a_batch_sends_its_data_ahead_and_answers_the_same(monkeypatch):
    """On a chip (the platform injected) a batch's data are sent on the transfer worker
    before its search, and again in float64 for its refinement; the search and the
    covariance send them no more, and popt and pcov are those of the batch that sends
    nothing ahead, bit for bit."""

    from multistart.common import xla
    from multistart.curve_fit import batch as batch_module

    monkeypatch.setattr(xla, "platform", lambda: "tpu")
    monkeypatch.setattr(xla, "REFINE_ON_HOST_FITS", 0)  # the refinement on the "chip"
    monkeypatch.setattr(placement, "AHEAD_BYTES", 1000)
    x = np.linspace(0.0, 4.0, 40)
    ys = np.stack([2.0 * np.exp(-x / t) + 0.01 * np.sin(5 * x + t) for t in np.linspace(1, 2, 8)])

    def decay(x, a, tau):
        return a * jnp.exp(-x / tau)

    kw = dict(p0=[1.0, 1.0], batched=True, n_starts=2, log_every=0, progress=False)
    with monkeypatch.context() as m:
        m.setattr(batch_module._Batch, "send_ahead", lambda self: None)
        plain = ms.curve_fit(decay, x, ys, **kw)
    sent = _spy_sends(monkeypatch, ys.shape)
    ahead = ms.curve_fit(decay, x, ys, **kw)
    # x, y and the weights (all of ydata's shape, none repeated at this size), sent as they
    # are and joined as float32 for the search and float64 for the refinement, each on the
    # worker and nowhere else
    assert (
        sent == [("multistart-transfer", "float32")] * 3 + [("multistart-transfer", "float64")] * 3
    )
    for a, b in zip(ahead, plain, strict=True):
        np.testing.assert_array_equal(a, b)


def test_on_a_chip_a_float64_copy_too_large_for_its_share_is_sent_after_the_search(monkeypatch):
    """The float64 copy a refinement needs is sent ahead only where it takes at most
    REFINE_AHEAD_SHARE of the device's free memory (the search's width does not count it);
    a larger one is sent by the covariance after the search, on the caller's thread."""

    from multistart.common import xla
    from multistart.curve_fit import batch as batch_module

    monkeypatch.setattr(xla, "platform", lambda: "tpu")
    monkeypatch.setattr(xla, "REFINE_ON_HOST_FITS", 0)
    monkeypatch.setattr(placement, "AHEAD_BYTES", 1000)
    monkeypatch.setattr(batch_module, "REFINE_AHEAD_SHARE", 1e-15)  # no copy is that small
    x = np.linspace(0.0, 4.0, 40)
    ys = np.stack([2.0 * np.exp(-x / t) + 0.01 * np.sin(5 * x + t) for t in np.linspace(1, 2, 8)])

    def decay(x, a, tau):
        return a * jnp.exp(-x / tau)

    sent = _spy_sends(monkeypatch, ys.shape)
    ms.curve_fit(decay, x, ys, p0=[1.0, 1.0], batched=True, log_every=0, progress=False)
    assert sent == [("multistart-transfer", "float32")] * 3 + [("MainThread", "float64")] * 3


def test_on_a_chip_the_population_is_made_on_the_device_with_only_its_starts_sent(monkeypatch):
    """A chip's initial population (the platform injected) is made by one program there: the
    starts and statuses are the only leaves sent, and every leaf is the host's population's
    (values, types, shapes; u, best_u and good_u each its own buffer, as the population is
    donated). The search from it is the CPU's, bit for bit."""
    from conftest import PARABOLA_SPACE, parabola, same_result

    from multistart.common import xla
    from multistart.device import step

    made = []

    def spied(*args):  # read before the search's first call takes (donates) it
        pop = step.device_population(*args)
        s = pop.starts
        pointers = {a.unsafe_buffer_pointer() for a in (s.u, s.best_u, s.good_u)}
        leaves = [
            (type(a), a.shape, a.dtype, np.asarray(a)) for a in jax.tree_util.tree_leaves(pop)
        ]
        made.append(
            (step.host_population(*args), leaves, pointers, jax.tree_util.tree_structure(pop))
        )
        return pop

    monkeypatch.setattr("multistart.host.engine.device_population", spied)
    monkeypatch.setattr("multistart.host.engine.DEVICE_POPULATION_BYTES", 0)  # tiny here
    kw = dict(n_starts=6, n_steps=12, seed=0, convergence=None, log_every=0, batch_size=6)
    cpu = ms.MultiStartAdam(**kw).fit(parabola, PARABOLA_SPACE)
    monkeypatch.setattr(xla, "platform", lambda: "tpu")
    sent = []
    real_put = jax.device_put
    monkeypatch.setattr(
        jax, "device_put", lambda a, *r, **k: sent.append(a) or real_put(a, *r, **k)
    )
    chip = ms.MultiStartAdam(**kw).fit(parabola, PARABOLA_SPACE)
    assert len(made) == 1
    host, leaves, pointers, structure = made[0]
    assert jax.tree_util.tree_structure(host) == structure
    host_leaves = jax.tree_util.tree_leaves(host)
    for h, (kind, shape, dtype, values) in zip(host_leaves, leaves, strict=True):
        assert issubclass(kind, jax.Array) and shape == h.shape and dtype == h.dtype
        np.testing.assert_array_equal(values, h)
    assert len(pointers) == 3
    # the population's own sends: u, best_u, good_u and the statuses, nothing of its zeros
    population = [a for a in sent if isinstance(a, tuple) and len(a) == 4]
    assert len(population) == 1 and population[0][3].dtype == np.int8
    assert same_result(chip, cpu)


def test_index_tables_put_together_go_to_the_device_in_one_transfer(monkeypatch):
    """``put_rows_each`` (a sweep's chunk calls' gather and scatter tables, and a refill's new
    starts) sends them in one ``device_put``, not two or three a chunk, each its own array."""
    from multistart.device.placement import OneDevice

    sent = []
    real_put = jax.device_put
    monkeypatch.setattr(
        jax, "device_put", lambda a, *r, **k: sent.append(a) or real_put(a, *r, **k)
    )
    place = OneDevice(10)
    tables = [[np.arange(4) + 10 * i] for i in range(5)]
    placed = place.put_rows_each(tables)
    assert len(sent) == 1 and len(placed) == 5
    for table, one in zip(tables, placed, strict=True):
        assert isinstance(one, jax.Array)
        np.testing.assert_array_equal(np.asarray(one), table[0])


def _spy_sends(monkeypatch, shape) -> list:
    """The sends of arrays of ``shape``, as ``(thread, type on the device)``: one sent whole,
    in the type it is sent in; one sent ahead in blocks, in the type they are joined in."""
    import threading

    sent = []
    real_put, real_joined = jax.device_put, placement._joined

    def thread() -> str:
        return threading.current_thread().name.split("_")[0]

    def put(a, *r, **k):
        if getattr(a, "shape", None) == shape:
            sent.append((thread(), jnp.result_type(a).name))
        return real_put(a, *r, **k)

    def joined(blocks, dtype):
        if sum(len(b) for b in blocks) == shape[0] and blocks[0].shape[1:] == shape[1:]:
            sent.append((thread(), dtype))
        return real_joined(blocks, dtype)

    monkeypatch.setattr(jax, "device_put", put)
    monkeypatch.setattr(placement, "_joined", joined)
    return sent


def test_a_leaf_past_the_join_bound_is_sent_whole_in_the_type_the_device_holds(monkeypatch):
    """A floating leaf sent ahead goes in row blocks joined on the device only up to
    AHEAD_JOIN_BYTES (the blocks and the joined copy are held there together); past it, and
    for a leaf of fewer rows than AHEAD_BLOCKS or not floating, it is sent whole, converted
    on the host: the same values either way."""
    sent = []
    real = jax.device_put
    monkeypatch.setattr(jax, "device_put", lambda a, *r, **k: sent.append(_sent(a)) or real(a))
    big = np.random.default_rng(1).normal(size=(40, 3))
    with jax.enable_x64(False):
        joined = placement._put(big, False, None)
        monkeypatch.setattr(placement, "AHEAD_JOIN_BYTES", big.nbytes - 1)
        whole = placement._put(big, False, None)
        few = placement._put(big[: placement.AHEAD_BLOCKS - 1], False, None)
        ints = placement._put(np.arange(40), False, None)
    blocks = ("blocks", placement.AHEAD_BLOCKS, (40, 3), "float64")
    assert sent == [blocks, (40, 3), (placement.AHEAD_BLOCKS - 1, 3), (40,)]
    assert joined.dtype == whole.dtype == few.dtype == np.float32 and ints.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(joined), np.asarray(whole))
    np.testing.assert_array_equal(np.asarray(whole), big.astype(np.float32))


def test_on_a_chip_a_small_population_is_made_on_the_host_as_on_the_cpu(monkeypatch):
    """Below DEVICE_POPULATION_BYTES (the README's fits) a chip's population is made on the
    host, as a CPU's: no program of its own for a first fit to compile."""
    from conftest import PARABOLA_SPACE, parabola

    from multistart.common import xla
    from multistart.device import step

    made = []
    real = step.device_population
    monkeypatch.setattr(
        "multistart.host.engine.device_population", lambda *a: made.append(1) or real(*a)
    )
    monkeypatch.setattr(xla, "platform", lambda: "tpu")
    kw = dict(n_starts=6, n_steps=4, seed=0, convergence=None, log_every=0, batch_size=6)
    ms.MultiStartAdam(**kw).fit(parabola, PARABOLA_SPACE)
    assert made == []
    monkeypatch.setattr("multistart.host.engine.DEVICE_POPULATION_BYTES", 1)
    ms.MultiStartAdam(**kw).fit(parabola, PARABOLA_SPACE)
    assert made == [1]


def test_made_on_device_bytes_are_the_population_less_its_starts_and_statuses():
    from multistart.device import step

    opt = {"a": jax.ShapeDtypeStruct((3, 2), np.float32), "k": jax.ShapeDtypeStruct((), np.int32)}
    u0 = {"x": np.zeros((7, 2), np.float32)}
    pop = step.host_population(opt, u0, 5, 4, np.ones(7, np.int8))
    s = pop.starts
    sent = sum(a.nbytes for a in jax.tree_util.tree_leaves((s.u, s.best_u, s.good_u, s.status)))
    total = sum(a.nbytes for a in jax.tree_util.tree_leaves(pop))
    assert step.made_on_device_bytes(opt, 7, 5, 4, np.float32) == total - sent
