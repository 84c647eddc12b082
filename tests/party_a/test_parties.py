"""Party A as one feature party of a run with several (docs/PROTOCOL.md section 12): three
trainers, each with its own columns of the bundled demo, its own token, bottom model and
quantizer, train one run over real HTTP, evaluate and predict together."""

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from fastapi import FastAPI

from party_a.errors import ConfigError
from party_a.trainer import PartyATrainer
from party_b.api import create_app
from party_b.party_tokens import issue_party_token
from party_b.settings import Settings
from party_b.store.audit import AuditFilter, audit_entries
from party_b.store.parties import party_traffic
from shared.demo_data import write_party_b_demo
from tests.utils.live import live_server
from tests.utils.parties import feature_tables, party_config, party_trainer, run_of
from tests.utils.small_runs import TOKEN

COLUMNS = {"left": (0, 7), "middle": (7, 14), "right": (14, 20)}


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Party B on the demo labels, one owner token. Label privacy off (public data): the
    evaluations are on the true labels, and the training rows are scored; under label DP
    they are on each run's randomized labels (tests/party_b/service/test_one_path.py)."""
    labels = write_party_b_demo(tmp_path / "labels.csv")
    return Settings(
        data_dir=tmp_path / "b",
        labels=labels,
        tokens=f"owner:{TOKEN}",
        privacy="off,predict_train_ids=true",
        **overrides,
    )


@pytest.fixture
def party_b(tmp_path: Path) -> Iterator[tuple[FastAPI, str]]:
    app = create_app(_settings(tmp_path))
    with live_server(app) as url:
        yield app, url


def _create(app: FastAPI, url: str, spec: dict[str, Any]) -> tuple[str, dict[str, str]]:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as owner:
        created = owner.post("/v1/runs", json=spec)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    with app.state.sessions() as session:
        tokens = {p["name"]: issue_party_token(session, run_id, p["name"]) for p in spec["parties"]}
    return run_id, tokens


