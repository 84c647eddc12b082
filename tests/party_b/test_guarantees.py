"""Every guarantee party B gives a run holds whatever the number of its feature parties:
each test runs for N = 1 (a run created by a token, on its own routes), 2 and 3 (a run with
``parties``, each on its party's routes with its own token), over real HTTP.

Label privacy (evaluations on the run's randomized labels), the training-id rule of predict,
an audit row per action and party, identity (expiry, certificate subject, the door a token
may use), exactly-once replays (a message resent in another key order), the drain's
checkpoint, and the lease fence between replicas: one code path at party B, so one test
each, parametrized by N.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import httpx
import msgpack
import numpy as np
import pytest
import torch
from fastapi import FastAPI

from party_b import auth
from party_b.api import create_app
from party_b.drain import checkpoint_live_runs
from party_b.party_tokens import issue_party_token
from party_b.privacy.label_dp import run_targets
from party_b.service.fusion import fuse
from party_b.settings import Settings
from party_b.store.audit import AuditFilter, audit_entries
from party_b.store.grants import set_grant
from shared import codec
from tests.utils.live import live_server
from tests.utils.parties import Party, run_of_n, together
from tests.utils.small_runs import TOKEN, labels_csv, problem

PARTY_COUNTS = [1, 2, 3]
PROTECTED = "protected"  # party B's default: label DP at epsilon 0.4
OFF = "off"  # no label DP: predict refuses the training split's ids


@contextmanager
def _party_b(
    tmp_path: Path, privacy: str = PROTECTED, replica_id: str | None = None
) -> Iterator[tuple[FastAPI, str]]:
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"owner:{TOKEN}",
        privacy=privacy,
        replica_id=replica_id,
    )
    app = create_app(settings)
    with live_server(app) as url:
        yield app, url


def _run(app: FastAPI, url: str, n: int, applied: int = 0, **spec: object) -> list[Party]:
    """A run of ``n`` parties, aligned, with its first ``applied`` steps applied."""
    parties = run_of_n(url, TOKEN, app.state.sessions, n, **spec)
    assert {a.status_code for a in together(*(p.align for p in parties))} == {200}
    for t in range(1, applied + 1):
        answers = together(*(partial(p.step, t) for p in parties))
        assert {a.status_code for a in answers} == {200}, answers[0].text
    return parties


def _each(parties: list[Party], tail: str, body: Callable[[Party], bytes]) -> list[httpx.Response]:
    """Every party's msgpack request at once (its meeting needs them all)."""
    headers = {"Content-Type": "application/msgpack"}
    return together(*(partial(p.post, tail, content=body(p), headers=headers) for p in parties))


@pytest.mark.parametrize("n", PARTY_COUNTS)
def test_evaluations_under_label_dp_are_on_the_runs_randomized_labels(
    tmp_path: Path, n: int
) -> None:
    with _party_b(tmp_path) as (app, url):
        parties = _run(app, url, n, applied=2)

        answers = _each(parties, "/evaluate?split=train", lambda p: p.evaluate_body(split="train"))

        assert {a.status_code for a in answers} == {200}, answers[0].text
        assert len({a.content for a in answers}) == 1  # one evaluation, every party's answer
        reply = codec.decode_evaluate_response(answers[0].content)
        state = app.state.service.context.cache.peek(parties[0].run_id)
        labels = app.state.service.context.labels
        rows = state.label_rows[state.train_pos]
        true = labels.targets(rows)
        randomized = run_targets(state.privacy, true, rows, labels.num_outputs, labels)
        assert not torch.equal(randomized, true)  # 18 rows at epsilon 0.4: some flipped
        fused = fuse([torch.from_numpy(p.evaluate_activations("train")) for p in parties], "concat")
        side = labels.side(rows) if state.trainer.model.side_features else None
        on_randomized = state.trainer.evaluate(fused, randomized, side)
        on_true = state.trainer.evaluate(fused, true, side)
        assert (reply.n, reply.loss) == (on_randomized.n, on_randomized.loss)
        assert reply.loss != on_true.loss


