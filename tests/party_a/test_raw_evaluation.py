"""A FedLite run can be evaluated on unquantized activations; its training steps cannot."""

from pathlib import Path

import numpy as np
import pytest
import torch

from party_a.config import load_config
from party_a.errors import ProblemResponse, problem_from_body
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer
from party_b.inprocess import InProcessTransport, in_process_party_b
from shared import codec
from shared.schedule import batch_digest
from tests.party_b.service.test_run_creation import CONFIG, _data


def test_raw_evaluation_of_a_fedlite_run_and_no_raw_training_steps(tmp_path: Path) -> None:
    features, labels = _data()
    service, caller = in_process_party_b(labels, tmp_path / "b.sqlite")
    trainer = PartyATrainer(
        config=load_config(None, CONFIG),
        features=features,
        transport=InProcessTransport(service, caller, problem=problem_from_body),
        store=LocalStore.in_directory(tmp_path / "a"),
        server="in-process",
    )
    trainer.prepare()
    # a training step of a FedLite run must be quantized as configured: refused, nothing changes
    batch = trainer.batch(1)
    x = features.x[trainer.data.rows[batch.positions]]
    z = trainer.bottom.model(torch.from_numpy(x).float()).detach().numpy()
    body = codec.encode_step_request(
        codec.StepRequest(
            step=1,
            batch_digest=batch_digest([trainer.data.aligned[p] for p in batch.positions]),
            chunks=(codec.RawActivations(z),),
        )
    )
    with pytest.raises(ProblemResponse, match="raw activations sent to a FedLite"):
        InProcessTransport(service, caller, problem=problem_from_body).step(trainer.run_id, body)
    trainer.train()

    quantized = trainer.evaluate()
    raw = trainer.evaluate(raw=True)

    assert quantized.n == raw.n == len(trainer.eval_pos)
    assert set(raw.metrics) == set(quantized.metrics) and np.isfinite(raw.loss)
    assert raw.loss != quantized.loss  # z, not z~, reached the top model
    history = service.runs.eval_results(caller, trainer.run_id)
    assert [r.split for r in history[-2:]] == ["eval", "eval+raw"]
    trainer.close()