def _in_threads(calls: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            results[name] = calls[name]()
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    if errors:
        raise errors[0]
    return results


def test_three_feature_parties_train_evaluate_and_predict_one_run(
    party_b: tuple[FastAPI, str], tmp_path: Path
) -> None:
    app, url = party_b
    tables = feature_tables(tmp_path / "a", COLUMNS)
    configs = {
        name: party_config(
            "three", name, stop - start, **({"run.pipeline_depth": 2} if name == "right" else {})
        )
        for name, (start, stop) in COLUMNS.items()
    }
    run_id, tokens = _create(app, url, run_of(configs))
    trainers = {
        name: party_trainer(
            tmp_path / f"state-{name}", url, tokens[name], tables[name], configs[name]
        )
        for name in COLUMNS
    }

    def session(trainer: PartyATrainer) -> dict[str, Any]:
        remote = trainer.prepare()
        summary = trainer.train()
        evaluation = trainer.evaluate()
        prediction = trainer.predict(["s0020", "s0021", "s0300"])
        return {"remote": remote, "summary": summary, "eval": evaluation, "pred": prediction}

    try:
        out = _in_threads({name: (lambda t=t: session(t)) for name, t in trainers.items()})
    finally:
        for trainer in trainers.values():
            trainer.close()

    # aligned on the ids every party holds: 569 less the 18 that one party or another lacks
    assert {o["remote"].alignment.aligned for o in out.values()} == {569 - 18}
    assert {o["summary"].last_step for o in out.values()} == {24}
    evaluations = [o["eval"] for o in out.values()]
    assert all(
        (e.n, e.loss, e.metrics) == (evaluations[0].n, evaluations[0].loss, evaluations[0].metrics)
        for e in evaluations
    )
    assert evaluations[0].metrics["auc"] > 0.9
    scores = [o["pred"].scores for o in out.values()]
    assert all(np.array_equal(s, scores[0]) for s in scores) and scores[0].shape == (3, 2)
    # each party's own traffic: its uplink is its own chunk, its downlink its own slice
    sent = {name: o["summary"].bytes_sent for name, o in out.items()}
    assert all(b > 0 for b in sent.values())
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as owner:
        run = owner.get(f"/v1/runs/{run_id}").json()
        log = owner.get(f"/v1/runs/{run_id}/steps").json()["steps"]
    assert run["status"] == "finished" and run["step"] == 24
    assert [row["step"] for row in log] == list(range(1, 25))
    with app.state.sessions() as db:
        traffic = party_traffic(db, run_id)
    assert set(traffic) == set(COLUMNS) and {t[0] for t in traffic.values()} == {24}


def test_a_party_that_evaluates_before_it_finishes_ends_the_run_beside_fedlite_a(
    party_b: tuple[FastAPI, str], tmp_path: Path
) -> None:
    """fedlite-a's last calls are its last steps, finish (which waits for every party), then
    the held-out evaluation; a party written from the documents evaluates first, then
    finishes. Neither waits for the other (PROTOCOL.md 12.7): the one that evaluates while
    the others finish is told to finish first, and every party ends with one evaluation."""
    from tests.independent_client.parties import IndependentParty, PartySettings

    app, url = party_b
    columns = {"left": (0, 7), "middle": (7, 14)}
    tables = feature_tables(tmp_path / "a", {**columns, "right": (14, 20)})
    configs = {name: party_config("orders", name, b - a) for name, (a, b) in columns.items()}
    spec = run_of(configs)
    spec["parties"].append(
        {"name": "right", "cut_dim": 8, "quantizer": {"mode": "pq", "q": 4, "L": 4}}
    )
    run_id, tokens = _create(app, url, spec)
    trainers = {
        name: party_trainer(tmp_path / f"state-{name}", url, tokens[name], tables[name], c)
        for name, c in configs.items()
    }
    right = pd.read_csv(tables["right"])
    values = right.drop(columns="id").to_numpy(dtype=np.float32)
    standardized = (values - values.mean(axis=0)) / values.std(axis=0)
    settings = PartySettings(party="right", steps=24, seed=0, cut_dim=8, q=4, L=4)

    def fedlite_a(trainer: PartyATrainer) -> tuple[int, float, dict[str, float]]:
        trainer.prepare()
        trainer.train()  # its steps, then finish
        answer = trainer.evaluate()
        return answer.n, answer.loss, answer.metrics

    def evaluates_first() -> tuple[int, float, dict[str, float]]:
        auth = {"Authorization": f"Bearer {tokens['right']}"}
        with httpx.Client(base_url=url, headers=auth, timeout=120) as http:
            me = IndependentParty(http, list(right["id"]), standardized, settings)
            me.join_and_align()
            for t in range(1, settings.steps + 1):
                me.step(t)
            evaluation = me.evaluate()
            me.finish()
            return evaluation

    try:
        calls = {name: (lambda t=t: fedlite_a(t)) for name, t in trainers.items()}
        out = _in_threads({**calls, "right": evaluates_first})
    finally:
        for trainer in trainers.values():
            trainer.close()

    assert len({repr(o) for o in out.values()}) == 1  # one evaluation, the same for all
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as owner:
        run = owner.get(f"/v1/runs/{run_id}").json()
        evaluations = owner.get(f"/v1/runs/{run_id}/evaluations").json()
    assert run["status"] == "finished" and run["step"] == 24
    assert [e["split"] for e in evaluations] == ["eval"]


def test_a_party_whose_config_disagrees_with_the_run_is_told_what_differs(
    party_b: tuple[FastAPI, str], tmp_path: Path
) -> None:
    app, url = party_b
    tables = feature_tables(tmp_path / "a", {"left": (0, 10), "right": (10, 20)})
    configs = {name: party_config("disagree", name, 10) for name in ("left", "right")}
    _run_id, tokens = _create(app, url, run_of(configs))
    wrong = party_config("disagree", "left", 10, **{"run.steps": 30, "quantizer.L": 8})
    trainer = party_trainer(tmp_path / "state", url, tokens["left"], tables["left"], wrong)
    try:
        with pytest.raises(ConfigError) as refused:
            trainer.prepare()
        assert "steps: 30 here, 24 in the run" in str(refused.value)
        assert "quantizer" in str(refused.value)
        other = party_trainer(
            tmp_path / "s2", url, tokens["left"], tables["right"], configs["right"]
        )  # right's config with left's token
        try:
            with pytest.raises(ConfigError, match="acts for party 'left'"):
                other.prepare()
        finally:
            other.close()
    finally:
        trainer.close()


def test_check_and_align_take_a_party_token(party_b: tuple[FastAPI, str], tmp_path: Path) -> None:
    """fedlite-a check (the image's health check) and align (PSI alone) with a feature
    party's token: they go through that party's routes (the token says which)."""
    from tests.utils.cli import run_cli

    app, url = party_b
    tables = feature_tables(tmp_path / "a", {"left": (0, 10), "right": (10, 20)})
    configs = {name: party_config("cli", name, 10) for name in ("left", "right")}
    run_id, tokens = _create(app, url, run_of(configs))
    env = {"FEDLITE_A_SERVER": url, "FEDLITE_A_TOKEN": tokens["left"]}

    check = run_cli("a", "check", env=env)
    align = run_cli(
        "a", "align", "--features", str(tables["left"]), "--state-dir", str(tmp_path / "s"), env=env
    )
    wrong = run_cli("a", "check", env={**env, "FEDLITE_A_TOKEN": "not-a-token-0123456789"})

    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout) | {"party_b_ids": 0} == {
        "server": url,
        "ok": True,
        "party_b_ids": 0,
        "run": run_id,
        "party": "left",
    }
    assert align.returncode == 0, align.stderr
    assert json.loads(align.stdout)["intersection"] == 569 - 6  # left lacks 6 of the ids
    assert wrong.returncode == 2 and "unknown or revoked token" in wrong.stderr  # cannot heal
    assert "party token" not in wrong.stderr  # party B's first answer, as for any token


