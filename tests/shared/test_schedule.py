"""Batch schedules: both parties must derive the same rows and chunks from (seed, step).

The properties hold for every schedule version (1: numpy, runs stored before versions; 2: the
SHA-256 draws of docs/PROTOCOL.md); their exact outputs are pinned in test_schedule_versions
and docs/conformance/.
"""

import numpy as np
import pytest

from shared.accounting import raw_step_request_bytes
from shared.schedule import (
    SCHEDULE_VERSIONS,
    ClientBatches,
    ShuffledBatches,
    batch_positions,
    split_train_eval,
)

versions = pytest.mark.parametrize("version", SCHEDULE_VERSIONS)


def _groups(sizes: dict[str, int], seed: int = 0) -> list[str]:
    """Client names of a shuffled train list with ``sizes[name]`` rows per client."""
    names = [name for name, n in sizes.items() for _ in range(n)]
    return list(np.random.default_rng(seed).permutation(names))


@versions
def test_shuffled_batches_are_batch_positions_in_one_chunk(version: int) -> None:
    schedule = ShuffledBatches(n=50, batch_size=8, seed=3, version=version)

    batch = schedule.batch(7)

    assert batch.chunk_sizes == (8,)
    np.testing.assert_array_equal(
        batch.positions, batch_positions(7, batch_size=8, n=50, seed=3, version=version)
    )


@versions
@pytest.mark.parametrize("batch_size", [1, 7, 10, 23])
def test_every_epoch_visits_each_train_position_once(version: int, batch_size: int) -> None:
    n, epochs = 10, 5
    schedule = ShuffledBatches(n=n, batch_size=batch_size, seed=1, version=version)

    steps = n * epochs // batch_size
    stream = np.concatenate([schedule.batch(t).positions for t in range(1, steps + 1)])

    for e in range(len(stream) // n):
        assert sorted(stream[e * n : (e + 1) * n].tolist()) == list(range(n))
    epoch_orders = {tuple(stream[e * n : (e + 1) * n].tolist()) for e in range(len(stream) // n)}
    assert len(epoch_orders) > 1  # every epoch is shuffled anew


@versions
@pytest.mark.parametrize(("n", "fraction"), [(1, 0.5), (2, 0.9), (10, 0.0), (10, 0.3), (569, 0.2)])
def test_the_split_is_a_partition_with_train_never_empty(
    version: int, n: int, fraction: float
) -> None:
    train, held_out = split_train_eval(n, seed=4, eval_fraction=fraction, version=version)

    assert sorted([*train.tolist(), *held_out.tolist()]) == list(range(n))
    assert train.tolist() == sorted(train.tolist()) and len(train) >= 1
    assert len(held_out) == min(n - 1, round(n * fraction))


@versions
@pytest.mark.parametrize("clients_per_step", [1, 3, 10])
@pytest.mark.parametrize("batch_size", [1, 5, 20])
def test_each_chunk_is_distinct_rows_of_one_distinct_client(
    clients_per_step: int, batch_size: int, version: int
) -> None:
    groups = _groups({f"w{i:02d}": 3 + 4 * i for i in range(8)})
    schedule = ClientBatches(
        groups,
        clients_per_step=clients_per_step,
        batch_size=batch_size,
        seed=11,
        version=version,
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


@versions
def test_both_parties_get_the_same_batch_from_equal_groups(version: int) -> None:
    """The schedule depends on each position's client name, not on internal client codes."""
    groups = _groups({"b": 9, "a": 7, "c": 30, "d": 1})
    one = ClientBatches(groups, clients_per_step=2, batch_size=4, seed=5, version=version)
    two = ClientBatches(list(groups), clients_per_step=2, batch_size=4, seed=5, version=version)

    for step in (1, 2, 99):
        assert one.batch(step).chunk_sizes == two.batch(step).chunk_sizes
        np.testing.assert_array_equal(one.batch(step).positions, two.batch(step).positions)


@versions
def test_steps_and_seeds_draw_different_clients(version: int) -> None:
    groups = _groups({f"w{i}": 10 for i in range(50)})
    schedule = ClientBatches(groups, clients_per_step=10, batch_size=4, seed=0, version=version)
    other_seed = ClientBatches(groups, clients_per_step=10, batch_size=4, seed=1, version=version)

    first = schedule.batch(1).positions
    assert not np.array_equal(first, schedule.batch(2).positions)
    assert not np.array_equal(first, other_seed.batch(1).positions)
    np.testing.assert_array_equal(first, schedule.batch(1).positions)  # a pure function


@versions
def test_clients_and_their_rows_are_sampled_uniformly(version: int) -> None:
    groups = _groups({f"w{i}": 1 + i for i in range(5)})
    schedule = ClientBatches(groups, clients_per_step=1, batch_size=1, seed=2, version=version)

    counts: dict[str, int] = {}
    rows: dict[int, int] = {}
    for step in range(1, 2001):
        (position,) = schedule.batch(step).positions.tolist()
        counts[groups[position]] = counts.get(groups[position], 0) + 1
        rows[position] = rows.get(position, 0) + 1

    assert set(counts) == {f"w{i}" for i in range(5)}
    assert all(300 < c < 500 for c in counts.values()), counts
    w4 = [p for p, g in enumerate(groups) if g == "w4"]  # 5 rows, each ~1/25 of the steps
    assert all(40 < rows.get(p, 0) < 130 for p in w4), [rows.get(p, 0) for p in w4]


def test_clients_are_ordered_by_the_utf8_bytes_of_their_names() -> None:
    """Not by UTF-16 code units (Java, JavaScript): U+FF21 sorts before U+1F600 there."""
    names = ["\U0001f600", "\uff21", "Z", "a", "\u00e9"]
    schedule = ClientBatches(names, clients_per_step=5, batch_size=1, seed=0)

    assert schedule.clients == ["Z", "a", "\u00e9", "\uff21", "\U0001f600"]
    assert [names[p] for p in schedule.batch(1).positions.tolist()] == schedule.clients


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
