"""Party B's HTTP path piece by piece: what each layer around a step adds to a round trip,
under each event loop and HTTP parser uvicorn can use (issue 36).

    python -m benchmarks.floor.http_path [--rounds 3] [--block 300]

Every layer is a server of its own (uvicorn in a child process, 127.0.0.1), answering a
1,500-byte msgpack body with itself, as party A's ``httpx.Client`` sends a step: keep-alive,
``Authorization: Bearer``. Each layer adds one piece of party B's step path to the one before:

    asgi        a bare ASGI app: uvicorn's loop and parser, nothing else
    fastapi     an empty FastAPI route (``await request.body()``, a Response)
    middleware  party B's middleware around it (``party_b.api.main.install_middleware``:
                metrics, in-flight count, body limit, canonical paths)
    auth        the route's authentication and scope (``party_b.api.deps.allowed``: the
                caller's token looked up in a real SQLite file)
    route       the step route's dependencies as ``party_b.api.doors.both`` declares them:
                ``allowed`` on the route, the endpoint taking ``AdmittedDep`` and ``ServiceDep``
    thread      the hop to a worker thread and back (``party_b.api.deps.in_thread``), where
                the step's torch work runs

under ``asyncio`` + ``h11`` (uvicorn's pure-Python choice) and ``uvloop`` + ``httptools`` (what
its "auto" picks when they are installed, as the product's dependencies now make it). The
servers run side by side and take turns, block by block in a rotating order, so that every
configuration shares the machine's noise. Writes ``benchmarks/results/http_path.json``;
``python -m benchmarks.report`` renders its table.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Annotated, Any

import httpx

from benchmarks.common import ROOT, versions, write_result
from party_b.ops.launch import free_port

__all__ = ["BODY", "CONFIGS", "HEADERS", "LAYERS", "PATH", "build_app", "main"]

LAYERS = ("asgi", "fastapi", "middleware", "auth", "route", "thread")
CONFIGS = (("asyncio", "h11"), ("uvloop", "httptools"))
TOKEN = "http-path-benchmark-token-0123456789"
BODY = bytes(range(256)) * 5 + bytes(220)  # 1,500 bytes, a small step request's size
PATH = "/v1/echo"
HEADERS = {"authorization": f"Bearer {TOKEN}", "content-type": "application/msgpack"}


def build_app(layer: str, database: Path) -> Any:
    """The ASGI app of ``layer`` (``LAYERS``); ``database``: the SQLite file of the auth
    layers' token."""
    if layer == "asgi":
        return _bare_echo
    import anyio
    from fastapi import FastAPI, Request, Response

    from party_b.access import Action
    from party_b.api.deps import AdmittedDep, CallerLookup, ServiceDep, allowed, in_thread
    from party_b.api.lifecycle import Lifecycle
    from party_b.api.main import install_middleware
    from party_b.api.problems import install_problem_handlers
    from party_b.metrics import Metrics
    from party_b.service import Caller
    from party_b.store import make_engine, make_session_factory

    app = FastAPI()
    layers = LAYERS.index(layer)
    if layers <= LAYERS.index("middleware"):

        @app.post(PATH)
        async def echo(request: Request) -> Response:
            return Response(await request.body(), media_type="application/msgpack")

    else:

        def same(body: bytes) -> bytes:
            return body

        if layer == "auth":

            @app.post(PATH)
            async def echo_as_caller(
                request: Request, who: Annotated[Caller, allowed(Action.STEP)]
            ) -> Response:
                return Response(await request.body(), media_type="application/msgpack")

        else:  # the step route's own dependencies (party_b.api.routes.steps)

            @app.post(PATH, dependencies=[allowed(Action.STEP)])
            async def echo_as_step(
                request: Request, who: AdmittedDep, service: ServiceDep
            ) -> Response:
                body = await request.body()
                if layer == "thread":
                    body = await in_thread(request, same, body)
                return Response(body, media_type="application/msgpack")

        from party_b import auth

        sessions = make_session_factory(make_engine(f"sqlite:///{database}"))
        with sessions() as session:
            auth.register_token(session, "benchmark", TOKEN)
        app.state.sessions = sessions
        app.state.callers = CallerLookup(sessions)
        app.state.limiter = anyio.CapacityLimiter(8)
        app.state.service = None  # what ServiceDep hands the endpoint; the echo needs none
        install_problem_handlers(app)
    if layers >= LAYERS.index("middleware"):
        metrics = Metrics()
        lifecycle = Lifecycle(metrics.registry)
        lifecycle.serving()
        install_middleware(app, 64 << 20, lifecycle, metrics)
    return app


