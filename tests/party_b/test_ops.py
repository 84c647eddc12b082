"""What party B's operator touches, with real processes: ``fedlite-b serve`` in its own process
(real HTTP, real SQLite file) and the ``fedlite-b`` maintenance commands run as a user runs them.

* after SIGTERM the ``.sqlite`` file alone holds every run (copied without its ``-wal``), and
  a party B started on that copy serves them;
* ``db backup`` while steps are being written: consistent, 0600, restorable; its mistakes
  are one line each;
* one log format with timestamps (JSON on request) and no access line per training step;
* tokens: ``issue`` refuses an existing name unless ``--rotate`` (the old token stops working
  at once), ``--out`` writes a 0600 file, ``list`` never creates a database.
"""

import json
import re
import shutil
import sqlite3
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.utils.cli import run_cli
from tests.utils.servers import PartyBProcess
from tests.utils.small_runs import MSGPACK, TOKEN, aligned_run, labels_csv

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) \S+: ")


def _count(database: Path, table: str) -> int:
    with sqlite3.connect(database) as connection:
        return int(connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _train_steps(server: PartyBProcess, runs: int, steps: int) -> list[str]:
    """``runs`` small runs at party B, ``steps`` applied training steps each (real HTTP)."""
    ids = []
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
    ) as client:
        for r in range(runs):
            run = aligned_run(client, name=f"run-{r}")
            for step in range(1, steps + 1):
                answer = client.post(
                    f"/v1/runs/{run.id}/steps", content=run.step_body(step), headers=MSGPACK
                )
                assert answer.status_code == 200, answer.text
            ids.append(run.id)
    return ids


@pytest.fixture
def labels(tmp_path: Path) -> Path:
    return labels_csv(tmp_path / "labels.csv")


# ------------------------------------------------------------------------ SIGTERM and WAL


def test_after_sigterm_the_database_file_alone_holds_every_run(
    tmp_path: Path, labels: Path
) -> None:
    server = PartyBProcess(
        tmp_path / "b", labels, {"tester": TOKEN}, extra_args=["--log-format", "json",
                                                               "--log-level", "info"]
    )  # fmt: skip
    server.start()
    try:
        ids = _train_steps(server, runs=3, steps=4)
    finally:
        server.stop()  # SIGTERM
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    shutil.copy(server.database, copy_dir / "party_b.sqlite")  # the file alone, no -wal

    assert server.proc is not None and server.proc.returncode in (0, -15)
    assert _count(copy_dir / "party_b.sqlite", "runs") == 3
    assert _count(copy_dir / "party_b.sqlite", "step_log") == 12
    # restore: party B on the copied file serves every run where it was
    restored = PartyBProcess(copy_dir, labels, {"tester": TOKEN})
    restored.start()
    try:
        listed = httpx.get(
            f"{restored.url}/v1/runs", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ).json()["runs"]
    finally:
        restored.stop()
    assert sorted(r["id"] for r in listed) == sorted(ids)
    assert {r["step"] for r in listed} == {4}
    # and the JSON log of the first server: every line one object with a time and a level
    lines = [line for line in server.log().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    assert any(r["logger"].startswith("uvicorn") for r in records)


# ------------------------------------------------------------------------ serving party B


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PartyBProcess]:
    """One party B for this module, logging at info level in the default text format; a
    token for "ops" issued with the CLI into ``ops.token`` beside its data directory."""
    root = tmp_path_factory.mktemp("serving")
    data_dir = root / "b"
    issued = run_cli("b", "token", "issue", "--name", "ops", "--data-dir", str(data_dir),
                     "--out", str(root / "ops.token"))  # fmt: skip
    assert issued.returncode == 0, issued.stderr
    labels = labels_csv(root / "labels.csv")
    server = PartyBProcess(data_dir, labels, {"tester": TOKEN}, extra_args=["--log-level", "info"])
    server.start()
    yield server
    server.stop()


def test_backup_while_steps_are_written_is_consistent_private_and_restorable(
    serving: PartyBProcess, tmp_path: Path
) -> None:
    _train_steps(serving, runs=1, steps=2)
    backups = tmp_path / "backups"
    backups.mkdir()
    errors: list[BaseException] = []

    def keep_training() -> None:
        try:
            _train_steps(serving, runs=2, steps=6)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    writer = threading.Thread(target=keep_training)
    writer.start()
    taken = [
        run_cli("b", "db", "backup", "--data-dir", str(serving.data_dir),
                "--to", str(backups / f"b{i}.sqlite"))
        for i in range(3)
    ]  # fmt: skip
    writer.join(timeout=300)

    assert not errors, errors
    for i, ran in enumerate(taken):
        copy = backups / f"b{i}.sqlite"
        assert ran.returncode == 0 and "integrity_check: ok" in ran.stdout, ran.stderr
        assert _mode(copy) == 0o600
        assert not Path(f"{copy}-wal").exists()  # one self-contained file
        with sqlite3.connect(copy) as connection:
            # consistent: every applied step of a run is in its step log, none beyond
            rows = connection.execute(
                "SELECT r.id, (SELECT count(*) FROM step_log s WHERE s.run_id = r.id), "
                "(SELECT max(step) FROM step_log s WHERE s.run_id = r.id) FROM runs r"
            ).fetchall()
        assert rows and all(n == (top or 0) for _id, n, top in rows)
    restored_dir = tmp_path / "restored"
    restored_dir.mkdir()
    shutil.copy(backups / "b2.sqlite", restored_dir / "party_b.sqlite")
    assert _count(restored_dir / "party_b.sqlite", "runs") >= 1


