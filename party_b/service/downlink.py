"""What party B sends back for a step: the gradient w.r.t. z~ in the run's wire representation.

Encoding is pure (it changes no state) and happens before a step commits. A run's
``grad_dtype`` is a preference for the representation, not a promise the values can keep:
float16 holds magnitudes up to 65504, and a gradient that is finite in float32 can pass
that. Such a step's gradient goes as float32 (every decoder reads the dtype tag), so the
step is never lost to its encoding, and the same step always gets the same bytes.
"""

import logging

from party_b.metrics import Metrics
from party_b.top import StepOutcome
from shared import codec

__all__ = ["step_response"]

log = logging.getLogger("fedlite.party_b")


def step_response(
    step: int, outcome: StepOutcome, grad_dtype: codec.WireFloat, metrics: Metrics
) -> bytes:
    """The encoded StepResponse of ``step``: the run's dtype, or float32 where it overflows."""
    message = codec.StepResponse(
        step=step, loss=outcome.loss, metrics=outcome.metrics, grad=outcome.grad.numpy()
    )
    try:
        return codec.encode_step_response(message, grad_dtype=grad_dtype)
    except codec.RangeError as exc:
        log.info("step %d: %s; sent as float32", step, exc)
        metrics.grad_fallbacks.inc()
        return codec.encode_step_response(message, grad_dtype="float32")
