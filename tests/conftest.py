"""Settings for the whole test session."""

import os
import sys

# One intra-op thread per process: this one and every party A / party B process the tests
# start (they inherit the environment). The test models are tiny, and torch's thread pool
# spinning on a shared 2-core machine costs several times the CPU of the work itself (a
# 60-step run: 7.3 s wall with the default pool, 1.2 s with one thread). Results stay
# reproducible: every comparison in the suite is between runs under the same setting.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before us by a plugin: apply it there too
    sys.modules["torch"].set_num_threads(1)
