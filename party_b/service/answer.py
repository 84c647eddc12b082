"""What party B sends back for a step: the gradient w.r.t. z~ in the run's downlink.

Encoding is pure (it changes no state) and happens before a step commits: its randomness
(stochastic rounding, the k-means of "pq") is seeded by the run's seed and the step, so the
same step always gets the same bytes, and the stored answer a replay returns is the one a
recomputation would give. A run's 16-bit float downlink is a preference the values may not
keep: float16 holds magnitudes up to 65504 (bfloat16 about 3.4e38), and a gradient that is
finite in float32 can pass that. Such a step's gradient goes as float32 (every decoder reads
the representation from the message), so the step is never lost to its encoding.
"""

import logging

import numpy as np
from numpy.typing import NDArray

from party_b.metrics import Metrics
from shared import codec
from shared.codec import DownlinkSpec
from shared.schedule import step_seed

__all__ = ["step_response"]

log = logging.getLogger("fedlite.party_b")

_FLOAT32 = DownlinkSpec(kind="float32")


def step_response(
    *,
    step: int,
    loss: float,
    step_metrics: dict[str, float],
    grad: NDArray[np.float32],
    downlink: DownlinkSpec,
    run_seed: int,
    metrics: Metrics,
    purpose: str = "downlink",
) -> bytes:
    """The encoded StepResponse of ``step``: the run's downlink, or float32 where it overflows.

    ``grad`` (rows, d) is what party A may see of d loss / d z~ (after any defence);
    ``purpose``: of the step seed its stochastic rounding draws from (one per feature party
    of a run with several, docs/PROTOCOL.md 12.6).
    """
    message = codec.StepResponse(step=step, loss=loss, metrics=step_metrics, grad=grad)
    seed = step_seed(run_seed, step, purpose)
    try:
        return codec.encode_step_response(message, downlink=downlink, seed=seed)
    except codec.RangeError as exc:
        log.info("step %d: %s; sent as float32", step, exc)
        metrics.grad_fallbacks.inc()
        return codec.encode_step_response(message, downlink=_FLOAT32)
