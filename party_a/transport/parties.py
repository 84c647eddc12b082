"""Party A as one feature party of a run with several (docs/PROTOCOL.md section 12).

``PartyTransport`` is the :class:`party_a.transport.Transport` the trainer drives, over the
party's own routes (``/v1/runs/{run}/parties/{party}/...``) with the party's own token. Two
things differ from a run with one feature party, and both live here, so that the trainer,
the step loop, recovery and inference are the same code:

* the run is not created but **joined**: the party token says which run and party it acts
  for (``GET /v1/party``), and ``create_run`` checks that this party's config agrees with the
  run party B holds (its steps, batches and seed; its own width and quantizer);
* every request may have to wait for the other parties: party B answers 409
  ``parties-incomplete`` after its bounded wait, and the same request is sent again (the
  same bytes), for as long as ``retry_for`` allows; an evaluation or prediction while the
  other parties finish the run is answered 409 ``call-out-of-order`` (PROTOCOL.md 12.7):
  this party finishes too, and sends it again.
"""

import logging
import random
import time
from collections.abc import Callable
from typing import Any

import httpx

from api_schemas import AlignmentIn, AlignmentOut, PsiInfo, ResumeIn, RunCreate, RunOut
from party_a.errors import CallOutOfOrder, ConfigError, PartiesIncomplete, TransportError
from party_a.transport.http import HttpTransport

__all__ = ["PartyTransport", "check_agrees"]

log = logging.getLogger("fedlite.party_a")

# RunCreate's members every party must agree on (they fix every batch and digest)
_SHARED = (
    "model",
    "steps",
    "batch_size",
    "schedule",
    "seed",
    "checkpoint_interval",
    "eval_fraction",
)


class PartyTransport(HttpTransport):
    """The routes of one feature party; ``party`` its name in the run."""

    def __init__(self, base_url: str, token: str, *, party: str, **kwargs: Any) -> None:
        super().__init__(base_url, token, **kwargs)
        self.party = party
        self._run_id: str | None = None

    @property
    def run_id(self) -> str:
        """The run this party token acts for, asked once."""
        if self._run_id is None:
            me = self.whoami()
            if me.party != self.party:
                raise ConfigError(
                    f"this token acts for party {me.party!r} of run {me.run_id}, not for "
                    f"{self.party!r}: pass --party {me.party}, or party {self.party!r}'s token"
                )
            self._run_id = me.run_id
        return self._run_id

    def _path(self, run_id: str, tail: str = "") -> str:
        return f"/v1/runs/{run_id}/parties/{self.party}{tail}"

    # ------------------------------------------------------------------ the run, joined

    def create_run(self, spec: RunCreate, idempotency_key: str | None = None) -> RunOut:
        """The run party B's operator created for this party, after checking that ``spec``
        (this party's config, as it would create a run of its own) agrees with it."""
        del idempotency_key  # nothing is created
        remote = self.get_run(self.run_id)
        check_agrees(spec, remote.config, self.party)
        return remote

    def get_run(self, run_id: str) -> RunOut:
        return self._json("GET", self._path(run_id), RunOut)

    def align(self, run_id: str, hashed_ids: list[str]) -> AlignmentOut:
        body = AlignmentIn(hashed_ids=hashed_ids)
        return self._json("POST", self._path(run_id, "/alignment"), AlignmentOut, body=body)

    def resume(self, run_id: str, from_step: int) -> RunOut:
        body = ResumeIn(from_step=from_step)
        return self._json("POST", self._path(run_id, "/resume"), RunOut, body=body)

    def finish(self, run_id: str) -> RunOut:
        return self._json("POST", self._path(run_id, "/finish"), RunOut)

    def delete_run(self, run_id: str) -> None:
        raise ConfigError("a feature party cannot delete the run: ask party B's operator")

    def step_log(self, run_id: str) -> list[dict[str, Any]]:
        raise ConfigError("a run's step log is its owner's: ask party B's operator")

    # ------------------------------------------------------------------ msgpack

    def psi_info(self) -> PsiInfo:
        return self._json("GET", self._path(self.run_id, "/psi"), PsiInfo)

    def psi(self, body: bytes) -> bytes:
        return self._msgpack(self._path(self.run_id, "/psi"), body)

    def step(self, run_id: str, body: bytes) -> bytes:
        return self._msgpack(self._path(run_id, "/steps"), body)

    def evaluate(self, run_id: str, body: bytes, split: str = "eval") -> bytes:
        path = self._path(run_id, "/evaluate")
        return self._finished_first(
            run_id, lambda: self._msgpack(path, body, params={"split": split})
        )

    def predict(self, run_id: str, body: bytes) -> bytes:
        return self._finished_first(
            run_id, lambda: self._msgpack(self._path(run_id, "/predict"), body)
        )

    def _finished_first(self, run_id: str, call: Callable[[], bytes]) -> bytes:
        """``call()``; if the other parties are finishing the run, finish first, then again."""
        try:
            return call()
        except CallOutOfOrder as exc:
            if exc.expected_call != "finish":
                raise
            log.info("the other parties are finishing the run: finishing first (%s)", exc.detail)
            self.finish(run_id)
            return call()

    # ------------------------------------------------------------------ waiting

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """``HttpTransport._send``, sent again while party B waits for other parties."""
        deadline = time.monotonic() + self._retry_for
        while True:
            try:
                return super()._send(method, path, **kwargs)
            except PartiesIncomplete as exc:
                if time.monotonic() > deadline:
                    raise TransportError(
                        f"{method} {path}: the other parties did not come within "
                        f"{self._retry_for:.0f} s ({exc.detail})"
                    ) from None
                log.info("waiting for parties %s (%s)", exc.missing_parties, exc.waiting_for)
                self._sleep(0.05 + 0.2 * random.random())  # party B itself waited already


def check_agrees(mine: RunCreate, run: RunCreate, party: str) -> None:
    """ConfigError naming every member of this party's config that differs from the run's."""
    if run.parties is None:
        raise ConfigError("this run has one feature party; train it without --party")
    entry = next((p for p in run.parties if p.name == party), None)
    if entry is None:
        names = [p.name for p in run.parties]
        raise ConfigError(f"the run has no party {party!r}; its parties: {names}")
    assert mine.quantizer is not None and mine.cut_dim is not None
    differ = [
        f"{name}: {getattr(mine, name)!r} here, {getattr(run, name)!r} in the run"
        for name in _SHARED
        if getattr(mine, name) != getattr(run, name)
    ]
    if mine.cut_dim != entry.cut_dim:
        differ.append(f"cut_dim: {mine.cut_dim} here, {entry.cut_dim} for {party!r} in the run")
    if mine.quantizer != entry.quantizer:
        differ.append(
            f"quantizer: {mine.quantizer.model_dump()} here, {entry.quantizer.model_dump()} "
            f"for {party!r} in the run"
        )
    if differ:
        raise ConfigError(
            f"this config does not agree with party {party!r} of the run at party B: "
            + "; ".join(differ)
        )
