"""Pure ASGI middleware: the request body size limit (413) and per-route request metrics."""

from time import perf_counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api_schemas import ProblemType
from party_b.api.problems import problem_response
from party_b.metrics import Metrics

__all__ = ["BodyLimitMiddleware", "MetricsMiddleware"]


class BodyLimitMiddleware:
    """Refuse a body over ``max_body_bytes`` (413) before the app sees the request.

    The body is read here, at most ``max_body_bytes`` of it, and replayed to the app: with
    chunked uploads there is no Content-Length to trust.
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(
            ProblemType.PAYLOAD_TOO_LARGE,
            f"request bodies are limited to {self.max_body_bytes:,} bytes on this server "
            "(max_body_bytes, FEDLITE_B_LIMIT_MAX_BODY_BYTES): send a smaller body, or ask "
            "party B's operator to raise FEDLITE_B_LIMIT_MAX_BODY_BYTES",
            limit="max_body_bytes",
            value=self.max_body_bytes,
        )
        await response(scope, receive, send)


class MetricsMiddleware:
    """Request count and latency per route and status, as a pure ASGI middleware.

    Starlette's ``@app.middleware("http")`` (BaseHTTPMiddleware) runs the rest of the app in
    a separate task and streams the response through a memory channel; for a 737 KB gradient
    reply that is measurable per request. This one only watches the ``http.response.start``
    message go by.
    """

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = perf_counter()
        status = 500  # what the client sees if the app raises before answering

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            # the router stores the matched route in the (shared) scope
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(perf_counter() - start)
