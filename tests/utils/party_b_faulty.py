"""``fedlite-b`` with one fault hook for crash tests: stall inside a checkpoint write on request.

Run as ``python -m tests.utils.party_b_faulty serve ...`` (same flags as ``fedlite-b``). While
the file named by ``FEDLITE_TEST_ARM`` does not exist it behaves exactly like ``fedlite-b``.
When it exists, the next checkpoint write removes it, stages the new checkpoint row and the
pruning of old ones in the open transaction, writes the step to the file named by
``FEDLITE_TEST_PAUSED`` and then stalls before the commit: a test that waits for that file
and sends SIGKILL has provably killed party B in the middle of a checkpoint write.
"""

import os
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from party_b import store
from party_b.ops.cli import main
from party_b.store.engine import Database

_save_checkpoint = store.save_checkpoint


def _save_checkpoint_then_stall(db: Database, **kwargs: Any) -> None:
    _save_checkpoint(db, **kwargs)
    try:
        Path(os.environ["FEDLITE_TEST_ARM"]).unlink()
    except (KeyError, FileNotFoundError):
        return
    if isinstance(db, Session):  # (a step's commit writes on a connection: executed already)
        db.flush()  # the row is written into the transaction, not committed
    paused = Path(os.environ["FEDLITE_TEST_PAUSED"])
    paused.with_suffix(".tmp").write_text(str(kwargs["step"]))
    paused.with_suffix(".tmp").replace(paused)  # atomic: the test never reads it half written
    time.sleep(60)  # the test kills us here


store.save_checkpoint = _save_checkpoint_then_stall

if __name__ == "__main__":
    sys.exit(main())
