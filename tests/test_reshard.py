"""Re-splitting parameter shards and re-mapping workers for a resume under another layout."""

import numpy as np
import pytest

from hpcrl.runtime.reshard import layout_change_error, merge_pieces, shard_pieces, worker_source_rank
from hpcrl.runtime.topology import shard_ranges


def shard_states(full, n_ps, n_clients=2):
    """Slow reference: the states ps shards would checkpoint for the flat vectors in ``full``."""
    out = []
    for j, (a, b) in enumerate(shard_ranges(full["params"].size, n_ps)):
        out.append({"params": full["params"][a:b], "target": full["target"][a:b],
                    "opt/m": full["opt/m"][:, a:b], "hdr/V": np.int64(100 + j),
                    "hdr/frames": np.int64(5000 if j == 0 else 0)})
    return out


@pytest.mark.parametrize("old_n_ps,new_n_ps", [(1, 3), (3, 1), (2, 3), (3, 2), (4, 4), (3, 7)])
def test_resplit_reassembles_the_same_vectors(old_n_ps, new_n_ps):
    n = 23
    rng = np.random.default_rng(0)
    full = {"params": rng.standard_normal(n).astype(np.float32),
            "target": rng.standard_normal(n).astype(np.float32),
            "opt/m": rng.standard_normal((2, n)).astype(np.float32)}
    old = shard_states(full, old_n_ps)
    new = []
    for j in range(new_n_ps):
        pieces = [{k: (v if np.ndim(v) == 0 else v[..., lo:hi]) for k, v in old[s].items()}
                  for s, lo, hi in shard_pieces(n, old_n_ps, new_n_ps, j)]
        new.append(merge_pieces(pieces))
    for j, (a, b) in enumerate(shard_ranges(n, new_n_ps)):
        np.testing.assert_array_equal(new[j]["params"], full["params"][a:b])
        np.testing.assert_array_equal(new[j]["target"], full["target"][a:b])
        np.testing.assert_array_equal(new[j]["opt/m"], full["opt/m"][:, a:b])
    # global counters stay with shard 0; versions come from the old shard holding the start
    assert int(new[0]["hdr/frames"]) == 5000 and int(new[0]["hdr/V"]) == 100
    starts = [a for a, _ in shard_ranges(n, old_n_ps)]
    for j, (a, _) in enumerate(shard_ranges(n, new_n_ps)):
        owner = max(i for i, s in enumerate(starts) if s <= a)
        assert int(new[j]["hdr/V"]) == 100 + owner


def test_pieces_by_hand():
    # 10 floats: old shards [0,4) [4,7) [7,10); new shards [0,5) [5,10)
    assert shard_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert shard_pieces(10, 3, 2, 0) == [(0, 0, 4), (1, 0, 1)]
    assert shard_pieces(10, 3, 2, 1) == [(1, 1, 3), (2, 0, 3)]


def test_workers_follow_their_position_not_their_rank():
    old = ["ps", "actor-learner", "actor-learner", "actor-learner"]
    new = ["ps", "actor-learner", "ps", "actor-learner", "ps", "actor-learner"]
    assert layout_change_error(old, new) is None
    assert [worker_source_rank(old, new, r) for r in (1, 3, 5)] == [1, 2, 3]
    assert [worker_source_rank(new, old, r) for r in (1, 2, 3)] == [1, 3, 5]


def test_other_workers_cannot_resume():
    old = ["ps", "actor-learner", "actor-learner", "actor-learner"]
    why = layout_change_error(old, old + ["actor-learner"])
    assert why.startswith("was written by a job with 4 ranks (1 ps, 3 actor-learner); this job "
                          "has 5 (1 ps, 4 actor-learner)")
    assert "Resume with 3 workers (3 actor-learner) plus any n_ps" in why
    split = ["ps", "replay", "actor", "learner"]
    assert layout_change_error(split, ["ps", "actor", "replay", "learner"]) is not None