def test_parties_of_different_widths_cut_a_long_raw_predict_at_the_same_ids(
    tmp_path: Path,
) -> None:
    """A predict list too long for one body of the wide party's raw activations (64 floats
    an id) but not of the narrow one's (8): every party cuts the list by one rule from the
    run's parties and party B's body limit, so their parts name the same ids and meet."""
    # the alignment (563 ids) fits in one body
    app = create_app(_settings(tmp_path, limits={"max_body_bytes": 64 * 1024}))
    columns = {"narrow": (0, 10), "wide": (10, 20)}
    tables = feature_tables(tmp_path / "a", columns)
    configs = {
        "narrow": party_config("widths", "narrow", 10, **{"run.steps": 4}),
        "wide": party_config(
            "widths",
            "wide",
            10,
            **{"run.steps": 4, "model.bottom": {"hidden": [16], "cut_dim": 64, "in_features": 10}},
        ),
    }
    common = sorted(
        set(pd.read_csv(tables["narrow"])["id"]) & set(pd.read_csv(tables["wide"])["id"])
    )
    ids = common[:300]  # wide: 300 x (256 bytes of floats + 66 of id) = 97 kB; narrow: 29 kB
    with live_server(app) as url:
        run_id, tokens = _create(app, url, run_of(configs))
        trainers = {
            name: party_trainer(tmp_path / f"state-{name}", url, tokens[name], tables[name], c)
            for name, c in configs.items()
        }

        def session(trainer: PartyATrainer) -> Any:
            trainer.prepare()
            trainer.train()
            return trainer.predict(ids, raw=True)

        try:
            out = _in_threads({name: (lambda t=t: session(t)) for name, t in trainers.items()})
        finally:
            for trainer in trainers.values():
                trainer.close()

    assert out["narrow"].ids == out["wide"].ids == ids
    assert np.array_equal(out["narrow"].scores, out["wide"].scores)
    assert out["wide"].scores.shape == (300, 2)
    with app.state.sessions() as db:
        rows = audit_entries(db, AuditFilter(run_id=run_id, action="predict"))
    cut: dict[str, list[int | None]] = {}
    for row in rows:
        cut.setdefault(row.actor, []).append(row.ids)
    # wide (d = 64, a codebook of 64 floats a chunk of 32 rows) bounds both:
    # (65,536 - 1,024 - 256) x 32 // ((98 + 256) x 32 + 256) = 177 ids a request
    assert sorted(cut.values()) == [[177, 123], [177, 123]], cut
