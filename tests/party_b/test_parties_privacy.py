"""The label privacy of a run ``fedlite-b parties create`` makes, on a real SQLite file.

``fedlite-b serve`` records at start-up the policy it gives new runs (``party_b.store.served``);
``parties create`` without ``--privacy`` gives its run that policy, says so on stderr and in
its JSON; ``--privacy`` (or FEDLITE_B_PRIVACY) wins over it; with no serve recorded in the
database, party B's default (label DP). ``serve`` runs as the real process (its start-up is
the subject), ``parties create`` in this process.
"""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from party_b import store
from party_b.privacy.policy import PRESETS, parse_policy
from tests.utils.cli import Ran, run_cli
from tests.utils.parties import party_spec
from tests.utils.servers import PartyBProcess
from tests.utils.small_runs import TOKEN, labels_csv

SERVED = "off,predict_train_ids=true"  # what the demos serve with


@dataclass
class Database:
    """Party B's data directory, its label table and a run file naming two parties."""

    data_dir: Path
    labels: Path
    spec: Path

    def create(self, *flags: str, env: dict[str, str] | None = None) -> Ran:
        return run_cli(
            "b", "parties", "create", str(self.spec), "--owner", "tester",
            "--data-dir", str(self.data_dir), "--labels", str(self.labels), *flags, env=env,
        )  # fmt: skip

    def run_policy(self, run_id: str) -> dict[str, Any]:
        engine = store.make_engine(f"sqlite:///{self.data_dir / 'party_b.sqlite'}")
        try:
            with store.make_session_factory(engine)() as session:
                row = store.run_privacy(session, run_id)
                assert row is not None
                return row.policy
        finally:
            engine.dispose()


def _database(root: Path) -> Database:
    spec = root / "run.json"
    spec.write_text(json.dumps(party_spec({"bank": 4, "telco": 4})))
    return Database(root / "b", labels_csv(root / "labels.csv"), spec)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """A database whose party B served (and stopped) with the demos' policy."""
    database = _database(tmp_path_factory.mktemp("served"))
    server = PartyBProcess(
        database.data_dir, database.labels, {"tester": TOKEN}, extra_args=["--privacy", SERVED]
    )
    server.start()
    server.stop()
    yield database


def _created(ran: Ran) -> dict[str, Any]:
    assert ran.returncode == 0, ran.stderr
    out: dict[str, Any] = json.loads(ran.stdout)  # one JSON object, as before
    assert set(out) == {"run", "tokens", "privacy"} and set(out["tokens"]) == {"bank", "telco"}
    return out


def test_without_privacy_the_run_gets_the_policy_serve_recorded(served: Database) -> None:
    ran = served.create()

    created = _created(ran)
    assert created["privacy"] == SERVED
    assert f"privacy: {SERVED} (the policy fedlite-b serve recorded in this database" in ran.stderr
    assert served.run_policy(created["run"]) == parse_policy(SERVED).to_stored()  # no label DP


def test_an_explicit_privacy_wins_over_the_recorded_one(served: Database) -> None:
    # (epsilon 0.7 first: two label draws, 0.7 and the default's, fit the token's default
    # budget of two draws at the second one's epsilon)
    flag = served.create("--privacy", "protected,label_epsilon=0.7")
    env = served.create(env={"FEDLITE_B_PRIVACY": "protected"})

    by_flag, by_env = _created(flag), _created(env)
    assert by_flag["privacy"] == "protected,label_epsilon=0.7"
    assert "privacy: protected,label_epsilon=0.7 (--privacy)" in flag.stderr
    assert served.run_policy(by_flag["run"])["label_epsilon"] == 0.7
    assert by_env["privacy"] == "protected" and "(FEDLITE_B_PRIVACY)" in env.stderr
    assert served.run_policy(by_env["run"]) == PRESETS["protected"].to_stored()


def test_with_no_serve_recorded_the_run_gets_the_default_and_says_why(tmp_path: Path) -> None:
    database = _database(tmp_path)
    issued = run_cli("b", "token", "issue", "--name", "tester", "--data-dir",
                     str(database.data_dir))  # fmt: skip
    assert issued.returncode == 0, issued.stderr

    ran = database.create()

    created = _created(ran)
    assert created["privacy"] == "protected"
    assert "no fedlite-b serve has recorded a policy in this database" in ran.stderr
    assert database.run_policy(created["run"]) == PRESETS["protected"].to_stored()
