"""Bit-identical recovery under the default policy (label DP), with party B SIGKILLed.

Party B is ``fedlite-b serve`` in its own process with no privacy switch; party A trains
over HTTP from this process and records every step reply it receives. Party B is killed
twice mid-run: it restarts from its newest checkpoint, party A rolls back to it and sends
the lost steps again, and party B computes them anew, with the run's randomized labels drawn
again from the run's stored secret. Every step answered more than once must have been
answered with the same bytes.
"""

import math
import threading
import time
from pathlib import Path

from shared import codec
from tests.utils.data import breast_pair
from tests.utils.party_a import breast_config, make_trainer
from tests.utils.servers import ALICE, breast_party_b

STEPS = 120


def test_a_default_policy_run_recomputes_lost_steps_bit_identically_after_sigkills(
    tmp_path: Path,
) -> None:
    _guest, host = breast_pair()
    with breast_party_b(tmp_path / "b") as party_b:
        # Prepare: a party A whose transport keeps every reply, by step
        config = breast_config("dp-kill", **{"run.steps": STEPS, "run.checkpoint_interval": 25})
        trainer = make_trainer(tmp_path / "a", party_b.url, ALICE, host, config)
        answers: dict[int, list[bytes]] = {}
        send = trainer.transport.step

        def recording(run_id: str, body: bytes) -> bytes:
            reply = send(run_id, body)
            answers.setdefault(codec.decode_step_response(reply).step, []).append(reply)
            return reply

        trainer.transport.step = recording  # type: ignore[method-assign]
        trainer.prepare()
        result: dict[str, object] = {}

        def train() -> None:
            try:
                result["summary"] = trainer.train()
            except Exception as exc:  # surfaced by the assertion below
                result["error"] = exc

        # Act: train, killing party B twice between checkpoints
        thread = threading.Thread(target=train)
        thread.start()
        for kill_after in (40, 90):
            while trainer.step < kill_after and thread.is_alive():
                time.sleep(0.005)
            party_b.kill9()
            party_b.start()
        thread.join(timeout=300)
        trainer.close()

        # Assert: the run finished, party B lost and recomputed steps, and every step that
        # was answered twice was answered with the same bytes, under the default policy
        assert "error" not in result, result.get("error")
        assert result["summary"].last_step == STEPS  # type: ignore[attr-defined]
        assert party_b.log().count("resumes from checkpoint") >= 2
        recomputed = sorted(step for step, replies in answers.items() if len(replies) > 1)
        assert len(recomputed) >= 10, recomputed
        assert all(len(set(replies)) == 1 for replies in answers.values())
        assert sorted(answers) == list(range(1, STEPS + 1))
        first = codec.decode_step_response(answers[1][0])
        assert math.isnan(first.loss) and set(first.metrics) == {"n"}
