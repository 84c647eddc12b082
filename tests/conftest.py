"""Settings for the whole test session."""

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import httpx

# One intra-op thread per process: this one and every party A / party B process the tests
# start (they inherit the environment). The test models are tiny, and torch's thread pool
# spinning on a shared 2-core machine costs several times the CPU of the work itself (a
# 60-step run: 7.3 s wall with the default pool, 1.2 s with one thread). Results stay
# reproducible: every comparison in the suite is between runs under the same setting.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before us by a plugin: apply it there too
    sys.modules["torch"].set_num_threads(1)


# httpx's module-level helpers (httpx.get, httpx.post, ...) time out after 5 s. The tests call
# them directly against real servers, and under a load of 5+ on 2 CPUs a request that loads a
# run or a model took longer: the dashboard's browser test failed on a ReadTimeout creating
# its run, which said nothing about the product. A test's direct request gets 60 s unless it
# names its own timeout; party A's client (httpx.Client) and every subprocess keep theirs.
def _patient(request: Callable[..., httpx.Response]) -> Callable[..., httpx.Response]:
    @functools.wraps(request)
    def call(*args: Any, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("timeout", 60.0)
        return request(*args, **kwargs)

    return call


for _name in ("request", "get", "post", "put", "patch", "delete", "head", "options"):
    setattr(httpx, _name, _patient(getattr(httpx, _name)))
