"""Party B replicated on this machine, without Docker: PostgreSQL, N ``fedlite-b serve``
replicas on it, and HAProxy in front routing each run to one replica (docs/DEPLOY.md,
section "Replicas").

    make replicas                                  # PostgreSQL + HAProxy + 2 replicas
    python -m party_b.ops.stack --replicas 3 --port 8080 --labels labels.csv \\
        --tokens-file tokens.txt [--mutual-tls] [--database-url postgresql+psycopg://...]

When every part answers, one JSON line goes to stdout: the load balancer's URL, the database
URL and each replica's URL and process id; ``<state dir>/stack.json`` holds the same and is
rewritten whenever a replica is restarted. A replica that dies is started again after
``--restart-after`` seconds on the same port and name, as a process supervisor or Kubernetes
would. SIGTERM or Ctrl-C stops HAProxy, the replicas (SIGTERM: their graceful stop) and the
PostgreSQL server it started.

HAProxy hashes the run id of the path as party B reads it (percent-decoded) onto a
consistent-hash ring, so all of a run's requests reach one replica while the set of healthy
replicas stays the same; when a replica fails its health checks its runs move to the others,
which take them over from the database (``party_b.service.ownership``). With
``--mutual-tls`` the balancer requires and verifies client certificates and passes the
verified subject on to the replicas over mutual TLS (``party_b.ops.certs``), so tokens bound
to a certificate and the audit's subjects work through it. The tokens reach the replicas in
their environment, never on a command line. PostgreSQL comes from Debian's ``postgresql``
package and HAProxy from ``haproxy``.
"""

import argparse
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from party_b.ops.certs import HOP_SUBJECT, StackCertificates, stack_certificates
from party_b.ops.launch import MALLOC_TUNING, free_port, reserve_port, wait_until_healthy
from party_b.token_text import new_token

__all__ = [
    "RUN_HASH",
    "LocalStack",
    "Replica",
    "haproxy_config",
    "local_postgres",
    "main",
]

# HAProxy's health checks: every 500 ms, each given 2 s (a replica busy with big steps on a
# loaded machine answered in over 300 ms and was marked down, moving its runs for nothing),
# down after 3 failures, up after 2 passes; a refused connection marks a replica down at once
# (a killed one refuses long before its health checks fail)
_CHECKS = (
    "inter 500ms fastinter 500ms fall 3 rise 2 observe layer4 error-limit 1 on-error mark-down"
)
# the run id as party B reads the path: percent-decoded, the segment after /v1/runs/
# (docker/haproxy/haproxy.cfg and the Kubernetes one route the same way)
RUN_HASH = """\
    http-request set-var(txn.run_id) path,url_dec,field(4,/) if { path,url_dec -m beg /v1/runs/ }
    balance hash var(txn.run_id)"""


