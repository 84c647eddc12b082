"""One spelling per API path: a request to ``/v1/...`` whose path is not written
canonically is refused (422 ``invalid-request``) before it is routed.

A load balancer in front of replicas routes a run by its id in the path
(docs/DEPLOY.md, replicas). Party B reads the path percent-decoded, so ``/v1/runs/%61bc``
names run ``abc``; a balancer that hashed the bytes it saw would send the two spellings of
one run to two replicas, and the run would move between them with every request. The
balancer shipped here hashes the decoded run id, and party B accepts each path in one
spelling only, the one a client builds from the ids it was given: no percent-encoding of a
character that needs none (letters, digits, ``-._~``: run ids are hex, party names
``[a-z0-9_-]``), no encoded ``/``, no empty segment (``//``) and no ``.`` or ``..`` segment,
which some proxies resolve and others do not. The answer names the canonical path, so the
client's fix is one look away.
"""

import re
from urllib.parse import unquote

from starlette.types import ASGIApp, Receive, Scope, Send

from api_schemas import ProblemType
from party_b.api.problems import problem_response

__all__ = ["CanonicalPathMiddleware", "canonical_path", "non_canonical"]

# a percent-escape of a character that needs none (RFC 3986's unreserved) or of "/"
_NEEDLESS = re.compile(r"%(?:[46][1-9A-Fa-f]|[57][0-9Aa]|3[0-9]|2[DEde]|5[Ff]|7[Ee]|2[Ff])")


def canonical_path(raw_path: str) -> str:
    """``raw_path`` written canonically: needless escapes decoded, empty and ``.`` segments
    dropped, ``..`` resolved."""
    plain = _NEEDLESS.sub(lambda m: unquote(m.group(0)), raw_path)
    segments: list[str] = []
    for segment in plain.split("/"):
        if segment == "..":
            segments = segments[:-1]  # as RFC 3986 resolves it
        elif segment not in ("", "."):
            segments.append(segment)
    trailing = "/" if plain.endswith("/") and segments else ""
    return "/" + "/".join(segments) + trailing


def non_canonical(raw_path: str) -> str | None:
    """Why the path as sent is not canonical; None when it is."""
    segments = raw_path.split("/")[1:]
    if raw_path.endswith("/"):
        segments = segments[:-1]
    if any(s in ("", ".", "..") for s in segments):
        return "it has an empty, '.' or '..' segment"
    if _NEEDLESS.search(raw_path):
        return "it percent-encodes a character that needs no encoding, or a '/'"
    return None


class CanonicalPathMiddleware:
    """422 ``invalid-request`` for a path not written canonically, naming the canonical one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # the API's paths (what routes a run); the dashboard's files answer 404 as before
        api = scope["type"] == "http" and scope["path"].startswith("/v1/")
        raw = scope.get("raw_path") if api else None
        sent = raw.decode("latin-1") if raw is not None else None
        why = non_canonical(sent) if sent is not None else None
        if sent is not None and why is not None:
            canonical = canonical_path(sent)
            response = problem_response(
                ProblemType.INVALID_REQUEST,
                f"the path {sent!r} is not written canonically ({why}): send {canonical!r}",
                canonical_path=canonical,
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
