"""``warm_up`` (``party_b.service.warmup``): a fresh process imports, before it serves, what
building a run's first top model and optimizer would otherwise import on a request."""

import subprocess
import sys

from tests.utils.servers import REPO_ROOT

_PROBE = """
import sys
before = "torch._dynamo" in sys.modules
from party_b.service.warmup import warm_up
warm_up()
print(before, "torch._dynamo" in sys.modules)
"""


def test_a_fresh_process_has_torchs_lazy_imports_done_after_warming_up() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["False", "True"]
