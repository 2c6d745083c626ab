"""Parameter-store checks run for real under mpiexec (driven by tests/test_store_mpi.py).

Usage: mpiexec -n N python tests/mpi/store_checks.py CHECK N_PS
Every rank prints nothing on success except rank 0's final "OK <check>" line; a failed check
raises, which aborts the whole job (non-zero exit).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.params.optim import ShardOptimizer
from hpcrl.runtime.params.server import ShardServer
from hpcrl.runtime.params.store import ParameterStore, StoreSpec
from hpcrl.runtime.topology import ps_positions

sys.path.insert(0, __file__.rsplit('/', 1)[0])
from store_checks_reference import reference_updates  # noqa: E402

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def make_store(n_params: int, n_ps: int):
    ps = tuple(ps_positions(size, n_ps))
    clients = tuple(r for r in range(size) if r not in ps)
    spec = StoreSpec(n_params, ps, clients)
    return ParameterStore(comm, spec)


def serve(store, kind="sgd", max_staleness=10**9, target_every=0, **kw):
    # the path under test: local loads/stores on the ps's own header words in the unified
    # memory model, MPI atomics otherwise (HPCRL_SEPARATE_MODEL forces the latter)
    assert store._local_hdr == (store.win_hdr.model == MPI.WIN_UNIFIED
                                and not os.environ.get("HPCRL_SEPARATE_MODEL")), "header path"
    opt = ShardOptimizer(kind, store.sizes[store.shard], store.spec.n_clients, **kw)
    server = ShardServer(store, opt, max_staleness=max_staleness, target_update_every=target_every)
    server.serve(idle_sleep_s=1e-3)
    return server


def finish(store, name):
    counters = store.counters() if store.client == 0 else None
    store.free()
    if rank == 0:
        print(f"OK {name}", flush=True)
    return counters


def check_exact_sums(n_ps: int) -> None:
    """K pushes of (c + 1) * pattern from each client c with SGD, lr = 1:
    theta = 7 - K * sum(c + 1) * pattern, pattern[i] = 1 + i % 7 (so a float in the wrong place
    shows). Odd clients push the gradient as 3 pieces whose cuts fall inside shards."""
    n, k = 100_003, 20
    pattern = (1 + np.arange(n) % 7).astype(np.float32)
    store = make_store(n, n_ps)
    store.initialize(np.full(n, 7.0, np.float32) if store.client == 0 else None)
    if store.shard is not None:
        serve(store)
    else:
        theta = np.empty(n, np.float32)
        grad = (store.client + 1) * pattern
        if store.client % 2:
            grad = np.split(grad, [17, n // 2 + 3])
        for _ in range(k):
            versions = store.pull(theta)
            store.push(grad, versions, 1.0)
        store.done()
    comm.Barrier()
    if store.client is not None:
        theta = np.empty(n, np.float32)
        store.pull(theta)
        ncl = store.spec.n_clients
        expected = 7.0 - k * ncl * (ncl + 1) / 2 * pattern
        assert np.array_equal(theta, expected), (theta[:3], expected[:3])
        c = store.counters()
        assert c["applied"] == k * ncl and c["applied_per_shard"] == [k * ncl] * n_ps, c
        assert c["dropped_stale"] == 0 and c["dropped_nonfinite"] == 0, c
    finish(store, "exact_sums")


def check_no_torn_reads(n_ps: int) -> None:
    """Version v of shard j is the constant vector v (theta0 = 0, gradient -1, SGD lr 1).

    Client 0 pushes as fast as it can while the other clients pull in a loop: every pulled shard
    must be constant and equal to the version the pull reports (a checksum per version).
    """
    n, pushes = 1_700_000, 150
    store = make_store(n, n_ps)
    store.initialize(np.zeros(n, np.float32) if store.client == 0 else None)
    reads = 0
    if store.shard is not None:
        serve(store)
    elif store.client == 0:
        minus_one = np.full(n, -1.0, np.float32)
        theta = np.empty(n, np.float32)
        for _ in range(pushes):
            versions = store.pull(theta)
            store.push(minus_one, versions, 1.0)
        store.wait_consumed()
        store.done()
    else:
        theta = np.empty(n, np.float32)
        last = np.zeros(n_ps, np.int64)
        while True:
            versions = store.pull(theta)
            for j, (a, b) in enumerate(store.spec.ranges):
                seg = theta[a:b]
                assert seg.min() == seg.max() == versions[j], (j, seg.min(), seg.max(), versions[j])
            assert np.all(versions >= last), (versions, last)
            last = versions
            reads += 1
            if np.all(versions == pushes):
                break
        store.done()
    total_reads = comm.reduce(reads, root=0)
    if rank == 0:
        print(f"consistent reads: {total_reads}", flush=True)
    finish(store, "no_torn_reads")


def check_staleness(n_ps: int) -> None:
    """One pushing client, one pull then 6 pushes, max_staleness 2: 3 applied, 3 dropped."""
    n = 1000
    store = make_store(n, n_ps)
    store.initialize(np.zeros(n, np.float32) if store.client == 0 else None)
    if store.shard is not None:
        serve(store, max_staleness=2)
    else:
        if store.client == 0:
            theta = np.empty(n, np.float32)
            versions = store.pull(theta)
            for _ in range(6):
                store.push(np.ones(n, np.float32), versions, 1.0)
                store.wait_consumed()
            c = store.counters()
            assert c["applied"] == 3 and c["dropped_stale"] == 3, c
            assert c["dropped_stale_per_shard"] == [3] * n_ps, c
            store.pull(theta)
            assert np.all(theta == -3.0), theta[:3]
            nan = np.ones(n, np.float32)
            nan[3] = np.nan         # in shard 0 only: the squared norm travels to every shard
            store.push(nan, store.pull(theta), 1.0)
            store.wait_consumed()
            huge = np.full(n, 1e20, np.float32)      # finite, but its squares overflow float32
            store.push(np.split(huge, [n // 3]), store.pull(theta), 1.0)
            store.wait_consumed()
            c = store.counters()
            assert c["dropped_nonfinite"] == 2 and c["applied"] == 3, c
            assert c["dropped_nonfinite_per_shard"] == [2] * n_ps, c
            versions = store.pull(theta)
            assert np.all(theta == -3.0), "a non-finite gradient must never be applied"
            # each shard judges the version tag of its own part: only the last shard's is stale
            tags = versions.copy()
            tags[-1] -= 3
            store.push(np.ones(n, np.float32), tags, 1.0)
            store.wait_consumed()
            c = store.counters()
            assert c["dropped_stale_per_shard"] == [3] * (n_ps - 1) + [4], c
            store.pull(theta)
            last = store.spec.ranges[-1][0]
            assert np.all(theta[:last] == -4.0) and np.all(theta[last:] == -3.0), theta
        store.done()
    finish(store, "staleness")


def check_optimizers(n_ps: int) -> None:
    """Every optimiser through the store, clients taking turns, against the numpy reference."""
    n, rounds, lr, decay, eps, mom = 257, 4, 0.05, 0.9, 0.01, 0.8
    for kind in ("sgd", "momentum", "adagrad", "rmsprop_shared", "rmsprop_per_client",
                 "adam_shared"):
        store = make_store(n, n_ps)
        ncl = store.spec.n_clients
        rng = np.random.default_rng(123)
        theta0 = rng.normal(size=n).astype(np.float32)
        grads = [(c, rng.normal(size=n).astype(np.float32)) for _ in range(rounds)
                 for c in range(ncl)]
        store.initialize(theta0 if store.client == 0 else None)
        if store.shard is not None:
            server = serve(store, kind, decay=decay, eps=eps, momentum=mom)
            if kind.startswith("rmsprop") and ncl > 1:
                same = server.opt.statistics_for(0) is server.opt.statistics_for(1)
                assert same == (kind == "rmsprop_shared"), (kind, same)
        else:
            theta = np.empty(n, np.float32)
            for i, (c, g) in enumerate(grads):
                if c == store.client:
                    store.push(g, store.pull(theta), lr)
                    store.wait_consumed()
                _turn_barrier(store)
            store.done()
        comm.Barrier()
        if store.client == 0:
            theta = np.empty(n, np.float32)
            store.pull(theta)
            ref = reference_updates(kind, theta0, grads, lr, decay, eps, mom, ncl)
            err = np.max(np.abs(theta - ref))
            assert err < 1e-5, (kind, err)
        store.free()
    if rank == 0:
        print("OK optimizers", flush=True)


def _turn_barrier(store) -> None:
    """Barrier among the clients only (ps ranks are busy serving)."""
    clients = store.spec.client_ranks
    if not hasattr(store, "_client_comm"):
        group = comm.Get_group().Incl(list(clients))
        store._client_comm = comm.Create_group(group)
    store._client_comm.Barrier()


def check_target(n_ps: int) -> None:
    """target_update_every = 3: after 7 SGD steps of -1 the target holds version 6."""
    n = 5000
    store = make_store(n, n_ps)
    store.initialize(np.zeros(n, np.float32) if store.client == 0 else None)
    if store.shard is not None:
        serve(store, target_every=3)
    else:
        if store.client == 0:
            theta = np.empty(n, np.float32)
            for _ in range(7):
                store.push(np.full(n, -1.0, np.float32), store.pull(theta), 1.0)
                store.wait_consumed()
            tv = store.pull_target(theta)
            assert np.all(theta == 6.0) and np.all(tv == 2), (theta[:2], tv)
            store.request_target_refresh()
            deadline = time.time() + 10
            while np.any(store.pull_target(theta) == 2) and time.time() < deadline:  # every shard
                time.sleep(0.01)
            assert np.all(theta == 7.0), theta[:2]
        store.done()
    finish(store, "target")


if __name__ == "__main__":
    name, n_ps = sys.argv[1], int(sys.argv[2])
    try:
        globals()[f"check_{name}"](n_ps)
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
