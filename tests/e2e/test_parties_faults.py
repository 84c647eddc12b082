"""A run with three feature parties survives kill -9 of any party, party B included, and of
several at once, and ends bit-identical to an uninterrupted run (docs/PROTOCOL.md 12.7).

Every process is real: ``fedlite-b serve`` and three ``fedlite-a train --party`` processes,
each with its own columns of the bundled demo, its own token (issued with ``fedlite-b
parties tokens``), state directory and bottom model, one of them pipelined (K = 2). At
seeded random steps the test SIGKILLs one feature party, party B, and party B with two
feature parties at once, and near the end one party again (the finish meeting); each killed
process is simply started again. The run must end with every step applied once, party B's
top model and every party's bottom model equal bit for bit to those of the same run trained
without a kill, and the same held-out metrics (a joint evaluation by the three CLIs).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from party_a.store import LocalStore
from shared.demo_data import write_party_b_demo
from shared.training import state_from_bytes, state_sha256
from tests.utils.crash import integrity
from tests.utils.parties import feature_tables
from tests.utils.servers import ALICE, PartyBProcess

pytestmark = pytest.mark.timeout(1200)

PARTIES = {"left": (0, 7), "middle": (7, 14), "right": (14, 20)}
DEPTH = {"left": 1, "middle": 1, "right": 2}  # one party pipelines
STEPS = 60
TOML = """[run]
name = "{name}"
model = "tabular_mlp"
steps = {steps}
batch_size = 32
seed = 0
checkpoint_interval = 10
eval_fraction = 0.2
pipeline_depth = {depth}

[model.bottom]
hidden = [16]
cut_dim = 8

[model.top]
hidden = [32]

[quantizer]
mode = "pq"
q = 4
L = 4
lambda = 0.001

[optimizer.bottom]
name = "adam"
lr = 0.003

