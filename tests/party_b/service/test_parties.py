"""Runs with several feature parties at party B (docs/PROTOCOL.md section 12), over real HTTP:
three parties align on their common ids, train steps that party B applies once when all
three parts are in, and get back their own slices; a missing party is named; tokens are
scoped; a rollback by one party reaches the others' waiting requests."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

import httpx
import numpy as np
from fastapi import FastAPI

from party_b.api import create_app
from party_b.settings import Settings
from shared import codec
from shared.alignment import hmac_ids
from shared.psi import PsiClient, PsiRequest, encode_psi_request
from tests.utils.live import live_server
from tests.utils.parties import COMMON, HOLDINGS, Party, party_run, together
from tests.utils.small_runs import MSGPACK, OTHER, TOKEN, labels_csv, problem, run_spec

WIDTHS = {"bank": 4, "telco": 4, "shop": 8}


@contextmanager
def _party_b(
    tmp_path: Path,
    wait: float = 20.0,
    replica_id: str | None = None,
    # runs compared to the bit: no per-run randomized labels; the training ids scored
    privacy: str = "off,predict_train_ids=true",
) -> Iterator[tuple[FastAPI, str]]:
    settings = Settings(
        data_dir=tmp_path / "b",
        labels=labels_csv(tmp_path / "labels.csv"),
        tokens=f"owner:{TOKEN},other:{OTHER}",
        party_wait_seconds=wait,
        privacy=privacy,
        replica_id=replica_id,
    )
    app = create_app(settings)
    with live_server(app) as url:
        yield app, url


def _owner(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)


def _aligned(
    app: FastAPI, url: str, widths: dict[str, int] = WIDTHS, **spec: object
) -> list[Party]:
    parties = party_run(url, TOKEN, app.state.sessions, widths, **spec)
    answers = together(*(p.align for p in parties))
    assert [a.status_code for a in answers] == [200] * len(parties), answers[0].text
    return parties


def test_three_parties_align_on_their_common_ids_and_each_learns_only_those(tmp_path: Path) -> None:
    with _party_b(tmp_path) as (app, url):
        parties = party_run(url, TOKEN, app.state.sessions, WIDTHS)
        answers = together(*(p.align for p in parties))

        bodies = [a.json() for a in answers]
        key = parties[0].alignment_key
        common = {k.hex() for k in hmac_ids(key, COMMON)}
        assert all(b == bodies[0] for b in bodies)
        assert set(bodies[0]["intersection"]) == common
        assert (bodies[0]["train"], bodies[0]["eval"]) == (18, 6)
        for party in parties:  # each gets back only keys it offered itself
            offered = {k.hex() for k in hmac_ids(key, HOLDINGS[party.name])}
            assert set(party.aligned and [k.hex() for k in party.aligned]) <= offered
        # a party that posts again (its answer lost) gets the same answer
        again = parties[1].align()
        assert again.status_code == 200 and again.json() == bodies[0]


def test_each_party_gets_its_slice_of_one_step_applied_once_as_one_party_would(
    tmp_path: Path,
) -> None:
    """Concat fusion with raw float32 both ways is exact: three parties' steps train the top
    model bit for bit as one party sending the concatenated activations, and each party's
    gradient is its columns of that one party's gradient."""
    with _party_b(tmp_path) as (app, url), _owner(url) as owner:
        parties = _aligned(app, url)
        created = owner.post(
            "/v1/runs", json=run_spec(cut_dim=16, quantizer={"mode": "raw"}, downlink="float32")
        ).json()
        key = bytes.fromhex(created["alignment_key"])
        aligned = owner.post(
            f"/v1/runs/{created['id']}/alignment",
            json={"hashed_ids": [k.hex() for k in hmac_ids(key, COMMON)]},
        ).json()["intersection"]
        single = Party(url, created["id"], "one", TOKEN, 16, parties[0].spec, key)
        single.aligned = [bytes.fromhex(h) for h in aligned]

        for t in range(1, 7):
            answers = together(*(partial(p.step, t) for p in parties))
            assert [a.status_code for a in answers] == [200] * 3, answers[0].text
            grads = [codec.decode_step_response(a.content).grad for a in answers]
            assert [g.shape for g in grads] == [(8, 4), (8, 4), (8, 8)]
            joined = np.concatenate([p.activations(t, 8) for p in parties], axis=1)
            body = single.step_body(t, joined)  # (8, 16), the parties' columns in order
            one = owner.post(f"/v1/runs/{single.run_id}/steps", content=body, headers=MSGPACK)
            assert one.status_code == 200, one.text
            expected = codec.decode_step_response(one.content).grad
            assert np.array_equal(np.concatenate(grads, axis=1), expected)

        # the same top model, and each step logged once
        with parties[0].client() as client:
            mine = client.get(parties[0].path()).json()
        theirs = owner.get(f"/v1/runs/{single.run_id}").json()
        assert mine["model_sha256"] == theirs["model_sha256"] and mine["step"] == 6
        log = owner.get(f"/v1/runs/{parties[0].run_id}/steps").json()["steps"]
        assert [row["step"] for row in log] == list(range(1, 7))
        # a resent step is answered from the stored bytes, per party, with no second update
        resent = parties[2].step(6)
        assert resent.status_code == 200
        assert (
            owner.get(f"/v1/runs/{parties[0].run_id}").json()["model_sha256"]
            == mine["model_sha256"]
        )