def haproxy_config(
    port: int, servers: Mapping[str, int], tls: StackCertificates | None = None
) -> str:
    """HAProxy's configuration: ``127.0.0.1:port`` in front of ``servers`` {name: port}.

    * ``balance hash`` of the run id as party B reads it (``/v1/runs/<id>/...``, percent-
      decoded) + ``hash-type consistent``: a run's steps, resume, finish and reads all land on
      the one replica that holds it, whatever spelling of its id a client sends (party B
      answers any other spelling 422, from that replica); a replica that goes down moves only
      its own runs; requests without a run id go round robin.
    * health checks every 500 ms (``/healthz``, 2 s each), out after 3 failures or at once on
      a refused connection (``observe layer4``), back after 2 passes; ``retries`` and
      ``redispatch``: a request whose connection is refused (a replica just killed) goes to
      another replica instead of failing.
    * a request in flight on a replica that dies gets 502; party A resends it (steps are
      idempotent), by then to the replica that took the run over.
    * timeouts: steps can wait up to 5 s for their predecessor and take long on big models.
    * with ``tls``: mutual TLS for party A (its client certificate verified against
      ``ca.crt``, the request refused in the handshake without one), the verified subject
      passed on in ``X-Fedlite-Client-Subject`` (any such header from the client dropped),
      and mutual TLS to the replicas, which know the balancer by its own certificate
      (``party_b.ops.certs``) and trust only it to name the caller.
    """
    bind = f"127.0.0.1:{port}"
    identity = ""
    server_tls = ""
    if tls is not None:
        bind += f' ssl crt "{tls.pem("lb")}" ca-file "{tls.ca}" verify required alpn http/1.1'
        identity = (
            "    http-request del-header X-Fedlite-Client-Subject\n"
            "    http-request set-header X-Fedlite-Client-Subject "
            "%[ssl_c_s_dn(,0,rfc2253)] if { ssl_c_used }\n"
        )
        server_tls = f' ssl verify required ca-file "{tls.hop_ca}" crt "{tls.pem("lb-hop")}"'
    backends = "\n".join(
        f"    server {name} 127.0.0.1:{server_port} check" for name, server_port in servers.items()
    )
    return f"""# generated by party_b.ops.stack
global
    maxconn 4096

defaults
    mode http
    timeout connect 500ms
    timeout client 300s
    timeout server 300s
    timeout http-request 60s
    timeout check 2s
    retries 2
    option redispatch 1

frontend party_b
    bind {bind}
{identity}    default_backend replicas

backend replicas
{RUN_HASH}
    hash-type consistent
    option httpchk GET /healthz
    http-check expect status 200
    default-server {_CHECKS}{server_tls}
{backends}
"""


