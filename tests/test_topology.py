"""Rank tables for 4, 16 and 130 ranks, worked out by hand from the placement rules."""

from pathlib import Path

import pytest

from hpcrl.config import load_config
from hpcrl.runtime.topology import (LayoutError, Role, derive_n_ps, format_table, make_layout,
                            ps_positions, shard_ranges)

PS, AL, L, A, R, E = (Role.PS, Role.ACTOR_LEARNER, Role.LEARNER, Role.ACTOR, Role.REPLAY,
                      Role.EVALUATOR)


def test_four_ranks_default_is_one_ps_three_bundles():
    layout = make_layout(4, load_config(None))
    assert layout.roles == (PS, AL, AL, AL)
    assert layout.client_ranks == (1, 2, 3)
    assert layout.counts() == {"ps": 1, "actor-learner": 3}


def test_sixteen_ranks_split_mode():
    # n_ps derived: 16 * 30 // 130 = 3, placed at 0, 16//3 = 5, 32//3 = 10.
    cfg = load_config(None, ["mode=split", "n_replay=2", "n_learners=3", "n_evaluators=1"])
    layout = make_layout(16, cfg)
    assert layout.ps_ranks == (0, 5, 10)
    # the other 13 ranks in order: 2 replay, 3 learners, 7 actors (the rest), 1 evaluator
    others = [r for r in range(16) if r not in (0, 5, 10)]
    assert [layout.roles[r] for r in others] == [R, R, L, L, L, A, A, A, A, A, A, A, E]
    assert layout.ranks_of(R) == (1, 2) and layout.ranks_of(E) == (15,)
    assert layout.index_in_role(4) == 1  # second learner: learners are ranks 3, 4, 6


def test_paper_layout_130():
    cfg = load_config(Path(__file__).parent.parent / "configs" / "gorila_paper.toml")
    layout = make_layout(130, cfg)
    assert layout.counts() == {"ps": 30, "actor-learner": 100}
    # i * 130 // 30 for i = 0..29: 0, 4, 8, 13, 17, 21, 26, ...
    assert layout.ps_ranks[:7] == (0, 4, 8, 13, 17, 21, 26) and layout.ps_ranks[-1] == 125
    assert derive_n_ps(130) == 30


def test_shard_ranges_like_array_split():
    assert shard_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert shard_ranges(1_686_950, 30)[0] == (0, 56232)  # 1686950 = 30 * 56231 + 20
    assert shard_ranges(1_686_950, 30)[-1] == (1_686_950 - 56231, 1_686_950)
    with pytest.raises(LayoutError):
        shard_ranges(2, 3)


@pytest.mark.parametrize("world, sets, fragment", [
    (1, [], "world size 1 cannot hold n_ps=1"),
    (4, ["n_ps=4"], "world size 4 cannot hold n_ps=4"),
    (4, ["mode=split", "n_replay=2", "n_actors=1", "n_learners=1"], "mode 'split'"),
    (3, ["mode=split", "n_replay=0"], "needs n_replay >= 1"),
])
def test_world_too_small(world, sets, fragment):
    with pytest.raises(LayoutError, match=fragment):
        make_layout(world, load_config(None, sets))


def test_table_text():
    layout = make_layout(4, load_config(None))
    text = format_table(layout, 10)
    assert "world size 4: 1 ps, 3 actor-learner" in text
    assert "actor-learner  ranks 1-3" in text
    assert "shard   0 on rank    0: [0, 10) 10 floats" in text
    assert ps_positions(7, 2) == [0, 3]
