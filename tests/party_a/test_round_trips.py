"""How many requests party A makes: one GET of a known run before step 1, none for a new run
beyond its creation; one request for a predict that party A's state can serve.

Real parts: party B's service on a SQLite file (in process), party A's trainer and store,
real torch; every call party A makes through its Transport is recorded.
"""

from pathlib import Path
from typing import Any

from api_schemas import PsiInfo
from party_a.config import load_config
from party_a.errors import problem_from_body
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.privacy import parse_policy
from party_b.service import Service
from party_b.service.runstate import Caller
from tests.party_a.test_loop import CONFIG, _data


class _Counting(InProcessTransport):
    """Party B in process; ``calls`` lists the name of every call party A made, in order."""

    def __init__(self, service: Service, caller: Caller) -> None:
        super().__init__(service, caller, problem=problem_from_body)
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if name in {"psi_info", "psi", "create_run", "get_run", "align", "align_keys", "step"} | {
            "resume",
            "evaluate",
            "predict",
            "finish",
        }:
            super().__getattribute__("calls").append(name)
        return attribute


def _trainer(tmp_path: Path, service: Service, caller: Caller, **config: Any) -> PartyATrainer:
    features, _ = _data()
    return PartyATrainer(
        config=load_config(None, {**CONFIG, "run.name": "counted", **config}),
        features=features,
        transport=_Counting(service, caller),
        store=LocalStore.in_directory(tmp_path / "a"),
        server="in-process",
    )


def _calls(trainer: PartyATrainer) -> list[str]:
    transport = trainer.transport
    assert isinstance(transport, _Counting)  # _OlderPartyB too
    return transport.calls


def test_requests_before_the_first_step_and_for_a_served_prediction(tmp_path: Path) -> None:
    _, labels = _data()
    # predictions on training rows: the policy that answers them (the subject is the count)
    privacy = parse_policy("off,predict_train_ids=true")
    service, caller = in_process_party_b(labels, tmp_path / "b.sqlite", privacy=privacy)

    new = _trainer(tmp_path, service, caller, **{"run.steps": 6})
    new.prepare()
    new.train()
    calls = _calls(new)
    first_step = calls.index("step")
    # a new run: its creation, the PSI, the alignment (binary), then steps; no GET of the run
    assert calls[:first_step] == ["create_run", "psi_info", "psi", "align_keys"]
    new.close()

    # the same run again, from its state (as a second `fedlite-a train` would): one GET
    again = _trainer(tmp_path, service, caller, **{"run.steps": 6})
    again.prepare()
    again.train()
    assert _calls(again) == ["get_run"]  # nothing left to train: no step, no second GET
    again.close()

    # predict from party A's state: the codebook and the intersection are stored
    serving = _trainer(tmp_path, service, caller, **{"run.steps": 6})
    serving.prepare_serving()
    scores = serving.predict(["id000", "id001"]).scores
    assert scores.shape == (2, 2)
    assert _calls(serving) == ["predict"]
    serving.close()


class _OlderPartyB(_Counting):
    """A party B from before the binary alignment: GET /v1/psi without alignment_formats."""

    def psi_info(self) -> PsiInfo:
        info = super().psi_info()
        return PsiInfo.model_validate(info.model_dump(exclude={"alignment_formats"}))


def test_a_party_b_without_the_binary_alignment_gets_the_json_one(tmp_path: Path) -> None:
    _, labels = _data()
    # predictions on training rows: the policy that answers them (the subject is the count)
    privacy = parse_policy("off,predict_train_ids=true")
    service, caller = in_process_party_b(labels, tmp_path / "b.sqlite", privacy=privacy)
    features, _ = _data()
    trainer = PartyATrainer(
        config=load_config(None, {**CONFIG, "run.name": "older", "run.steps": 2}),
        features=features,
        transport=_OlderPartyB(service, caller),
        store=LocalStore.in_directory(tmp_path / "a"),
        server="in-process",
    )
    remote = trainer.prepare()
    trainer.train()

    assert _calls(trainer)[:4] == ["create_run", "psi_info", "psi", "align"]
    assert trainer.data is not None and remote.alignment is not None
    assert remote.alignment.aligned == len(trainer.data.aligned)
    trainer.close()
