"""FedLite's grouped product quantizer: one concept, one folder (paper section 3.1).

The public face: ``GroupedProductQuantizer`` (encode / assign / decode / quantize),
``PQConfig`` (q, L, R, k-means budget) and ``PQCode``, the quantized batch that the wire
carries as it is (``shared.codec``). ``frozen`` holds the serving codebook and the export
format. The k-means backends are private (``kmeans`` picks one; ``_kernels``, ``_lloyd``,
``_threads`` and ``_seeding`` are its numba kernels).
"""

from shared.pq.quantizer import (
    MAX_CENTROIDS,
    GroupedProductQuantizer,
    PQCode,
    PQConfig,
    relative_error,
)

__all__ = ["MAX_CENTROIDS", "GroupedProductQuantizer", "PQCode", "PQConfig", "relative_error"]