@pytest.mark.parametrize("n", PARTY_COUNTS)
def test_without_label_dp_no_party_gets_scores_of_training_ids(tmp_path: Path, n: int) -> None:
    with _party_b(tmp_path, privacy=OFF) as (app, url):
        parties = _run(app, url, n, applied=1)
        train, eval_pos = parties[0].split

        mixed, held_out = [int(train[0]), int(eval_pos[0])], [int(e) for e in eval_pos[:3]]
        refused = _each(parties, "/predict", lambda p: p.predict_body(positions=mixed))
        scored = _each(parties, "/predict", lambda p: p.predict_body(positions=held_out))

        for answer in refused:
            assert problem(answer, 403, "privacy-refused")["training_ids"] == 1
        assert {a.status_code for a in scored} == {200}
        assert codec.decode_predict_response(scored[0].content).scores.shape == (3, 2)


@pytest.mark.parametrize("n", PARTY_COUNTS)
def test_every_action_leaves_an_audit_row_per_party(tmp_path: Path, n: int) -> None:
    with _party_b(tmp_path) as (app, url):
        parties = _run(app, url, n, applied=2, steps=2)  # a run of 2 steps, both applied
        _, eval_pos = parties[0].split
        predicted = [int(e) for e in eval_pos[:3]]
        evaluated = _each(parties, "/evaluate", lambda p: p.evaluate_body())
        scored = _each(parties, "/predict", lambda p: p.predict_body(positions=predicted))
        finished = together(*(partial(p.post, "/finish") for p in parties))
        assert {a.status_code for a in [*evaluated, *scored, *finished]} == {200}

        with app.state.sessions() as session:
            rows = audit_entries(session, AuditFilter(run_id=parties[0].run_id))
        actors = ["owner"] if n == 1 else [f"{p.name}@{p.run_id}" for p in parties]
        done = {(r.actor, r.action): r.ids for r in rows if r.outcome == "ok"}
        aligned, evaluation_rows = len(parties[0].aligned), len(eval_pos)
        for actor in actors:
            assert done[(actor, "align")] == aligned
            assert done[(actor, "evaluate")] == evaluation_rows
            assert done[(actor, "predict")] == len(predicted)
            assert (actor, "finish") in done


def _expired(app: FastAPI, party: Party) -> str:
    """A token for ``party``'s door whose grant expired a second ago."""
    past = datetime.now(UTC) - timedelta(seconds=1)
    with app.state.sessions() as session:
        if not party.own:
            return issue_party_token(session, party.run_id, party.name, expires_at=past)
        token = auth.issue_token(session, "expired")
        row = auth.authenticate(session, token)
        assert row is not None
        set_grant(session, row.id, scopes="train", expires_at=past, subject=None,
                  certificate_only=False, runs_of=None)  # fmt: skip
        session.commit()
        return token


def _bound(app: FastAPI, party: Party) -> str:
    """A token for ``party``'s door bound to a client certificate (mutual TLS)."""
    subject = "CN=bank-a,O=Bank A"
    with app.state.sessions() as session:
        if not party.own:
            return issue_party_token(session, party.run_id, party.name, subject=subject)
        token = auth.issue_token(session, "bound")
        row = auth.authenticate(session, token)
        assert row is not None
        set_grant(session, row.id, scopes="train", expires_at=None, subject=subject,
                  certificate_only=False, runs_of=None)  # fmt: skip
        session.commit()
        return token


@pytest.mark.parametrize("n", PARTY_COUNTS)
def test_every_party_is_identified_by_the_same_rules(tmp_path: Path, n: int) -> None:
    """Expiry and the certificate a token is bound to are checked for a party token as for
    any token; a token at another door is refused (a party token on the run's own routes is
    unknown there; an API token on a party's routes too), and a refusal of a known caller's
    scope leaves an audit row."""
    with _party_b(tmp_path) as (app, url):
        parties = _run(app, url, n)
        party = parties[-1]
        body = party.step_body(1)

        def step_with(token: str, path: str | None = None) -> httpx.Response:
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/msgpack"}
            with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
                return client.post(path or party.path("/steps"), content=body)

        expired = step_with(_expired(app, party))
        bound = step_with(_bound(app, party))
        other_door = (
            f"/v1/runs/{party.run_id}/parties/{party.name}/steps"
            if party.own
            else f"/v1/runs/{party.run_id}/steps"
        )
        elsewhere = step_with(party.token, other_door)

        assert problem(expired, 401, "unauthorized")["reason"] == "expired"
        assert problem(bound, 401, "unauthorized")["reason"] == "certificate"
        assert problem(elsewhere, 401, "unauthorized")["reason"] == "token"
        with app.state.sessions() as session:
            read_only = auth.issue_token(session, "reader")
            row = auth.authenticate(session, read_only)
            assert row is not None
            set_grant(session, row.id, scopes="read", expires_at=None, subject=None,
                      certificate_only=False, runs_of=None)  # fmt: skip
            session.commit()
        refused = step_with(read_only, f"/v1/runs/{party.run_id}/steps")
        problem(refused, 403, "forbidden")
        with app.state.sessions() as session:
            rows = audit_entries(session, AuditFilter(actor="reader"))
        assert [(r.action, r.outcome) for r in rows] == [("step", "refused")]