def test_backup_mistakes_are_one_line_each(serving: PartyBProcess, tmp_path: Path) -> None:
    data_dir = str(serving.data_dir)
    missing_dir = run_cli(
        "b", "db", "backup", "--data-dir", data_dir, "--to", "missing-dir/x.sqlite", cwd=tmp_path
    )
    (tmp_path / "taken.sqlite").write_text("")
    existing = run_cli("b", "db", "backup", "--data-dir", data_dir, "--to", "taken.sqlite",
                       cwd=tmp_path)  # fmt: skip
    no_database = run_cli("b", "db", "backup", "--data-dir", str(tmp_path / "nowhere"),
                          "--to", "y.sqlite", cwd=tmp_path)  # fmt: skip

    for ran in (missing_dir, existing, no_database):
        assert ran.returncode == 1 and len(ran.stderr.strip().splitlines()) == 1, ran.stderr
        assert "Traceback" not in ran.stderr
    assert "directory missing-dir does not exist" in missing_dir.stderr
    assert "mkdir -p missing-dir" in missing_dir.stderr
    assert "taken.sqlite exists" in existing.stderr
    assert f"no database at {tmp_path / 'nowhere' / 'party_b.sqlite'}" in no_database.stderr
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "y.sqlite").exists()


def test_logs_have_one_format_with_timestamps_and_no_line_per_step(
    serving: PartyBProcess,
) -> None:
    _train_steps(serving, runs=1, steps=5)
    lines = [line for line in serving.log().splitlines() if line.strip()]

    assert lines and all(TIMESTAMP.match(line) for line in lines), lines
    assert any("uvicorn.error: Uvicorn running on" in line for line in lines)
    assert any('"POST /v1/runs HTTP/1.1" 201' in line for line in lines)  # other requests stay
    assert not any("/steps" in line for line in lines)
    assert not any("/healthz" in line for line in lines)


# ------------------------------------------------------------------------ tokens


def test_token_issue_refuses_an_existing_name_unless_rotated(serving: PartyBProcess) -> None:
    data_dir = str(serving.data_dir)
    token_file = serving.data_dir.parent / "ops.token"
    old = token_file.read_text().strip()

    again = run_cli("b", "token", "issue", "--name", "ops", "--data-dir", data_dir)
    rotated = run_cli("b", "token", "issue", "--name", "ops", "--rotate", "--data-dir", data_dir)
    new = rotated.stdout.strip()

    def status(token: str) -> int:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.get(f"{serving.url}/v1/runs", headers=headers, timeout=30).status_code

    assert _mode(token_file) == 0o600
    assert again.returncode == 1 and again.stdout == ""
    assert "a token named 'ops' exists (active); pass --rotate" in again.stderr
    assert rotated.returncode == 0 and new and new != old
    assert status(old) == 401 and status(new) == 200


def test_token_list_without_a_database_creates_none(tmp_path: Path) -> None:
    ran = run_cli("b", "token", "list", cwd=tmp_path)  # default --data-dir: ./fedlite-b-data

    assert ran.returncode == 1
    assert f"no database at {tmp_path / 'fedlite-b-data' / 'party_b.sqlite'}" in ran.stderr
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ start-up errors


def test_start_up_mistakes_are_one_line_naming_the_file_and_the_fix(
    tmp_path: Path, labels: Path
) -> None:
    import trustme

    ca = trustme.CA()
    cert, other = ca.issue_cert("localhost"), ca.issue_cert("localhost")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    other.private_key_pem.write_to_path(str(tmp_path / "other.key"))
    serve = ["serve", "--labels", str(labels), "--data-dir", str(tmp_path / "b"),
             "--tokens", f"tester:{TOKEN}"]  # fmt: skip

    missing = run_cli("b", *serve, "--ssl-certfile", str(tmp_path / "nope.pem"),
                      "--ssl-keyfile", str(tmp_path / "other.key"))  # fmt: skip
    mismatch = run_cli("b", *serve, "--ssl-certfile", str(tmp_path / "cert.pem"),
                       "--ssl-keyfile", str(tmp_path / "other.key"))  # fmt: skip
    typo = run_cli("b", *serve, env={"FEDLITE_B_LIMIT_MAX_BATCHH": "5"})

    for ran in (missing, mismatch, typo):
        assert ran.returncode == 2 and len(ran.stderr.strip().splitlines()) == 1, ran.stderr
    assert f"TLS certificate {tmp_path / 'nope.pem'} does not exist" in missing.stderr
    assert "FEDLITE_B_SSL_CERTFILE" in missing.stderr
    assert f"TLS key {tmp_path / 'other.key'} does not match the certificate" in mismatch.stderr
    assert "FEDLITE_B_LIMIT_MAX_BATCHH (did you mean FEDLITE_B_LIMIT_MAX_BATCH?)" in typo.stderr


def test_version_and_global_flags_go_anywhere(tmp_path: Path) -> None:
    from importlib.metadata import version

    before = run_cli("b", "--version")
    after = run_cli("b", "token", "list", "--version")
    flags = run_cli("b", "token", "list", "--data-dir", str(tmp_path / "x"), "-v",
                    "--log-format", "json")  # fmt: skip

    assert before.returncode == 0 and before.stdout.strip() == f"fedlite-b {version('fedlite-vfl')}"
    assert after.returncode == 0 and version("fedlite-vfl") in after.stdout
    assert flags.returncode == 1 and "no database at" in flags.stderr  # parsed, then refused