def _as_postgres(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL server command, as the ``postgres`` user when we are root (the
    server refuses to run as root)."""
    if os.geteuid() == 0:
        command = ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(map(_quote, command))]
    done = subprocess.run(command, check=False, text=True, capture_output=True, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    return done


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\"'\"'") + "'"


def _postgres_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parts[-3])
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError(
            "PostgreSQL's server programs are missing: apt-get install postgresql "
            "(or pass --database-url of a running server)"
        )
    return Path(initdb).parent


@contextmanager
def local_postgres(port: int) -> Iterator[str]:
    """A throwaway PostgreSQL server on 127.0.0.1:``port`` (trust authentication, local
    only) in a new temporary directory; yields its SQLAlchemy URL, and stops it and deletes
    the directory at the end. The directory sits directly in the temporary directory: run
    as root, the server runs as ``postgres``, which must reach it."""
    binaries = _postgres_bin()
    directory = Path(tempfile.mkdtemp(prefix="fedlite-postgres-"))
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres")
    if not (directory / "PG_VERSION").exists():
        _as_postgres(
            [str(binaries / "initdb"), "-D", str(directory), "-U", "postgres", "--auth=trust",
             "-E", "UTF8"]
        )  # fmt: skip
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {directory} -c max_connections=200"
    _as_postgres(
        [str(binaries / "pg_ctl"), "-D", str(directory), "-w", "-l",
         str(directory / "server.log"), "-o", options, "start"]
    )  # fmt: skip
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        _as_postgres([str(binaries / "pg_ctl"), "-D", str(directory), "-m", "fast", "stop"])
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Replica:
    """One ``fedlite-b serve`` replica: a fixed name (its lease holder id) and port.
    ``verify``: how to reach it over TLS (its CA and a client certificate), or True for
    plain HTTP."""

    name: str
    port: int
    command: list[str]
    log_path: Path
    env: dict[str, str]
    verify: ssl.SSLContext | bool = True
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        scheme = "https" if isinstance(self.verify, ssl.SSLContext) else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        """Start it; its output goes on after what earlier starts wrote (one log for all)."""
        with self.log_path.open("ab") as log:
            when = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"--- {self.name}: start {self.starts + 1}, {when} ---\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        self.starts += 1

    def wait_healthy(self, timeout: float = 120.0) -> None:
        assert self.proc is not None
        wait_until_healthy(
            self.url, self.proc, log_path=self.log_path, timeout=timeout, verify=self.verify
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL: no graceful stop, nothing flushed (the point of a failover test)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, grace_seconds: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class LocalStack:
    """PostgreSQL (unless ``database_url`` is given), ``replicas`` party B replicas and HAProxy
    on 127.0.0.1; use as a context manager. ``restart_after``: seconds before a replica that
    died is started again (None: never)."""

    state_dir: Path
    labels: Path
    tokens: str  # 'name:token,...': the replicas read them from their environment
    replicas: int = 2
    port: int = 0  # HAProxy's; 0: a free one
    database_url: str | None = None
    restart_after: float | None = 1.0
    torch_threads: int = 1  # many processes share few cores
    extra_args: list[str] = field(default_factory=list)
    # mutual TLS at the balancer and on the hop to the replicas (party_b.ops.certs): made in
    # state_dir/tls when the stack starts
    mutual_tls: bool = False
    certificates: StackCertificates | None = None
    members: dict[str, Replica] = field(default_factory=dict)
    _stack: ExitStack = field(default_factory=ExitStack)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"{'https' if self.mutual_tls else 'http'}://127.0.0.1:{self.port}"

    def client_tls(self, party: str = "party-a") -> ssl.SSLContext:
        """How a feature party reaches the balancer: its CA, and ``party``'s certificate."""
        assert self.certificates is not None, "a stack with mutual_tls"
        context = ssl.create_default_context(cafile=str(self.certificates.ca))
        context.load_cert_chain(
            self.certificates.path(f"{party}.crt"), self.certificates.path(f"{party}.key")
        )
        return context

    def __enter__(self) -> "LocalStack":
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._stack.close()

    def _start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.port:  # the balancer's port, chosen by whoever started us: none of ours
            reserve_port(self.port)
        else:
            self.port = free_port()
        if self.database_url is None:
            self.database_url = self._stack.enter_context(local_postgres(free_port()))
        if self.mutual_tls and self.certificates is None:
            self.certificates = stack_certificates(self.state_dir / "tls")
        for i in range(1, self.replicas + 1):
            self.members[f"b{i}"] = self._replica(f"b{i}")
        self._stack.callback(self._stop_replicas)
        self._stack.callback(self._stop.set)  # (callbacks run last first: supervisor first)
        for replica in self.members.values():
            replica.start()
        for replica in self.members.values():
            replica.wait_healthy()
        self._start_haproxy()
        self._write_state()
        if self.restart_after is not None:
            threading.Thread(target=self._supervise, name="stack-supervisor", daemon=True).start()

    def _replica(self, name: str) -> Replica:
        assert self.database_url is not None
        port = free_port()
        command = [
            sys.executable, "-m", "party_b.ops.cli", "serve",
            "--port", str(port),
            "--database-url", self.database_url,
            "--labels", str(self.labels),
            "--replica-id", name,
            "--torch-threads", str(self.torch_threads),
            "--log-level", "warning",
            *self.extra_args,
        ]  # fmt: skip
        # the tokens in the environment, not on a command line anyone can read with ps
        env = {**os.environ, **MALLOC_TUNING, "FEDLITE_B_TOKENS": self.tokens}
        verify: ssl.SSLContext | bool = True
        tls = self.certificates
        if tls is not None:
            command += [
                "--ssl-certfile", str(tls.path("replica.crt")),
                "--ssl-keyfile", str(tls.path("replica.key")),
                "--ssl-ca-certs", str(tls.hop_ca),
                "--trusted-proxy-subject", HOP_SUBJECT,
            ]  # fmt: skip
            verify = ssl.create_default_context(cafile=str(tls.hop_ca))
            verify.load_cert_chain(tls.path("replica.crt"), tls.path("replica.key"))
        return Replica(name, port, command, self.state_dir / f"{name}.log", env, verify)

    def _start_haproxy(self) -> None:
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not Path(haproxy).exists():
            raise RuntimeError("HAProxy is missing: apt-get install haproxy")
        config = self.state_dir / "haproxy.cfg"
        servers = {n: r.port for n, r in self.members.items()}
        config.write_text(haproxy_config(self.port, servers, self.certificates))
        log = (self.state_dir / "haproxy.log").open("ab")
        self._stack.callback(log.close)
        proc = subprocess.Popen([haproxy, "-f", str(config), "-db"], stdout=log, stderr=log)
        self._stack.callback(_terminate, proc)
        # up when it answers for a replica (its first health checks may still be running)
        deadline = time.monotonic() + 30
        import httpx

        verify = self.client_tls() if self.mutual_tls else True
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"HAProxy exited: see {self.state_dir / 'haproxy.log'}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0, verify=verify).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("HAProxy did not answer in 30 s")
            time.sleep(0.1)

    def _supervise(self) -> None:
        """Start again every replica that died (after ``restart_after`` seconds)."""
        assert self.restart_after is not None
        died: dict[str, float] = {}
        while not self._stop.wait(0.05):
            now = time.monotonic()
            with self._lock:
                for name, replica in self.members.items():
                    if replica.alive() or self._stop.is_set():
                        continue
                    since = died.setdefault(name, now)
                    if now - since >= self.restart_after:
                        del died[name]
                        replica.start()
                        self._write_state()

    def _stop_replicas(self) -> None:
        with self._lock:
            for replica in self.members.values():
                replica.stop()

    def kill9(self, name: str) -> None:
        """SIGKILL one replica (the supervisor starts it again)."""
        with self._lock:
            self.members[name].kill9()

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "url": self.url,
            "database_url": self.database_url,
            "replicas": {
                name: {"url": r.url, "pid": r.pid, "starts": r.starts}
                for name, r in self.members.items()
            },
        }
        if self.certificates is not None:  # what a feature party connects with
            described["ca_bundle"] = str(self.certificates.ca)
            described["client_cert"] = str(self.certificates.path("party-a.crt"))
            described["client_key"] = str(self.certificates.path("party-a.key"))
        return described

    def _write_state(self) -> None:
        path = self.state_dir / "stack.json"
        path.write_text(json.dumps(self.describe(), indent=2) + "\n")


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m party_b.ops.stack", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--port", type=int, default=8080, help="HAProxy's port on 127.0.0.1")
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="logs, configuration, certificates (default: a new temporary directory, removed "
        "when the stack stops)",
    )
    parser.add_argument("--labels", type=Path, help="label table (default: the demo table)")
    parser.add_argument(
        "--tokens-file",
        type=Path,
        help="'name:token' lines to register (default FEDLITE_B_TOKENS, else a new demo token; "
        "never on a command line, where ps shows it)",
    )
    parser.add_argument(
        "--mutual-tls",
        action="store_true",
        help="HTTPS at the balancer with client certificates required and verified, their "
        "subject passed to the replicas over mutual TLS (certificates made in STATE_DIR/tls)",
    )
    parser.add_argument("--database-url", help="a running PostgreSQL (default: start one)")
    parser.add_argument("--restart-after", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")

    temporary = args.state_dir is None
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="fedlite-stack-"))
    try:
        return _serve_stack(args, state_dir)
    finally:
        if temporary:
            shutil.rmtree(state_dir, ignore_errors=True)


def _tokens(tokens_file: Path | None) -> tuple[str, str | None]:
    """('name:token,...', the demo token when one was made)."""
    if tokens_file is not None:
        lines = tokens_file.read_text().split()
        return ",".join(line for line in lines if line), None
    if os.environ.get("FEDLITE_B_TOKENS"):
        return os.environ["FEDLITE_B_TOKENS"], None
    shown = new_token(24)
    return f"demo:{shown}", shown


def _serve_stack(args: argparse.Namespace, state_dir: Path) -> int:
    labels = args.labels
    if labels is None:
        from shared.demo_data import write_party_b_demo

        labels = write_party_b_demo(state_dir / "party_b_labels.csv")
    tokens, token_shown = _tokens(args.tokens_file)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    with LocalStack(
        state_dir,
        labels,
        tokens,
        replicas=args.replicas,
        port=args.port,
        database_url=args.database_url,
        restart_after=args.restart_after,
        mutual_tls=args.mutual_tls,
    ) as stack:
        ready = {**stack.describe(), "state_dir": str(state_dir)}
        if token_shown is not None:
            ready["token"] = token_shown
        print(json.dumps(ready), flush=True)
        try:
            stopping.wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
