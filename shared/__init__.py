"""FedLite shared library: quantizer, k-means, gradient correction, wire codec, accounting, models.

Pure library: torch, numpy and msgpack only. It never imports fastapi, httpx or sqlalchemy,
so both parties (and the experiment harness) use exactly the same code.
"""
