"""Party B replicated: ``make replicas`` (PostgreSQL, HAProxy, two ``fedlite-b serve``
replicas, no Docker) with runs training through the load balancer while the replica that
holds a run is SIGKILLed; every run ends bit-identical to an uninterrupted one, each step
logged once. (``python -m benchmarks.scale.failover`` does the same with three replicas, more
runs and kills, and measures the recovery.)

Needs Debian's ``postgresql`` and ``haproxy``: skipped with the reason when either is
missing, failed under CI (``.ci/run`` installs both).
"""

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from party_a.config import PartyAConfig, load_config
from party_a.errors import problem_from_body
from party_a.features import load_features
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer
from party_a.transport.http import HttpTransport
from party_b import store
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.labels import load_label_table
from party_b.ops.launch import free_port
from shared.demo_data import write_party_a_demo, write_party_b_demo
from shared.training import state_sha256
from tests.utils.cli import run_cli
from tests.utils.servers import ALICE, REPO_ROOT

STEPS = 600
# run 0's steps at which the replica holding it is killed: between two of its checkpoints
# (every 10 steps), so that every kill loses applied steps and party A rolls back, whatever
# the pipelined step after it did (at a checkpoint step, a rollback happened only when that
# step had been answered before the kill: the count depended on timing)
KILL_AT = (155, 305, 455)


def _require(program: str, package: str) -> None:
    found = shutil.which(program) or any(Path("/usr/lib/postgresql").glob(f"*/bin/{program}"))
    if not found and not Path(f"/usr/sbin/{program}").exists():
        message = f"{program} is missing: apt-get install {package} (.ci/run does it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def _config(name: str, seed: int) -> PartyAConfig:
    return load_config(
        None,
        {
            "run.name": name,
            "run.model": "tabular_mlp",
            "run.steps": STEPS,
            "run.batch_size": 32,
            "run.seed": seed,
            "run.checkpoint_interval": 10,
            "run.pipeline_depth": 2,
            "model.bottom": {"hidden": [32], "cut_dim": 16},
            "model.top": {"hidden": [16]},
            "quantizer.mode": "pq",
            "quantizer.q": 4,
            "quantizer.L": 4,
            "optimizer.bottom": {"name": "adam", "lr": 0.003},
            "optimizer.top": {"name": "adam", "lr": 0.003},
        },
    )


class Stack:
    """``make replicas`` in its own process group; ``describe()`` reads its stack.json.
    ``state_dir`` None: the stack's own temporary one; ``mutual_tls``: ``--mutual-tls``."""

    def __init__(
        self, state_dir: Path | None, labels: Path, *, log: Path, mutual_tls: bool = False
    ) -> None:
        args = (
            f"--replicas 2 --port {free_port()} --labels {labels} --restart-after 0.5"
            + (f" --state-dir {state_dir}" if state_dir is not None else "")
            + (" --mutual-tls" if mutual_tls else "")
        )
        with log.open("wb") as written:
            self.proc = subprocess.Popen(
                ["make", "-s", "replicas", f"PY={sys.executable}", f"REPLICAS_ARGS={args}"],
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                stderr=written,
                start_new_session=True,
                # the token in the environment, never on a command line; compared to the bit
                # with a reference run: no label DP, whose randomized labels come from each
                # run's own secret (the replicas inherit both)
                env={
                    **os.environ,
                    "FEDLITE_B_PRIVACY": "off",
                    "FEDLITE_B_TOKENS": f"alice:{ALICE}",
                },
            )
        lines: queue.Queue[bytes] = queue.Queue()
        assert self.proc.stdout is not None
        stdout = self.proc.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            ready = lines.get(timeout=240)
        except queue.Empty:
            self.stop()
            raise AssertionError("make replicas did not come up in 240 s") from None
        if not ready:
            self.stop()
            text = log.read_text(errors="replace")
            raise AssertionError(f"make replicas exited:\n{text[-3000:]}")
        self.ready: dict[str, Any] = json.loads(ready)
        self.url: str = self.ready["url"]
        self.state_dir = Path(self.ready["state_dir"])

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = json.loads((self.state_dir / "stack.json").read_text())
        return described

    def all_up(self) -> bool:
        for replica in self.describe()["replicas"].values():
            try:
                if httpx.get(f"{replica['url']}/healthz", timeout=2).status_code != 200:
                    return False
            except httpx.HTTPError:
                return False
        return True

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Stack, Path, Path]]:
    _require("haproxy", "haproxy")
    _require("initdb", "postgresql")
    features = write_party_a_demo(tmp_path / "party_a.csv")
    labels = write_party_b_demo(tmp_path / "party_b.csv")
    (tmp_path / "stack").mkdir()
    running = Stack(tmp_path / "stack", labels, log=tmp_path / "make.log")
    try:
        yield running, features, labels
    finally:
        running.stop()