@pytest.mark.parametrize("n", PARTY_COUNTS)
def test_a_step_resent_with_its_keys_in_another_order_gets_its_stored_answer(
    tmp_path: Path, n: int
) -> None:
    with _party_b(tmp_path) as (app, url):
        parties = _run(app, url, n)
        bodies = [p.step_body(1) for p in parties]
        first = together(*(partial(p.step, 1, b) for p, b in zip(parties, bodies, strict=True)))

        reordered = [msgpack.packb(dict(reversed(msgpack.unpackb(b).items()))) for b in bodies]
        again = together(*(partial(p.step, 1, b) for p, b in zip(parties, reordered, strict=True)))
        other = parties[0].step(
            1, parties[0].step_body(1, x=np.ones((8, parties[0].d), np.float32))
        )

        assert {a.status_code for a in first} == {200}
        assert [a.content for a in again] == [a.content for a in first]
        problem(other, 409, "step-replay-mismatch")  # another message is not a replay
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as owner:
            log = owner.get(f"/v1/runs/{parties[0].run_id}/steps").json()["steps"]
        assert [row["step"] for row in log] == [1]


@pytest.mark.parametrize("n", PARTY_COUNTS)
def test_the_drains_checkpoint_answers_every_partys_resent_step(tmp_path: Path, n: int) -> None:
    """A graceful stop checkpoints every run in memory at its applied step (between two
    interval checkpoints here) with every party's answer: after a reload from it each
    party's resent last step gets its stored answer, byte for byte, and nothing is
    applied twice."""
    with _party_b(tmp_path) as (app, url):
        parties = _run(app, url, n, applied=2)  # checkpoints every 2 steps
        third = together(*(partial(p.step, 3) for p in parties))
        assert {a.status_code for a in third} == {200}

        written = checkpoint_live_runs(app.state.service)
        app.state.service.context.cache.drop(parties[0].run_id)  # as a restarted process
        again = together(*(partial(p.step, 3) for p in parties))
        fourth = together(*(partial(p.step, 4) for p in parties))

        assert written == [(parties[0].run_id, 3)]
        assert [a.content for a in again] == [a.content for a in third]
        assert {a.status_code for a in fourth} == {200}
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as owner:
            log = owner.get(f"/v1/runs/{parties[0].run_id}/steps").json()["steps"]
        assert [row["step"] for row in log] == [1, 2, 3, 4]


@pytest.mark.parametrize("n", PARTY_COUNTS)
def test_a_step_at_a_replica_whose_copy_was_taken_over_is_applied_once(
    tmp_path: Path, n: int
) -> None:
    """Two replicas on one database: the run moves to replica two and back. Replica one's
    old copy commits nothing (its lease is fenced); the step goes once more on a fresh load
    there, applied once, with the answers replica two gave."""
    with (
        _party_b(tmp_path, replica_id="one") as (app, one),
        _party_b(tmp_path, replica_id="two") as (_app, two),
    ):
        parties = _run(app, one, n, applied=2)
        moved = [Party(**{**p.__dict__, "url": two}) for p in parties]
        at_two = together(*(partial(p.step, 3) for p in moved))
        back = together(*(partial(p.step, 3) for p in parties))

        assert {a.status_code for a in at_two} == {200}, at_two[0].text
        assert [a.content for a in back] == [a.content for a in at_two]
        with httpx.Client(base_url=one, headers={"Authorization": f"Bearer {TOKEN}"}) as owner:
            log = owner.get(f"/v1/runs/{parties[0].run_id}/steps").json()["steps"]
        assert [row["step"] for row in log] == [1, 2, 3]