[optimizer.top]
name = "adam"
lr = 0.003
"""


def _spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "model": "tabular_mlp",
        "top": {"hidden": [32]},
        "parties": [
            {"name": p, "cut_dim": 8, "quantizer": {"mode": "pq", "q": 4, "L": 4}} for p in PARTIES
        ],
        "optimizer": {"name": "adam", "lr": 0.003},
        "batch_size": 32,
        "steps": STEPS,
        "seed": 0,
        "checkpoint_interval": 10,
        "eval_fraction": 0.2,
    }


class Run:
    """One run of three feature parties: its id, tokens, and each party's CLI process."""

    def __init__(self, party_b: PartyBProcess, root: Path, name: str) -> None:
        self.party_b, self.root, self.name = party_b, root / name, name
        self.root.mkdir(parents=True)
        self.tables = feature_tables(self.root, PARTIES)
        with httpx.Client(base_url=party_b.url, headers=_auth(ALICE), timeout=60) as owner:
            created = owner.post("/v1/runs", json=_spec(name))
        assert created.status_code == 201, created.text
        self.id = created.json()["id"]
        issued = subprocess.run(
            [sys.executable, "-m", "party_b.ops.cli", "parties", "tokens", "--run", self.id,
             "--out", str(self.root / "tokens"), "--data-dir", str(party_b.data_dir)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        files = json.loads(issued.stdout)["tokens"]
        self.tokens = {p: Path(files[p]).read_text().strip() for p in PARTIES}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _command(self, party: str, verb: str) -> list[str]:
        config = self.root / f"{party}.toml"
        config.write_text(TOML.format(name=self.name, steps=STEPS, depth=DEPTH[party]))
        command = [
            sys.executable, "-m", "party_a.cli", verb, "--server", self.party_b.url,
            "--features", str(self.tables[party]), "--config", str(config), "--party", party,
            "--state-dir", str(self.root / f"state-{party}"), "--retry-for", "240",
        ]  # fmt: skip
        if verb == "train":
            command += ["--no-evaluate", "--summary-json", str(self.root / f"{party}.json")]
        return command

    def start(self, party: str) -> None:
        log = open(self.root / f"{party}.log", "ab")  # noqa: SIM115 - the child's
        env = {**os.environ, "FEDLITE_A_TOKEN": self.tokens[party]}
        self.procs[party] = subprocess.Popen(
            self._command(party, "train"), stdout=log, stderr=subprocess.STDOUT, env=env
        )
        log.close()

    def kill(self, party: str) -> None:
        proc = self.procs[party]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        """Leave no process behind (a test that failed midway)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for party, proc in self.procs.items():
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert code == 0, (party, (self.root / f"{party}.log").read_text()[-3000:])

    def step(self) -> int:
        """Party B's applied step (-1 while party B is down)."""
        try:
            with httpx.Client(base_url=self.party_b.url, headers=_auth(ALICE), timeout=5) as c:
                return int(c.get(f"/v1/runs/{self.id}").json()["step"])
        except (httpx.HTTPError, KeyError, ValueError):
            return -1

    def evaluate(self) -> dict[str, Any]:
        """The three parties' joint evaluation (each CLI sends its part; one answer)."""
        procs = {
            party: subprocess.Popen(
                self._command(party, "evaluate"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, "FEDLITE_A_TOKEN": self.tokens[party]},
            )
            for party in PARTIES
        }
        answers = {}
        for party, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err.decode()[-2000:]
            answers[party] = json.loads(out)
        assert all(a == answers["left"] for a in answers.values()), answers
        return answers["left"]

    def bottoms(self) -> dict[str, str]:
        """Each party's final bottom model checksum, from its own state."""
        out = {}
        for party in PARTIES:
            store = LocalStore.in_directory(self.root / f"state-{party}")
            try:
                local = store.find_run(self.party_b.url, self.name)
                assert local is not None
                checkpoint = store.load_checkpoint(local.id)
                assert checkpoint is not None and checkpoint.step == STEPS
                out[party] = state_sha256(state_from_bytes(checkpoint.model_state))
            finally:
                store.close()
        return out

    def top(self) -> tuple[str, list[int]]:
        with httpx.Client(base_url=self.party_b.url, headers=_auth(ALICE), timeout=60) as c:
            run = c.get(f"/v1/runs/{self.id}").json()
            log = c.get(f"/v1/runs/{self.id}/steps", params={"limit": 10_000}).json()["steps"]
        assert run["status"] == "finished", run
        return run["model_sha256"], [row["step"] for row in log]


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_three_parties_killed_at_random_moments_end_bit_identical(tmp_path: Path) -> None:
    labels = write_party_b_demo(tmp_path / "labels.csv")
    # a killed run against an uninterrupted one, to the bit: no per-run randomized labels
    # (label DP draws them from each run's own secret)
    party_b = PartyBProcess(
        tmp_path / "b",
        labels,
        {"alice": ALICE},
        env={"FEDLITE_B_PARTY_WAIT_SECONDS": "4", "FEDLITE_B_PRIVACY": "off"},
    )
    party_b.start()
    runs: list[Run] = []
    try:
        reference = Run(party_b, tmp_path, "reference")
        runs.append(reference)
        for party in PARTIES:
            reference.start(party)
        reference.wait(600)
        expected_top, _log = reference.top()
        expected_bottoms = reference.bottoms()

        run = Run(party_b, tmp_path, "killed")
        runs.append(run)
        for party in PARTIES:
            run.start(party)
        rng = random.Random(24)
        names = list(PARTIES)
        events: list[list[str]] = [
            [rng.choice(names)],  # one feature party
            ["B"],  # party B
            ["B", *rng.sample(names, 2)],  # party B and two parties at once
            [rng.choice(names)],  # one party again, near the end (the finish meeting)
        ]
        kill_at = [*sorted(rng.sample(range(5, STEPS - 15), 3)), STEPS - rng.randint(1, 3)]
        for victims, at in zip(events, kill_at, strict=True):
            _until(lambda at=at: run.step() >= at, 300, f"step {at}")
            time.sleep(rng.uniform(0.0, 0.05))
            for victim in victims:
                if victim == "B":
                    party_b.kill9()
                else:
                    run.kill(victim)
            if "B" in victims:
                assert integrity(party_b.database) == "ok"
                party_b.start()
            for victim in victims:
                if victim != "B":
                    run.start(victim)
        run.wait(600)

        top, log = run.top()
        assert log == list(range(1, STEPS + 1))  # every step applied once
        assert top == expected_top
        assert run.bottoms() == expected_bottoms
        assert run.evaluate() == reference.evaluate()
    finally:
        for started in runs:
            started.stop()
        party_b.stop()
