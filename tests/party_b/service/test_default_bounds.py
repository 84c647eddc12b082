"""Party B bounds the bytes of the runs it keeps in memory by default
(``party_b.service.bounds.default_live_bytes``): half the memory it may use, the machine's or
its container's limit (cgroup v2 or v1) if lower. Before, the default bounded only the count
(32 runs: about 25 GB with 50 M-parameter top models)."""

import logging
import os
from pathlib import Path

import pytest

from party_b.api import create_app
from party_b.service.bounds import default_live_bytes, memory_available
from party_b.settings import Settings
from tests.utils.small_runs import labels_csv

PHYSICAL = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.mark.parametrize(
    ("v2", "v1", "available"),
    [
        ("2147483648", None, min(PHYSICAL, 2**31)),  # a container limited to 2 GiB
        ("max", None, PHYSICAL),  # cgroup v2 without a limit
        (None, "9223372036854771712", PHYSICAL),  # cgroup v1's "no limit"
        (None, "1073741824", min(PHYSICAL, 2**30)),
        (None, None, PHYSICAL),  # no cgroup files at all
    ],
)
def test_the_default_byte_bound_is_half_the_memory_party_b_may_use(
    tmp_path: Path, v2: str | None, v1: str | None, available: int
) -> None:
    files = [tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"]
    for path, text in zip(files, (v2, v1), strict=True):
        if text is not None:
            path.write_text(text + "\n")

    assert memory_available(files) == available
    assert default_live_bytes(files) == available // 2


def test_party_b_starts_with_the_default_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(data_dir=tmp_path / "b", labels=labels_csv(tmp_path / "labels.csv"))

    with caplog.at_level(logging.INFO, logger="fedlite.party_b"):
        create_app(settings)

    gib = default_live_bytes() / 2**30
    assert f"at most 32 runs and {gib:.1f} GiB of their tensors" in caplog.text
