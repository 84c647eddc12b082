"""Party A's HTTP client for party B's API (httpx, keep-alive, retries with backoff).

Retrying is safe for every call: steps are idempotent at party B (a resent step gets the
identical stored answer), alignment is idempotent, a PSI request is simply answered again,
and the rest are reads or state changes that check where the run is. Connection errors,
timeouts and 5xx are retried with exponential backoff and jitter until ``retry_for``
seconds have passed -- long enough for party B to be restarted under a process supervisor.
Anything problem+json becomes a typed
:class:`party_a.errors.ProblemResponse`.

What waiting cannot fix is not retried: a URL without ``http://`` or ``https://``, plain HTTP
sent to party B's TLS port (or TLS to a plain port), and a certificate that fails
verification raise :class:`party_a.errors.ConfigError` at once, each with the fix
(:mod:`party_a.transport.diagnose`).
"""

import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from api_schemas import AlignmentIn, AlignmentOut, PartyOut, PsiInfo, ResumeIn, RunCreate, RunOut
from api_schemas.problems import MSGPACK_CONTENT_TYPE, PROBLEM_CONTENT_TYPE
from party_a.errors import ConfigError, ProtocolError, TransportError, problem_from_body
from party_a.transport.diagnose import TlsProbe, check_base_url, configuration_fault
from party_a.transport.tls import tls_context

__all__ = ["HttpTransport"]

log = logging.getLogger("fedlite.party_a")
M = TypeVar("M", bound=BaseModel)
_RETRY_STATUS = {500, 502, 503, 504}


