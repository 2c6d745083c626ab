"""Global replay under mpiexec: rank 0 replay, ranks 1-2 actors, ranks 3-4 learners.

Actor a ships 3 episodes of 40 steps whose frames are the constant a * 1000 + step, then the
learners sample until each has seen transitions of both actors; every sampled transition must be
a real one (s_t = s_tm1 + 1 inside an episode, action = step % 3, reward = a).
"""

import sys

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.replay_server import BatchClient, ChunkSender, ReplayServer

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
REPLAY, ACTORS, LEARNERS = (0,), (1, 2), (3, 4)


def main():
    if rank in REPLAY:
        server = ReplayServer(comm, capacity=1000, min_fill=200, frame_shape=(2,),
                              frame_dtype=np.float32, stack=1, n_streams=2, n_peers=4, seed=0)
        server.serve()
        assert sorted(server.memories) == [(1, 0), (2, 0)], server.memories.keys()
        assert server.size == 2 * 3 * 39, server.size   # 40 frames = 1 first + 39 transitions
    elif rank in ACTORS:
        a = ACTORS.index(rank) + 1
        sink = ChunkSender(comm, REPLAY, a - 1, chunk_steps=16)
        for _ in range(3):
            sink.first(0, np.full(2, a * 1000.0, np.float32))
            for step in range(1, 40):
                sink.add(0, step % 3, float(a), step == 39, np.full(2, a * 1000.0 + step, np.float32))
        sink.close()
    else:
        client = BatchClient(comm, REPLAY, seed=rank, sample_shape=(1, 2), frame_dtype=np.float32)
        seen = set()
        for _ in range(2000):
            batch = client.sample(16)
            if batch is None:
                continue
            s_tm1, s_t = batch.s_tm1[:, 0, 0], batch.s_t[:, 0, 0]
            actor = (s_t // 1000).astype(int)
            step = s_t % 1000
            assert np.all(s_t == s_tm1 + 1), (s_tm1, s_t)
            assert np.all(batch.a_tm1 == step % 3) and np.all(batch.r_t == actor)
            assert np.all(batch.discount_t == (step != 39))
            seen.update(actor.tolist())
            if seen == {1, 2}:
                break
        assert seen == {1, 2}, seen
        client.close()
    comm.Barrier()
    if rank == 0:
        print("OK global_replay", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
