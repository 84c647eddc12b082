"""Batch schedules: both parties must derive the same rows and chunks from (seed, step)."""

import numpy as np
import pytest

from shared.accounting import raw_step_request_bytes
from shared.schedule import ClientBatches, ShuffledBatches, batch_positions


def _groups(sizes: dict[str, int], seed: int = 0) -> list[str]:
    """Client names of a shuffled train list with ``sizes[name]`` rows per client."""
    names = [name for name, n in sizes.items() for _ in range(n)]
    return list(np.random.default_rng(seed).permutation(names))


def test_shuffled_batches_are_batch_positions_in_one_chunk() -> None:
    schedule = ShuffledBatches(n=50, batch_size=8, seed=3)

    batch = schedule.batch(7)

    assert batch.chunk_sizes == (8,)
    np.testing.assert_array_equal(batch.positions, batch_positions(7, batch_size=8, n=50, seed=3))


@pytest.mark.parametrize("clients_per_step", [1, 3, 10])
@pytest.mark.parametrize("batch_size", [1, 5, 20])
def test_each_chunk_is_distinct_rows_of_one_distinct_client(
    clients_per_step: int, batch_size: int
) -> None:
    groups = _groups({f"w{i:02d}": 3 + 4 * i for i in range(8)})
    schedule = ClientBatches(
        groups, clients_per_step=clients_per_step, batch_size=batch_size, seed=11
    )

    for step in range(1, 30):
        batch = schedule.batch(step)

        assert len(batch.chunk_sizes) == min(clients_per_step, 8)
        assert sum(batch.chunk_sizes) == len(batch.positions)
        assert len(set(batch.positions.tolist())) == len(batch.positions)
        offsets = np.cumsum((0, *batch.chunk_sizes))
        owners = []
        for lo, hi in zip(offsets[:-1], offsets[1:], strict=True):
            clients = {groups[p] for p in batch.positions[lo:hi].tolist()}
            assert len(clients) == 1
            (client,) = clients
            assert hi - lo == min(batch_size, groups.count(client))
            owners.append(client)
        assert owners == sorted(set(owners))  # distinct, in name order


def test_both_parties_get_the_same_batch_whatever_order_they_list_groups_in() -> None:
    """The schedule depends on each position's client name, not on internal client codes."""
    groups = _groups({"b": 9, "a": 7, "c": 30, "d": 1})
    one = ClientBatches(groups, clients_per_step=2, batch_size=4, seed=5)
    two = ClientBatches(list(groups), clients_per_step=2, batch_size=4, seed=5)

    for step in (1, 2, 99):
        assert one.batch(step).chunk_sizes == two.batch(step).chunk_sizes
        np.testing.assert_array_equal(one.batch(step).positions, two.batch(step).positions)


def test_steps_and_seeds_draw_different_clients() -> None:
    groups = _groups({f"w{i}": 10 for i in range(50)})
    schedule = ClientBatches(groups, clients_per_step=10, batch_size=4, seed=0)
    other_seed = ClientBatches(groups, clients_per_step=10, batch_size=4, seed=1)

    first = schedule.batch(1).positions
    assert not np.array_equal(first, schedule.batch(2).positions)
    assert not np.array_equal(first, other_seed.batch(1).positions)
    np.testing.assert_array_equal(first, schedule.batch(1).positions)  # a pure function


def test_clients_are_sampled_uniformly() -> None:
    groups = _groups({f"w{i}": 1 + i for i in range(5)})
    schedule = ClientBatches(groups, clients_per_step=1, batch_size=1, seed=2)

    counts: dict[str, int] = {}
    for step in range(1, 2001):
        (position,) = schedule.batch(step).positions.tolist()
        counts[groups[position]] = counts.get(groups[position], 0) + 1

    assert set(counts) == {f"w{i}" for i in range(5)}
    assert all(300 < c < 500 for c in counts.values()), counts


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        ClientBatches(["a"], clients_per_step=0, batch_size=1, seed=0)
    with pytest.raises(ValueError, match="at least one"):
        ClientBatches([], clients_per_step=1, batch_size=1, seed=0)
    with pytest.raises(ValueError, match="numbered from 1"):
        ClientBatches(["a"], clients_per_step=1, batch_size=1, seed=0).batch(0)


def test_raw_request_bytes_count_one_chunk_per_client() -> None:
    one = raw_step_request_bytes(d=16, batch=20)
    ten = raw_step_request_bytes(d=16, batch=[2] * 10)

    # docs/PROTOCOL.md section 7: 31 + i(s) + arr(K) + K raw chunks of 19 + i(B) + i(d) + hdr + x
    assert one == 31 + 1 + 1 + (19 + 1 + 1 + 3 + 20 * 16 * 4)
    assert ten == 31 + 1 + 1 + 10 * (19 + 1 + 1 + 2 + 2 * 16 * 4)
