"""Locating ../shared/data: skip with a reason when it is absent, but fail under CI."""

import os
from pathlib import Path

import pytest

# ../shared/data beside the repository; FEDLITE_SHARED_DATA points elsewhere (a git worktree
# that does not sit beside it)
SHARED_DATA = Path(
    os.environ.get("FEDLITE_SHARED_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data"
)


def shared_data(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        message = f"{path} is missing (the read-only ../shared/data beside the repository)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def breast_pair() -> tuple[Path, Path]:
    """FATE's breast_hetero (guest = party B with labels, host = party A)."""
    return (
        shared_data("fate_hetero", "breast_hetero_guest.csv.gz"),
        shared_data("fate_hetero", "breast_hetero_host.csv.gz"),
    )