def test_a_missing_party_is_named_and_nothing_changes(tmp_path: Path) -> None:
    with _party_b(tmp_path, wait=5.0) as (app, url), _owner(url) as owner:
        parties = _aligned(app, url)
        answers = together(partial(parties[0].step, 1), partial(parties[1].step, 1))

        for answer in answers:
            body = problem(answer, 409, "parties-incomplete")
            # shop's part never came (and the other one may have stopped waiting first)
            assert "shop" in body["missing_parties"] and body["applied_step"] == 0
            assert "shop" in body["detail"]
        assert owner.get(f"/v1/runs/{parties[0].run_id}").json()["step"] == 0
        # sent again with the third party: applied
        again = together(*(partial(p.step, 1) for p in parties))
        assert [a.status_code for a in again] == [200] * 3


def test_a_malformed_or_out_of_order_step_is_refused_at_once(tmp_path: Path) -> None:
    with _party_b(tmp_path, wait=30.0) as (app, url):
        parties = _aligned(app, url)
        bank = parties[0]
        cases = {
            "malformed": (bank.step_body(1)[:-3], 400, "malformed-message"),
            "another width": (
                bank.step_body(1, np.zeros((8, 5), np.float32)),
                422,
                "shape-mismatch",
            ),
            "from the future": (bank.step_body(17), 409, "step-out-of-order"),
        }
        for what, (body, status, slug) in cases.items():
            answer = bank.step(1, body)
            problem(answer, status, slug)  # at once, not after the 30 s wait
            assert answer.elapsed.total_seconds() < 25, what


def test_party_tokens_act_for_their_run_and_party_only(tmp_path: Path) -> None:
    with _party_b(tmp_path) as (app, url), _owner(url) as owner:
        parties = _aligned(app, url)
        bank, telco = parties[0], parties[1]
        others = party_run(url, TOKEN, app.state.sessions, {"bank": 4})

        with bank.client() as client:
            assert client.get("/v1/party").json() == {"run_id": bank.run_id, "party": "bank"}
            assert client.get(bank.path()).status_code == 200
            problem(client.get(telco.path()), 404, "not-found")  # another party's path
            problem(client.get(others[0].path()), 404, "not-found")  # another run's
            problem(client.get("/v1/runs"), 401, "unauthorized")  # not an API token
            problem(client.post("/v1/runs", json=run_spec()), 401, "unauthorized")
        problem(owner.get(bank.path()), 401, "unauthorized")  # the owner is no party
        body = bank.step_body(1)
        refused = owner.post(f"/v1/runs/{bank.run_id}/steps", content=body, headers=MSGPACK)
        assert "parties" in problem(refused, 409, "run-state")["detail"]
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {OTHER}"}) as other:
            problem(other.get(f"/v1/runs/{bank.run_id}"), 404, "not-found")


def test_a_rollback_by_one_party_reaches_the_others_waiting_steps(tmp_path: Path) -> None:
    with _party_b(tmp_path, wait=30.0) as (app, url), _owner(url) as owner:
        parties = _aligned(app, url)
        for t in (1, 2, 3):
            applied = together(*(partial(p.step, t) for p in parties))
            assert {a.status_code for a in applied} == {200}

        def resume_soon() -> httpx.Response:
            time.sleep(0.5)  # bank's step 4 waits for the others by then
            return parties[2].post("/resume", json={"from_step": 2})

        waiting = together(partial(parties[0].step, 4), resume_soon)
        body = problem(waiting[0], 409, "step-out-of-order")
        assert body["applied_step"] == 2 and waiting[1].status_code == 200
        assert owner.get(f"/v1/runs/{parties[0].run_id}").json()["step"] == 2


