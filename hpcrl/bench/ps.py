"""``mpiexec -n 4 python -m hpcrl.bench ps``: the parameter store's pull and push rates
against raw ``Lock/Get/Unlock`` and ``Lock/Accumulate/Unlock`` on a window of the same size,
measured alternately in the same run (ratios within one run, because the machines are shared
and noisy), plus the CPU a ps rank uses while idle."""

from __future__ import annotations

import time

import numpy as np

NATURE_DQN_FLOATS = 1_686_950  # NatureQNetwork on (4, 84, 84) with 18 actions
IDLE_TAG = 31


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench_ps(floats: int, reps: int, idle_s: float, optimizer: str) -> dict | None:
    """Run on every rank; rank 0 is the single ps, rank 1 measures, other clients stay idle."""
    from mpi4py import MPI

    from hpcrl.runtime.params.optim import ShardOptimizer
    from hpcrl.runtime.params.server import ShardServer
    from hpcrl.runtime.params.store import ParameterStore, StoreSpec

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        raise SystemExit("bench ps needs at least 2 ranks: mpiexec -n 4 python -m hpcrl.bench ps")
    bcomm = comm.Dup()             # rank 1 tells the ps here when its idle phase starts
    spec = StoreSpec(floats, (0,), tuple(range(1, size)))
    store = ParameterStore(comm, spec)
    raw = MPI.Win.Allocate(floats * 4 if rank == 0 else 0, 4, comm=comm)
    store.initialize(np.zeros(floats, np.float32) if rank == 1 else None)
    result = None
    if rank == 0:
        opt = ShardOptimizer(optimizer, floats, spec.n_clients)
        server = ShardServer(store, opt, max_staleness=10**9, target_update_every=0)
        cpu0 = wall0 = None

        def on_idle():
            nonlocal cpu0, wall0
            if cpu0 is None and bcomm.Iprobe(source=1, tag=IDLE_TAG):
                bcomm.recv(source=1, tag=IDLE_TAG)
                cpu0, wall0 = time.process_time(), time.monotonic()

        t0 = time.perf_counter()
        server.serve(idle_sleep_s=2e-3, on_tick=on_idle, tick_s=0.0)
        idle_cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0) if cpu0 else None
        comm.send({"idle_cpu_fraction": idle_cpu, "serve_s": time.perf_counter() - t0}, dest=1)
        # ps-side update cost, measured on the same rank after serving
        g = np.ones(floats, np.float32)
        a, b = np.zeros(floats, np.float32), np.empty(floats, np.float32)
        apply_s = _median_time(lambda: opt.step(a, g, b, 1e-3, 0), 10)
        comm.send(apply_s, dest=1)
    elif rank == 1:
        theta = np.empty(floats, np.float32)
        grad = np.full(floats, 1e-6, np.float32)
        versions = store.pull(theta)
        t = {"pull": [], "get": [], "push": [], "acc": []}

        def raw_get():
            raw.Lock(0, MPI.LOCK_SHARED)
            raw.Get(theta, 0)
            raw.Unlock(0)

        def raw_acc():
            raw.Lock(0, MPI.LOCK_SHARED)
            raw.Accumulate(grad, 0, op=MPI.SUM)
            raw.Unlock(0)

        for _ in range(reps):                     # alternate, so drift hits both alike
            t["pull"].append(_median_time(lambda: store.pull(theta), 1))
            t["get"].append(_median_time(raw_get, 1))
            t["push"].append(_median_time(lambda: store.push(grad, versions, 1e-3), 1))
            store.wait_consumed()                 # the ps's apply is not the transfer
            t["acc"].append(_median_time(raw_acc, 1))
        med = {k: float(np.median(v)) for k, v in t.items()}
        nbytes = floats * 4
        bcomm.send(None, dest=0, tag=IDLE_TAG)    # tell the ps its idle phase starts now
        time.sleep(idle_s)
        store.done()
        ps = comm.recv(source=0)
        apply_s = comm.recv(source=0)
        result = {
            "bench": "ps", "ranks": size, "n_ps": 1, "param_floats": floats, "reps": reps,
            "pull_gbps": nbytes / med["pull"] / 1e9, "push_gbps": nbytes / med["push"] / 1e9,
            "raw_get_gbps": nbytes / med["get"] / 1e9,
            "raw_accumulate_gbps": nbytes / med["acc"] / 1e9,
            "pull_fraction": med["get"] / med["pull"], "push_fraction": med["acc"] / med["push"],
            "pull_ms": med["pull"] * 1e3, "push_ms": med["push"] * 1e3,
            "ps_apply_ms": apply_s * 1e3, "optimizer": optimizer,
            "ps_idle_cpu_fraction": ps["idle_cpu_fraction"], "idle_s": idle_s,
        }
    else:
        store.done()
    raw.Free()
    store.free()
    bcomm.Free()
    return result