def _reference(tmp_path: Path, features: Path, labels: Path, seed: int) -> tuple[str, str]:
    source = load_label_table(labels, id_column="id", label_column="y", feature_columns=None)
    (tmp_path / f"ref-{seed}").mkdir()
    service, caller = in_process_party_b(source, tmp_path / f"ref-{seed}" / "b.sqlite")
    trainer = PartyATrainer(
        config=_config(f"run-{seed}", seed),
        features=load_features(features, id_column="id", feature_columns=None, standardize=True),
        transport=InProcessTransport(service, caller, problem=problem_from_body),
        store=LocalStore.in_directory(tmp_path / f"ref-{seed}" / "a"),
        server="in-process",
    )
    try:
        trainer.prepare()
        trainer.train()
        top = service.runs.get(caller, trainer.run_id).model_sha256
        assert top is not None
        return state_sha256(trainer.bottom.model.state_dict()), top
    finally:
        trainer.close()


def _holder(sessions: sessionmaker[Session], run_id: str) -> str:
    """The replica that serves the run: its lease holder in PostgreSQL."""
    with sessions() as session:
        lease = store.lease_of(session, run_id)
    assert lease is not None and lease[0] is not None, lease
    return lease[0]


class _KillGate:
    """Holds run 0's trainer at each step of ``KILL_AT`` (from its ``on_step``) until the
    replica holding the run has been SIGKILLed: the kills land at those steps, with the
    pipelined step after them in flight, however fast the machine trains (killing at random
    moments let a fast run finish before the third kill)."""

    def __init__(self) -> None:
        self.arrived: queue.Queue[int] = queue.Queue()
        self.resume = threading.Event()
        self.held: set[int] = set()  # a step applied again after a rollback is not held again

    def on_step(self, step: int) -> None:
        if step in KILL_AT and step not in self.held:
            self.held.add(step)
            self.arrived.put(step)
            assert self.resume.wait(600), "the killer never let the run go on"
            self.resume.clear()


def _kill_the_holder_of(
    running: Stack, sessions: sessionmaker[Session], trainer: PartyATrainer, gate: _KillGate
) -> list[tuple[str, int]]:
    """At each step of ``KILL_AT``, once both replicas are up (the stack restarts a killed
    one), SIGKILL the replica holding the run, then let the run go on."""
    killed: list[tuple[str, int]] = []
    for _ in KILL_AT:
        step = gate.arrived.get(timeout=600)
        deadline = time.monotonic() + 120
        while not running.all_up():  # polled; a restarted replica warms up in seconds
            assert time.monotonic() < deadline, "a replica did not come back"
            time.sleep(0.2)
        name = _holder(sessions, trainer.run_id)
        os.kill(running.describe()["replicas"][name]["pid"], signal.SIGKILL)
        killed.append((name, step))
        gate.resume.set()
    return killed


