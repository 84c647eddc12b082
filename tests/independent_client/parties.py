"""One feature party of a run with several (docs/PROTOCOL.md section 12), from the documents:
the party's routes under its own token, the retry that section 12.4 asks for (409
parties-incomplete: send the same request again) and the order of the last calls of 12.7
(409 call-out-of-order: finish first). The rest is ``client``'s party A: its bottom model,
quantizer, derived values and messages, unchanged.
"""

import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from tests.independent_client.client import IndependentPartyA, Settings, WireProtocol

__all__ = ["IndependentParty", "PartySettings", "parties_run_create"]

WAIT_FOR = 240.0  # seconds a request is sent again while party B waits for the others


@dataclass
class PartySettings(Settings):
    """A party's own width and quantizer, besides the run's settings."""

    party: str = "a"


def parties_run_create(name: str, parties: list[PartySettings]) -> dict[str, Any]:
    """12.1: a RunCreate naming every party, with its width and quantizer."""
    run = parties[0].run_create(name)
    for member in ("cut_dim", "quantizer"):
        del run[member]
    run["parties"] = [
        {
            "name": p.party,
            "cut_dim": p.cut_dim,
            "quantizer": {"mode": "pq", "q": p.q, "L": p.L} if p.mode == "pq" else {"mode": "raw"},
            "downlink": "float32",
        }
        for p in parties
    ]
    return run


class IndependentParty(IndependentPartyA):
    """``IndependentPartyA`` on one party's routes of a run party B's operator created."""

    def __init__(
        self,
        client: httpx.Client,
        ids: list[str],
        features: np.ndarray,
        settings: PartySettings,
        protocol: WireProtocol | None = None,
    ) -> None:
        super().__init__(client, ids, features, settings, protocol)
        self.party = settings.party

    def join_and_align(self) -> dict[str, Any]:
        """12.3: which run this token acts for, the run, and 12.5's alignment (no PSI: the
        keys of all our ids, as 10.4 allows)."""
        me = self._ok(self.http.get("/v1/party"), 200)
        if me["party"] != self.party:
            raise AssertionError(f"the token acts for {me}, not for {self.party!r}")
        self.run_id = me["run_id"]
        run = self._ok(self.http.get(self._base()), 200)
        return self._align(run["alignment_key"], self._base("/alignment"))

    def _base(self, tail: str = "") -> str:
        return f"/v1/runs/{self.run_id}/parties/{self.party}{tail}"

    def _post(self, path: str, **kwargs: Any) -> httpx.Response:
        """12.4: a 409 parties-incomplete is sent again, the same request, until WAIT_FOR.
        12.7: a 409 call-out-of-order names the call to make first (``finish``, while the
        other parties end the run): it is made, then this request is sent again."""
        deadline = time.monotonic() + WAIT_FOR
        while True:
            answer = self.http.post(path, **kwargs)
            problem = answer.json() if answer.status_code == 409 else {}
            kind = str(problem.get("type", ""))
            if kind.endswith(":call-out-of-order") and problem.get("expected_call") == "finish":
                self.finish()
                continue
            if not kind.endswith(":parties-incomplete") or time.monotonic() > deadline:
                return answer
            time.sleep(0.1)

    def _route(self, name: str) -> str:
        return self._base(f"/{name}")

    def finish(self) -> dict[str, Any]:
        self._ok(self._post(self._route("finish")), 200)
        return self._ok(self.http.get(self._base()), 200)
