"""Where the pieces of a gradient go on the shards (pure; the MPI side is in test_store_mpi)."""

import numpy as np
import pytest

from hpcrl.runtime.params.store import piece_puts
from hpcrl.runtime.topology import shard_ranges


def test_piece_puts_by_hand():
    # pieces [0, 3) [3, 8) [8, 10); shards [0, 4) [4, 7) [7, 10)
    assert piece_puts((3, 5, 2), shard_ranges(10, 3)) == [
        [(0, 0, 3, 0), (1, 0, 1, 3)],
        [(1, 1, 3, 0)],
        [(1, 4, 1, 0), (2, 0, 2, 1)]]


@pytest.mark.parametrize("seed", range(5))
def test_piece_puts_rebuild_every_shard(seed):
    rng = np.random.default_rng(seed)
    sizes = tuple(int(x) for x in rng.integers(0, 40, rng.integers(1, 12)))
    vector = rng.normal(size=sum(sizes)).astype(np.float32)
    pieces = np.split(vector, np.cumsum(sizes)[:-1])
    ranges = shard_ranges(len(vector), int(rng.integers(1, 5)))
    for (a, b), puts in zip(ranges, piece_puts(sizes, ranges)):
        shard = np.full(b - a, np.nan, np.float32)
        for k, start, count, dst in puts:
            assert count > 0 and np.isnan(shard[dst:dst + count]).all()   # no overlaps
            shard[dst:dst + count] = pieces[k][start:start + count]
        np.testing.assert_array_equal(shard, vector[a:b])


def test_piece_puts_rejects_wrong_total():
    with pytest.raises(ValueError, match="pieces hold 9 floats"):
        piece_puts((4, 5), shard_ranges(10, 2))