@pytest.mark.timeout(900)
def test_replicas_behind_haproxy_survive_sigkills_of_the_replica_serving_a_run(
    stack: tuple[Stack, Path, Path], tmp_path: Path
) -> None:
    running, features, labels = stack
    expected = {seed: _reference(tmp_path, features, labels, seed) for seed in (0, 1)}
    trainers = {
        seed: PartyATrainer(
            config=_config(f"run-{seed}", seed),
            features=load_features(
                features, id_column="id", feature_columns=None, standardize=True
            ),
            transport=HttpTransport(running.url, ALICE, retry_for=300, timeout=60),
            store=LocalStore.in_directory(tmp_path / f"a-{seed}"),
            server=running.url,
        )
        for seed in (0, 1)
    }
    gate = _KillGate()
    results: dict[int, Any] = {}
    for trainer in trainers.values():
        trainer.prepare()
    trainers[0].on_step = lambda r, _s: gate.on_step(r.step)

    def train(seed: int) -> None:
        try:
            results[seed] = trainers[seed].train()
        except Exception as exc:  # reported by the assertions below
            results[seed] = exc

    threads = [threading.Thread(target=train, args=(seed,), daemon=True) for seed in trainers]
    engine = store.make_engine(running.describe()["database_url"])
    try:
        for thread in threads:
            thread.start()
        killed = _kill_the_holder_of(running, store.make_session_factory(engine), trainers[0], gate)
        for thread in threads:
            thread.join(600)
    finally:
        engine.dispose()
        for trainer in trainers.values():
            trainer.close()

    assert [step for _name, step in killed] == list(KILL_AT), killed
    for seed, trainer in trainers.items():
        summary = results[seed]
        assert not isinstance(summary, Exception), summary
        assert summary.last_step == STEPS
        bottom = state_sha256(trainer.bottom.model.state_dict())
        with HttpTransport(running.url, ALICE) as transport:
            top = transport.get_run(trainer.run_id).model_sha256
            logged = [row["step"] for row in transport.step_log(trainer.run_id)]
        assert (bottom, top) == expected[seed], seed
        assert logged == list(range(1, STEPS + 1)), seed
    assert results[0].rollbacks >= len(KILL_AT)


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _until(condition: Any, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.timeout(900)
def test_make_replicas_with_mutual_tls_carries_identity_and_keeps_secrets_off_command_lines(
    tmp_path: Path,
) -> None:
    """``make replicas`` (mutual TLS by default, its own temporary state directory): a
    certificate-bound, scoped, expiring token trains through its balancer and the audit names
    the certificate; no process of the stack has a token on its command line; a replica that
    dies is started again with its log carried on; the temporary directory is gone at the
    end."""
    _require("haproxy", "haproxy")
    _require("initdb", "postgresql")
    features, labels = (
        write_party_a_demo(tmp_path / "a.csv"),
        write_party_b_demo(tmp_path / "b.csv"),
    )
    running = Stack(None, labels, log=tmp_path / "make.log", mutual_tls=True)
    try:
        ready = running.ready
        database, state_dir = ready["database_url"], running.state_dir
        # Execute: a token bound to the stack's demo party certificate, training through it
        issued = run_cli(
            "b", "token", "issue", "--name", "bank-a", "--database-url", database,
            "--scope", "train", "--expires", "1d", "--subject", "CN=party-a,O=FedLite demo",
        )  # fmt: skip
        assert issued.returncode == 0, issued.stderr
        trained = run_cli(
            "a", "train", "--server", running.url, "--token", issued.stdout.strip(),
            "--ca-bundle", ready["ca_bundle"], "--client-cert", ready["client_cert"],
            "--client-key", ready["client_key"], "--features", str(features),
            "--config", str(REPO_ROOT / "examples" / "breast.toml"), "--steps", "4",
            "--state-dir", str(tmp_path / "state"), timeout=600,
        )  # fmt: skip
        audit = run_cli("b", "audit", "--database-url", database, "--actor", "bank-a", "--jsonl")
        pids = [r["pid"] for r in running.describe()["replicas"].values()]
        commands = [_cmdline(pid) for pid in [running.proc.pid, *pids]]
        # a replica killed and started again by the stack
        os.kill(pids[0], signal.SIGKILL)
        _until(lambda: running.describe()["replicas"]["b1"]["starts"] == 2, "b1 not restarted")
        log = (state_dir / "b1.log").read_text()
    finally:
        running.stop()

    # Assert
    assert trained.returncode == 0, trained.stderr
    rows = [json.loads(line) for line in audit.stdout.splitlines() if line.strip()]
    assert rows and {r["subject"] for r in rows} == {"CN=party-a,O=FedLite demo"}
    assert not any(ALICE in command for command in commands), commands
    assert "--- b1: start 1," in log and "--- b1: start 2," in log
    assert log.index("--- b1: start 1,") < log.index("--- b1: start 2,")
    assert not state_dir.exists()
