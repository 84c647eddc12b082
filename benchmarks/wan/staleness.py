"""Accuracy against pipeline depth K: what the staleness of pipelining costs.

With K steps in flight the bottom model that forwards step t has applied the gradients of
steps <= t - K (docs/ARCHITECTURE.md, "Pipelining"; the runs here checkpoint once, at the
end, so the pipeline never drains). Each run is the product's two parties end to end
(``experiments.runner.run_split``, party B in process), FedLite at the sweeps' settings:

* default_credit (FATE): 600 steps of 256 rows, Adam 0.003, q=8 L=2 lambda=1e-3;
* FEMNIST: a short run of ``--femnist-steps`` steps, 10 writers x 20 images, SGD 0.1,
  q=1152 L=2 lambda=2e-4 (the headline setting; the full runs are 1,000-2,000 steps).

    python -m benchmarks.wan.staleness [--depths 1,2,4] [--femnist-steps 100] [--seeds 1]
"""

import argparse
import os
import time
from dataclasses import replace
from typing import Any

from benchmarks.common import versions, write_result
from experiments.runner import RunConfig, run_split

CREDIT = RunConfig(
    task="default_credit", method="fedlite", steps=600, batch_size=256, lr_bottom=0.003,
    lr_top=0.003, optimizer="adam", q=8, L=2, lam=1e-3, eval_every=100,
)  # fmt: skip
FEMNIST = RunConfig(
    task="femnist", method="fedlite", steps=300, batch_size=20, clients_per_step=10,
    lr_bottom=0.1, lr_top=0.1, optimizer="sgd", q=1152, L=2, lam=2e-4, eval_every=50,
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="1,2,4")
    parser.add_argument("--femnist-steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--tasks", default="default_credit,femnist")
    args = parser.parse_args()
    depths = [int(k) for k in args.depths.split(",")]
    bases = {"default_credit": CREDIT, "femnist": replace(FEMNIST, steps=args.femnist_steps)}
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for task in args.tasks.split(","):
        for seed in range(args.seeds):
            for k in depths:
                config = replace(bases[task], seed=seed, pipeline_depth=k)
                started = time.perf_counter()
                record = run_split(config)
                rows.append(
                    {
                        "task": task,
                        "seed": seed,
                        "depth": k,
                        "steps": record["steps"],
                        "final": record["final"],
                        "curve": [
                            {k2: v for k2, v in point.items() if k2.startswith(("step", "eval_"))}
                            for point in record["curve"]
                        ],
                        "seconds": time.perf_counter() - started,
                    }
                )
                print(task, seed, k, record["final"], flush=True)
                write_result(  # after every run: a cut-off session keeps what it measured
                    "staleness",
                    {
                        "versions": versions("torch"),
                        "loadavg_before": list(load_before),
                        "loadavg_after": list(os.getloadavg()),
                        "settings": {"credit": CREDIT.key, "femnist": bases["femnist"].key},
                        "rows": rows,
                    },
                )


if __name__ == "__main__":
    main()
