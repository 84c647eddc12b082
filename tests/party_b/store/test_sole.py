"""One serving party B per SQLite file (``party_b.store.sole``): the lock that lets a party B
on SQLite skip fencing its run leases is real, held by the kernel for a process's lifetime."""

import os
import subprocess
import sys
from pathlib import Path

from party_b.store import make_engine, sole

ROOT = Path(__file__).resolve().parents[3]

_TRY_HOLD = """
import sys
from party_b.store import sole
try:
    sole.hold(sys.argv[1])
except sole.SQLiteInUse as exc:
    print(exc)
    sys.exit(7)
print("held")
"""


def _other_process_holds(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _TRY_HOLD, url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_a_second_process_on_a_held_file_is_refused_naming_the_holder(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'party_b.sqlite'}"
    assert sole.hold(url) is True
    assert sole.hold(url) is True  # again in the same process: a no-op
    assert sole.holds(make_engine(url))

    other = _other_process_holds(url)

    assert other.returncode == 7, other.stderr
    assert f"process {os.getpid()}" in other.stdout and "one SQLite file has one party B" in (
        other.stdout
    )


def test_a_file_no_process_holds_is_free_and_freed_when_its_holder_exits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'party_b.sqlite'}"

    first, second = _other_process_holds(url), _other_process_holds(url)

    assert (first.returncode, first.stdout.strip()) == (0, "held")
    assert (second.returncode, second.stdout.strip()) == (0, "held")  # the first one exited
    assert not sole.holds(make_engine(url))  # this process never took it


def test_a_released_file_is_free_for_another_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'party_b.sqlite'}"
    sole.hold(url)

    sole.release(url)
    other = _other_process_holds(url)

    assert (other.returncode, other.stdout.strip()) == (0, "held"), other.stdout
    assert not sole.holds(make_engine(url))


def test_other_databases_are_never_held() -> None:
    assert sole.hold("postgresql+psycopg://party_b@db.example.org/party_b") is False
    assert sole.hold("sqlite://") is False  # in memory: nobody else can open it