def test_evaluate_predict_and_finish_are_meetings_of_every_party(tmp_path: Path) -> None:
    with _party_b(tmp_path) as (app, url), _owner(url) as owner:
        parties = _aligned(app, url, steps=2)
        for t in (1, 2):
            applied = together(*(partial(p.step, t) for p in parties))
            assert {a.status_code for a in applied} == {200}

        evaluations = together(*(partial(_evaluate, p) for p in parties))
        assert len({a.content for a in evaluations}) == 1
        assert codec.decode_evaluate_response(evaluations[0].content).n == 6
        assert len(owner.get(f"/v1/runs/{parties[0].run_id}/evaluations").json()) == 1

        predictions = together(*(partial(_predict, p) for p in parties))
        scores = codec.decode_predict_response(predictions[0].content).scores
        assert len({a.content for a in predictions}) == 1 and scores.shape == (4, 2)

        finished = together(*(partial(p.post, "/finish") for p in parties))
        assert {a.json()["status"] for a in finished} == {"finished"}


def _evaluate(party: Party) -> httpx.Response:
    return party.post("/evaluate", content=party.evaluate_body(), headers=MSGPACK)


def _predict(party: Party) -> httpx.Response:
    return party.post("/predict", content=party.predict_body(), headers=MSGPACK)


def test_every_party_route_takes_its_own_party_token_only(tmp_path: Path) -> None:
    """Every route under /v1/runs/{run_id}/parties/{party} (enumerated from the app, so a
    new one is covered): API tokens (the run's owner or a stranger) get 401 alike, so the
    answer says nothing of the run; another party's or another run's party token gets 404,
    as a run that does not exist; the party's own token is let through."""
    with _party_b(tmp_path, wait=5.0) as (app, url):
        parties = _aligned(app, url)
        bank, telco = parties[0], parties[1]
        elsewhere = party_run(url, TOKEN, app.state.sessions, {"bank": 4})[0]
        routes = [
            (method.upper(), path)
            for path, operations in app.openapi()["paths"].items()
            if "/parties/{party}" in path
            for method in sorted(operations)
        ]
        assert len(routes) >= 9, routes
        bodies: dict[str, dict[str, object]] = {
            "steps": {"content": bank.step_body(1), "headers": MSGPACK},
            "evaluate": {"content": bank.evaluate_body(), "headers": MSGPACK},
            "predict": {"content": bank.predict_body(), "headers": MSGPACK},
            "alignment": {"json": {"hashed_ids": [k.hex() for k in bank.aligned]}},
            "resume": {"json": {"from_step": 0}},
        }
        psi = encode_psi_request(PsiRequest(request=PsiClient(["u000"]).request()))
        for method, path in routes:
            if path.endswith("/psi"):
                bodies["psi"] = {"content": psi, "headers": MSGPACK} if method == "POST" else {}
            target = path.format(run_id=bank.run_id, party="bank")
            kwargs = bodies.get(path.rsplit("/", 1)[-1], {})
            for token in (TOKEN, OTHER, telco.token, elsewhere.token):
                with httpx.Client(
                    base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
                ) as client:
                    answer = client.request(method, target, **kwargs)
                api_token = token in (TOKEN, OTHER)
                problem(
                    answer, 401 if api_token else 404, "unauthorized" if api_token else "not-found"
                )
            with bank.client() as client:
                answer = client.request(method, target, **kwargs)
            assert answer.status_code not in (401, 404), (method, path, answer.text)


def test_a_fused_step_from_a_copy_another_replica_took_over_is_refused_then_goes_again(
    tmp_path: Path,
) -> None:
    """Two party B replicas on one database (docs/DEPLOY.md, replicas): the run moves from
    replica one to replica two and back. Replica one's old copy commits no fused step: the
    step goes once more on a fresh load (as a step of a run with one party does), which
    applies it once with the answers replica two gave for it."""
    with (
        _party_b(tmp_path, replica_id="one") as (app, one),
        _party_b(tmp_path, replica_id="two") as (_app, two),
    ):
        parties = _aligned(app, one)  # checkpoints every 2 steps
        for t in (1, 2):
            answers = together(*(partial(p.step, t) for p in parties))
            assert [a.status_code for a in answers] == [200] * 3, answers[0].text
        moved = [replace(p, url=two) for p in parties]  # the balancer sends the run to two
        at_two = together(*(partial(p.step, 3) for p in moved))
        assert [a.status_code for a in at_two] == [200] * 3, at_two[0].text

        back = together(*(partial(p.step, 3) for p in parties))  # to one's old copy

        assert [a.status_code for a in back] == [200] * 3, back[0].text
        assert [a.content for a in back] == [a.content for a in at_two]
        with _owner(one) as owner:
            log = owner.get(f"/v1/runs/{parties[0].run_id}/steps").json()["steps"]
        assert [row["step"] for row in log] == [1, 2, 3]  # step 3 once