class HttpTransport:
    """:class:`party_a.transport.Transport` over HTTP(S) to a party B server."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        ca_bundle: Path | None = None,
        client_cert: Path | None = None,
        client_key: Path | None = None,
        timeout: float = 120.0,
        retry_for: float = 300.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._ca_bundle = ca_bundle
        self._client_cert = client_cert
        self._client_key = client_key
        self._client = httpx.Client(
            base_url=check_base_url(base_url),
            # no token: party B knows party A by its client certificate alone (mutual TLS)
            headers={"User-Agent": "fedlite-a/1"}
            | ({"Authorization": f"Bearer {token}"} if token else {}),
            timeout=httpx.Timeout(timeout, connect=min(10.0, timeout)),
            verify=tls_context(ca_bundle, client_cert, client_key),
        )
        self._retry_for = retry_for
        self._sleep = sleep
        # plain HTTP to a TLS port? asked once, and never after party B answered over HTTP
        self.tls_probe = TlsProbe()
        self.retries = 0  # retried attempts so far (reported in the training summary)
        # message bodies of every exchange that got an answer, retries included (bytes)
        self.bytes_sent = 0
        self.bytes_received = 0

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "HttpTransport":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ JSON endpoints

    def psi_info(self) -> PsiInfo:
        return self._json("GET", "/v1/psi", PsiInfo)

    def create_run(self, spec: RunCreate, idempotency_key: str | None = None) -> RunOut:
        """``idempotency_key``: the same key gets the same run (default: a new key for this
        call, so that at least its own retries, after an answer was lost, do not create a
        second run)."""
        key = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        return self._json("POST", "/v1/runs", RunOut, body=spec, headers=key)

    def get_run(self, run_id: str) -> RunOut:
        return self._json("GET", f"/v1/runs/{run_id}", RunOut)

    def whoami(self) -> PartyOut:
        """What a feature party's token acts for (docs/PROTOCOL.md section 12.3)."""
        return self._json("GET", "/v1/party", PartyOut)

    def align(self, run_id: str, hashed_ids: list[str]) -> AlignmentOut:
        body = AlignmentIn(hashed_ids=hashed_ids)
        return self._json("POST", f"/v1/runs/{run_id}/alignment", AlignmentOut, body=body)

    def resume(self, run_id: str, from_step: int) -> RunOut:
        body = ResumeIn(from_step=from_step)
        return self._json("POST", f"/v1/runs/{run_id}/resume", RunOut, body=body)

    def finish(self, run_id: str) -> RunOut:
        return self._json("POST", f"/v1/runs/{run_id}/finish", RunOut)

    def delete_run(self, run_id: str) -> None:
        """Delete the run at party B (everything it stores for it; frees the quota)."""
        self._send("DELETE", f"/v1/runs/{run_id}")

    def step_log(self, run_id: str) -> list[dict[str, Any]]:
        response = self._send("GET", f"/v1/runs/{run_id}/steps", params={"limit": 10_000})
        steps: list[dict[str, Any]] = self._parse_json(response)["steps"]
        return steps

    # ------------------------------------------------------------------ msgpack endpoints

    def psi(self, body: bytes) -> bytes:
        return self._msgpack("/v1/psi", body)

    def align_keys(self, run_id: str, body: bytes) -> bytes:
        """The alignment in binary (shared.alignkeys): an AlignRequest in, an AlignReply out."""
        return self._msgpack(f"/v1/runs/{run_id}/alignment/keys", body)

    def step(self, run_id: str, body: bytes) -> bytes:
        return self._msgpack(f"/v1/runs/{run_id}/steps", body)

    def evaluate(self, run_id: str, body: bytes, split: str = "eval") -> bytes:
        return self._msgpack(f"/v1/runs/{run_id}/evaluate", body, params={"split": split})

    def predict(self, run_id: str, body: bytes) -> bytes:
        return self._msgpack(f"/v1/runs/{run_id}/predict", body)

    # ------------------------------------------------------------------ plumbing

    def _json(
        self,
        method: str,
        path: str,
        model: type[M],
        *,
        body: BaseModel | None = None,
        headers: dict[str, str] | None = None,
    ) -> M:
        content = body.model_dump_json().encode() if body is not None else None
        headers = dict(headers or {})
        if content is not None:
            headers["Content-Type"] = "application/json"
        response = self._send(method, path, content=content, headers=headers)
        return model.model_validate(self._parse_json(response))

    def _msgpack(self, path: str, body: bytes, params: dict[str, str] | None = None) -> bytes:
        response = self._send(
            "POST",
            path,
            content=body,
            headers={"Content-Type": MSGPACK_CONTENT_TYPE, "Accept": MSGPACK_CONTENT_TYPE},
            params=params,
        )
        if _media(response) != MSGPACK_CONTENT_TYPE:
            raise ProtocolError(f"{path}: expected {MSGPACK_CONTENT_TYPE}, got {_media(response)}")
        return response.content

    @staticmethod
    def _parse_json(response: httpx.Response) -> Any:
        if _media(response) != "application/json":
            raise ProtocolError(f"expected application/json, got {_media(response)}")
        try:
            return response.json()
        except json.JSONDecodeError as exc:
            raise ProtocolError(f"invalid JSON from party B: {exc}") from None

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request with retries; returns a 2xx response or raises a typed error."""
        deadline = time.monotonic() + self._retry_for
        delay = 0.1
        while True:
            try:
                response = self._client.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__}: {exc}"
                # a wrong URL or certificate does not heal by waiting: fail now, with the fix
                fault = configuration_fault(
                    exc,
                    self._client.base_url,
                    self._ca_bundle,
                    probe=self.tls_probe,
                    client_cert=self._client_cert,
                    client_key=self._client_key,
                )
                if fault is not None:
                    raise ConfigError(f"{method} {path}: {fault}") from None
            else:
                self.tls_probe.heard_http()
                self.bytes_sent += len(kwargs.get("content") or b"")
                self.bytes_received += len(response.content)
                if response.status_code < 400:
                    return response
                if response.status_code not in _RETRY_STATUS:
                    raise self._problem(response)
                failure = f"HTTP {response.status_code}"
            if time.monotonic() + delay > deadline:
                raise TransportError(
                    f"{method} {path}: party B unreachable for {self._retry_for:.0f} s ({failure})"
                )
            log.warning("%s %s failed (%s); retrying in %.1f s", method, path, failure, delay)
            self.retries += 1
            self._sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 5.0)

    @staticmethod
    def _problem(response: httpx.Response) -> Exception:
        if _media(response) == PROBLEM_CONTENT_TYPE:
            try:
                return problem_from_body(response.status_code, response.json())
            except (json.JSONDecodeError, AttributeError):
                pass
        return ProtocolError(
            f"HTTP {response.status_code} from party B without problem+json: "
            f"{response.text[:200]!r}"
        )


def _media(response: httpx.Response) -> str:
    return str(response.headers.get("content-type", "")).split(";")[0].strip().lower()