async def _bare_echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    headers = [(b"content-type", b"application/msgpack"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve(layer: str, loop: str, http: str, port: int, database: Path) -> None:
    """Serve ``layer`` on 127.0.0.1:``port`` with uvicorn's ``loop`` and ``http`` (the child)."""
    import uvicorn

    app = build_app(layer, database)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, loop=loop, http=http, log_level="warning",
        access_log=False,
    )  # fmt: skip
    uvicorn.Server(config).run()


@contextmanager
def server(layer: str, loop: str, http: str, work: Path) -> Iterator[str]:
    """One layer's server in a child process; yields its URL once it answers."""
    port = free_port()
    database = work / f"{layer}-{loop}.sqlite"
    cmd = [
        sys.executable, "-m", "benchmarks.floor.http_path", "--serve", layer, "--loop", loop,
        "--http", http, "--port", str(port), "--database", str(database),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{layer} ({loop}, {http}) exited with {proc.returncode}")
            try:
                httpx.post(url + PATH, content=BODY, headers=HEADERS, timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def block(client: httpx.Client, url: str, n: int) -> list[float]:
    """``n`` round trips of the body (seconds each); each answer checked."""
    out = []
    for _ in range(n):
        start = time.perf_counter()
        response = client.post(url + PATH, content=BODY, headers=HEADERS)
        out.append(time.perf_counter() - start)
        if response.status_code != 200 or response.content != BODY:
            raise RuntimeError(f"{url}: {response.status_code} {response.content[:200]!r}")
    return out


def measure(rounds: int, n: int, warmup: int) -> dict[str, Any]:
    """Every layer under every configuration: round-trip samples, blocks rotating."""
    keys = [(layer, loop, http) for loop, http in CONFIGS for layer in LAYERS]
    samples: dict[str, list[float]] = {"/".join(k): [] for k in keys}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="fedlite-http-path-") as tmp, ExitStack() as stack:
        urls = {k: stack.enter_context(server(*k, Path(tmp))) for k in keys}
        clients = {k: stack.enter_context(httpx.Client(timeout=30)) for k in keys}
        for k in keys:
            block(clients[k], urls[k], warmup)
        for r in range(rounds):
            order = keys[r % len(keys) :] + keys[: r % len(keys)]
            for k in order:
                samples["/".join(k)] += block(clients[k], urls[k], n)
        loads.append(os.getloadavg()[0])
    rows = []
    for layer, loop, http in keys:
        ms = sorted(1000 * s for s in samples[f"{layer}/{loop}/{http}"])
        q = statistics.quantiles(ms, n=4)
        rows.append(
            {
                "layer": layer,
                "loop": loop,
                "http": http,
                "median_ms": statistics.median(ms),
                "p25_ms": q[0],
                "p75_ms": q[2],
                "n": len(ms),
            }
        )
    return {"rows": rows, "loads": loads}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block", type=int, default=300, help="round trips per block")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--serve", choices=LAYERS, help=argparse.SUPPRESS)
    parser.add_argument("--loop", default="asyncio", help=argparse.SUPPRESS)
    parser.add_argument("--http", default="h11", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--database", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.loop, args.http, args.port, args.database)
        return 0
    result = measure(args.rounds, args.block, args.warmup)
    result.update(
        rounds=args.rounds,
        block=args.block,
        body_bytes=len(BODY),
        versions=versions("fastapi", "starlette", "uvicorn", "httpx", "uvloop", "httptools"),
    )
    path = write_result("http_path", result, args.out)
    for row in result["rows"]:
        print(
            f"{row['layer']:>10} {row['loop']:>8}+{row['http']:<9} {row['median_ms']:.3f} ms "
            f"({row['p25_ms']:.3f}-{row['p75_ms']:.3f})"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
