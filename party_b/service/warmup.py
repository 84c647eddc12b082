"""A fresh party B process pays its one-time costs before it serves, not on a run's request.

The first top model and optimizer a process builds import the rest of torch (its compiler
stack, ``torch._dynamo``): 2.4 s on the 2-core machine when quiet, 4.4-6.9 s under load. A
replica that takes runs over after a failure is often one just restarted, and every run it
took over waited for that import on its first request: it was most of the recovery time the
failover benchmark measured. ``warm_up`` builds a throwaway top model, takes one optimizer
step and round-trips its checkpoint bytes, so that all of it is imported before the server
answers its first health check.
"""

import time

import torch

from party_b.top import TopTrainer
from shared.models import task

__all__ = ["warm_up"]

_MODEL = "tabular_mlp"  # the smallest top model; any model imports the same torch modules


def warm_up() -> float:
    """Build, step and checkpoint a throwaway top model; returns the seconds it took."""
    started = time.perf_counter()
    trainer = TopTrainer(
        model=_MODEL,
        top_kwargs={"hidden": [4], "num_classes": 2, "side_features": 0},
        cut_dim=4,
        optimizer={"name": "adam", "lr": 0.001},
        task=task(_MODEL),
        seed=0,
    )
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(2, 4, generator=generator)
    trainer.train_step(z, torch.tensor([0, 1]), None, dropout_seed=0)
    trainer.load_state(*trainer.state())
    return time.perf_counter() - started
