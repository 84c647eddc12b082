"""Schedule benchmark: what deriving the split and every step's batch costs, per version.

On the real tasks' sizes and client columns (../shared/data through experiments.tasks) with
the experiments' settings, it times, for schedule version 1 (numpy) and version 2 (SHA-256
sorts, docs/PROTOCOL.md section 9):

* the train/eval split of all aligned ids (once per run load, both parties);
* ``shuffle``: building an epoch's order (once per epoch) and a cached step (every step);
* ``clients``: building the schedule (once per run load) and one step's batch (every step:
  the client draw and the rows of each chosen client are hashed anew each step).

Both parties do this work; party B on every step of every run it serves.

    python -m benchmarks.schedule [--repeats 7] [--steps 200]
"""

import argparse
import os
from pathlib import Path
from typing import Any

from benchmarks.common import summary_ms, timed, versions, write_result
from experiments.tasks import load_task
from shared.schedule import (
    SCHEDULE_VERSIONS,
    ClientBatches,
    ShuffledBatches,
    make_schedule,
    split_train_eval,
)

# task -> (eval_fraction, batch_size, clients_per_step or None): experiments/sweeps.py
TASKS: dict[str, tuple[float, int, int | None]] = {
    "femnist": (0.1, 20, 10),
    "so_tag": (0.1, 100, 10),
    "shakespeare": (0.05, 16, 8),
    "default_credit": (0.1, 256, None),
}


def measure(task: str, version: int, repeats: int, steps: int) -> dict[str, Any]:
    fraction, batch_size, per_step = TASKS[task]
    data = load_task(task)
    n = len(data.features.ids)
    train, _ = split_train_eval(n, seed=0, eval_fraction=fraction, version=version)
    row: dict[str, Any] = {"task": task, "version": version, "aligned": n, "train": len(train)}
    row["split"] = summary_ms(
        timed(
            lambda: split_train_eval(n, seed=0, eval_fraction=fraction, version=version),
            repeats,
        )
    )

    def fresh_epoch() -> None:
        ShuffledBatches(n=len(train), batch_size=batch_size, seed=0, version=version).batch(1)

    row["shuffle_epoch"] = summary_ms(timed(fresh_epoch, repeats))
    shuffled = ShuffledBatches(n=len(train), batch_size=batch_size, seed=0, version=version)
    shuffled.batch(1)
    row["shuffle_step"] = summary_ms(timed(lambda: shuffled.batch(2), 200))
    per_epoch = len(train) / batch_size
    row["shuffle_steps_per_epoch"] = per_epoch
    row["shuffle_amortized_ms"] = (
        row["shuffle_epoch"]["median_ms"] / per_epoch + row["shuffle_step"]["median_ms"]
    )

    groups = data.features.groups
    if groups is not None and per_step is not None:
        clients = [groups[p] for p in train.tolist()]
        row["clients"] = len(set(clients))
        row["clients_build"] = summary_ms(
            timed(
                lambda: make_schedule(
                    n=len(train),
                    batch_size=batch_size,
                    seed=0,
                    clients=clients,
                    clients_per_step=per_step,
                    version=version,
                ),
                repeats,
            )
        )
        schedule = ClientBatches(
            clients, clients_per_step=per_step, batch_size=batch_size, seed=0, version=version
        )
        counter = iter(range(1, 10**9))
        row["clients_step"] = summary_ms(timed(lambda: schedule.batch(next(counter)), steps))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=200, help="clients steps timed")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    load_before = os.getloadavg()
    rows = []
    for task in TASKS:
        for version in SCHEDULE_VERSIONS:
            row = measure(task, version, args.repeats, args.steps)
            rows.append(row)
            print(
                task,
                f"v{version}",
                {k: round(v["median_ms"], 3) for k, v in row.items() if isinstance(v, dict)},
            )
    path = write_result(
        "schedule",
        {
            "versions": versions("numpy"),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "settings": {k: list(v) for k, v in TASKS.items()},
            "rows": rows,
        },
        args.out,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
