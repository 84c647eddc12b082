"""Failover: party B replicas behind HAProxy on one PostgreSQL, several runs training at once,
and the replica serving a run SIGKILLed at random moments.

    python -m benchmarks.scale.failover [--replicas 3] [--runs 4] [--kills 12] [--steps 1500]

The stack is ``party_b.ops.stack`` (PostgreSQL, ``--replicas`` ``fedlite-b serve`` processes,
HAProxy routing by run id; a killed replica is started again after a second, as a
supervisor would). Each run is a real ``PartyATrainer`` over HTTP through HAProxy (the
bundled breast-cancer demo data, two steps in flight, a checkpoint every 10 steps), all in
threads of this process. While they train, the benchmark repeatedly waits a random 0.3-2 s,
picks a random run that is still training, looks up in PostgreSQL which replica holds its
lease -- the one serving it -- and kill -9's that replica; it then waits until the run has
applied a step again (recovery) and until it is past the step it had reached (caught up).
A kill happens only while every replica is up, so each one measures a failover to a live
replica, not the wait for a restart. Recovery is the time from the kill to the first step
party A has answered after another replica claimed the run's lease (so an answer the dying
replica sent just before it died does not count); caught up, to the first such step past
the one the run had reached at the kill (the rollback's replay included).

Every run is compared with the same run trained uninterrupted on a single party B (in
process, SQLite): party A's bottom model, party B's top model (checksums) and the final
evaluation must be identical; party B's step log (PostgreSQL) and party A's must hold every
step 1..N exactly once. Writes ``benchmarks/results/failover.json`` and the table between the
failover markers of docs/RELIABILITY.md (``--report`` re-renders it from the JSON).
"""

import argparse
import json
import logging
import os
import random
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import func, select

from benchmarks.common import RESULTS, ROOT, versions, write_result
from party_a.config import PartyAConfig, load_config
from party_a.errors import problem_from_body
from party_a.features import load_features
from party_a.store import LocalStore
from party_a.trainer import PartyATrainer, TrainSummary
from party_a.transport.http import HttpTransport
from party_b import store
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.labels import load_label_table
from party_b.ops.stack import LocalStack
from shared.demo_data import write_party_a_demo, write_party_b_demo
from shared.training import state_sha256

TOKEN = "failover-token-0123456789"
DOC = ROOT / "docs" / "RELIABILITY.md"
BEGIN, END = "<!-- BEGIN GENERATED failover -->", "<!-- END GENERATED failover -->"


def run_config(name: str, seed: int, steps: int) -> PartyAConfig:
    """The demo's run (breast cancer, tabular MLP, FedLite q=8 L=4) with K=2 steps in flight."""
    return load_config(
        None,
        {
            "run.name": name,
            "run.model": "tabular_mlp",
            "run.steps": steps,
            "run.batch_size": 32,
            "run.seed": seed,
            "run.checkpoint_interval": 10,
            "run.eval_fraction": 0.2,
            "run.pipeline_depth": 2,
            "model.bottom": {"hidden": [64], "cut_dim": 32},
            "model.top": {"hidden": [32]},
            "quantizer.mode": "pq",
            "quantizer.q": 8,
            "quantizer.L": 4,
            "quantizer.lambda": 0.001,
            "optimizer.bottom": {"name": "adam", "lr": 0.003},
            "optimizer.top": {"name": "adam", "lr": 0.003},
        },
    )


def _features(path: Path) -> Any:
    return load_features(path, id_column="id", feature_columns=None, standardize=True)


def reference(work: Path, features: Path, labels: Path, seed: int, steps: int) -> dict[str, Any]:
    """The run trained uninterrupted on one party B in this process (SQLite)."""
    label_source = load_label_table(labels, id_column="id", label_column="y", feature_columns=None)
    work.mkdir(parents=True, exist_ok=True)
    service, caller = in_process_party_b(label_source, work / "party_b.sqlite")
    trainer = PartyATrainer(
        config=run_config(f"run-{seed}", seed, steps),
        features=_features(features),
        transport=InProcessTransport(service, caller, problem=problem_from_body),
        store=LocalStore.in_directory(work / "a"),
        server="in-process",
    )
    try:
        trainer.prepare()
        trainer.train()
        answer = trainer.evaluate()
        return {
            "bottom_sha256": state_sha256(trainer.bottom.model.state_dict()),
            "top_sha256": service.runs.get(caller, trainer.run_id).model_sha256,
            "eval": [answer.loss, answer.metrics],
        }
    finally:
        trainer.close()


@dataclass
class Watched:
    """One run training through the load balancer in a thread, with its step times."""

    seed: int
    trainer: PartyATrainer
    events: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, step)
    result: dict[str, Any] = field(default_factory=dict)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.trainer.on_step = lambda r, _s: self.events.append((time.monotonic(), r.step))

        def train() -> None:
            try:
                self.result["summary"] = self.trainer.train()
            except Exception as exc:  # reported in the results
                self.result["error"] = repr(exc)

        self.thread = threading.Thread(target=train, name=f"run-{self.seed}", daemon=True)
        self.thread.start()

    @property
    def training(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def reached(self) -> int:
        return max((s for _, s in self.events), default=0)


def _lease(sessions: Any, run_id: str) -> tuple[str | None, int]:
    """(holder, fencing token) of the run's lease."""
    with sessions() as session:
        lease = store.lease_of(session, run_id)
    return (None, 0) if lease is None else lease


def _all_up(stack: LocalStack) -> bool:
    """Every replica's process running and answering its health check."""
    for replica in stack.members.values():
        if not replica.alive():
            return False
        try:
            if httpx.get(f"{replica.url}/healthz", timeout=1).status_code != 200:
                return False
        except httpx.HTTPError:
            return False
    return True


def _wait(condition: Any, timeout: float) -> float | None:
    """Seconds until ``condition()`` holds, or None after ``timeout``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            return None
        time.sleep(0.01)
    return time.monotonic() - start


def kill_loop(
    stack: LocalStack,
    sessions: Any,
    runs: list[Watched],
    kills: int,
    steps: int,
    rng: random.Random,
) -> list[dict[str, Any]]:
    """Kill the replica serving a random training run, ``kills`` times."""
    done: list[dict[str, Any]] = []
    while len(done) < kills and any(w.training for w in runs):
        time.sleep(rng.uniform(0.3, 2.0))
        candidates = [w for w in runs if w.training and w.reached() < steps - 20]
        if not candidates:
            break
        if not _all_up(stack):
            continue
        watched = rng.choice(candidates)
        run_id = watched.trainer.run_id
        holder, token = _lease(sessions, run_id)
        if holder is None:
            continue
        reached, killed_at = watched.reached(), time.monotonic()
        wall = datetime.now().isoformat(sep=" ", timespec="milliseconds")  # to match the logs
        stack.kill9(holder)
        # recovered: another replica claimed the run, and party A got a step answered after
        # that (an answer the killed replica had sent before it died does not count)
        claimed = _wait(lambda r=run_id, t=token: _lease(sessions, r)[1] > t, 300)
        t_claim = time.monotonic()
        _wait(
            lambda w=watched, a=t_claim, r=reached: any(e > a and s > r for e, s in w.events),
            300,
        )
        after = [(e, s) for e, s in list(watched.events) if e > t_claim]
        first = min((e for e, _ in after), default=None)
        caught = min((e for e, s in after if s > reached), default=None)
        done.append(
            {
                "run": watched.seed,
                "killed_at": wall,
                "replica": holder,
                "at_step": reached,
                "claimed_s": claimed,
                "recovery_s": None if first is None else first - killed_at,
                "caught_up_s": None if caught is None else caught - killed_at,
                "taken_over_by": _lease(sessions, run_id)[0],
            }
        )
        print(f"kill {len(done)}: {done[-1]}", flush=True)
    return done


def check_run(w: Watched, expected: dict[str, Any], sessions: Any, steps: int) -> dict[str, Any]:
    """The run against its uninterrupted reference, and both step logs."""
    trainer = w.trainer
    answer = trainer.evaluate()
    with HttpTransport(trainer.server, TOKEN) as transport:
        top = transport.get_run(trainer.run_id).model_sha256
    with sessions() as session:
        rows = session.execute(
            select(func.count(), func.count(store.StepLog.step.distinct())).where(
                store.StepLog.run_id == trainer.run_id
            )
        ).one()
        logged = set(
            session.scalars(
                select(store.StepLog.step).where(store.StepLog.run_id == trainer.run_id)
            )
        )
    assert trainer.local is not None
    local = [s.step for s in trainer.store.steps(trainer.local.id)]
    summary: TrainSummary | None = w.result.get("summary")
    identical = (
        state_sha256(trainer.bottom.model.state_dict()) == expected["bottom_sha256"]
        and top == expected["top_sha256"]
        and [answer.loss, answer.metrics] == expected["eval"]
    )
    return {
        "seed": w.seed,
        "error": w.result.get("error"),
        "last_step": summary.last_step if summary else None,
        "rollbacks": summary.rollbacks if summary else None,
        "bit_identical": identical,
        "lost_steps": len(set(range(1, steps + 1)) - logged) + (steps - len(set(local))),
        "double_steps": (rows[0] - rows[1]) + (len(local) - len(set(local))),
        "stray_steps": len(logged - set(range(1, steps + 1))),
    }


def _quantile(values: list[float], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    features = write_party_a_demo(work / "party_a.csv")
    labels = write_party_b_demo(work / "party_b.csv")
    seeds = list(range(args.runs))
    print("training the references (one party B, no kills)", flush=True)
    expected = {s: reference(work / f"ref-{s}", features, labels, s, args.steps) for s in seeds}
    rng = random.Random(args.seed)
    with LocalStack(
        work / "stack",
        labels,
        f"bench:{TOKEN}",
        replicas=args.replicas,
        database_url=args.database_url,
        restart_after=1.0,
        # every run is compared to the bit with its reference: no label DP, whose randomized
        # labels come from each run's own secret (the demo's data is public)
        extra_args=["--log-level", args.replica_log_level, "--privacy", "off"],
    ) as stack:
        assert stack.database_url is not None
        engine = store.make_engine(stack.database_url)
        sessions = store.make_session_factory(engine)
        runs = [
            Watched(
                seed,
                PartyATrainer(
                    config=run_config(f"run-{seed}", seed, args.steps),
                    features=_features(features),
                    transport=HttpTransport(stack.url, TOKEN, retry_for=300, timeout=60),
                    store=LocalStore.in_directory(work / f"a-{seed}"),
                    server=stack.url,
                ),
            )
            for seed in seeds
        ]
        for watched in runs:
            watched.trainer.prepare()
        started = time.monotonic()
        for watched in runs:
            watched.start()
        kills = kill_loop(stack, sessions, runs, args.kills, args.steps, rng)
        for watched in runs:
            assert watched.thread is not None
            watched.thread.join(600)
        seconds = time.monotonic() - started
        checked = [check_run(w, expected[w.seed], sessions, args.steps) for w in runs]
        for watched in runs:
            watched.trainer.close()
        engine.dispose()
        logs = "".join(
            (stack.state_dir / f"{name}.log").read_text(errors="replace") for name in stack.members
        )
        restarts = {name: r.starts - 1 for name, r in stack.members.items()}
    recovery = [k["recovery_s"] for k in kills if k["recovery_s"] is not None]
    caught_up = [k["caught_up_s"] for k in kills if k["caught_up_s"] is not None]
    return {
        "replicas": args.replicas,
        "runs": args.runs,
        "steps": args.steps,
        "seed": args.seed,
        "kills": len(kills),
        "bit_identical": all(c["bit_identical"] for c in checked) and len(checked) == args.runs,
        "lost_steps": sum(c["lost_steps"] for c in checked),
        "double_steps": sum(c["double_steps"] for c in checked),
        "recovery_s": {"p50": _quantile(recovery, 0.5), "p99": _quantile(recovery, 0.99),
                       "max": max(recovery, default=None), "n": len(recovery)},
        "caught_up_s": {"p50": _quantile(caught_up, 0.5), "p99": _quantile(caught_up, 0.99),
                        "max": max(caught_up, default=None)},
        "fenced_commits": logs.count("was taken over by another holder"),
        "replica_restarts": restarts,
        "training_seconds": seconds,
        "kill_log": kills,
        "per_run": checked,
    }  # fmt: skip


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def table(doc: dict[str, Any]) -> list[str]:
    rec, cau = doc["recovery_s"], doc["caught_up_s"]
    rollbacks = sum(r["rollbacks"] or 0 for r in doc["per_run"])
    return [
        f"*{doc['when']}, {doc['machine']['cpus']} CPUs ({doc['machine']['cpu']}), load "
        f"average {doc['loadavg_before'][0]:.1f} → {doc['loadavg_after'][0]:.1f}; "
        f"`{doc['command']}`*",
        "",
        "| replicas | runs × steps | kill -9 | bit-identical | lost steps | doubled steps "
        "| recovery p50 / p99 / max (s) | caught up p50 / p99 (s) | fenced commits "
        "| party A rollbacks |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {doc['replicas']} | {doc['runs']} × {doc['steps']} | {doc['kills']} "
        f"| {'yes, every run' if doc['bit_identical'] else 'NO'} | {doc['lost_steps']} "
        f"| {doc['double_steps']} | {_s(rec['p50'])} / {_s(rec['p99'])} / {_s(rec['max'])} "
        f"| {_s(cau['p50'])} / {_s(cau['p99'])} | {doc['fenced_commits']} | {rollbacks} |",
    ]


def render(doc: dict[str, Any]) -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + BEGIN + "\n" + "\n".join(table(doc)) + "\n" + END + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--steps", type=int, default=1500, help="steps of each run")
    parser.add_argument("--seed", type=int, default=0, help="of the kill schedule")
    parser.add_argument("--database-url", help="a running PostgreSQL (default: start one)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", action="store_true", help="re-render the doc's table only")
    parser.add_argument(
        "--keep-logs", type=Path, help="copy the replicas', HAProxy's and party A's logs here"
    )
    parser.add_argument("--replica-log-level", default="warning", help="e.g. info")
    args = parser.parse_args()
    if args.report:
        render(json.loads((args.out or RESULTS / "failover.json").read_text()))
        return
    import torch

    torch.set_num_threads(1)  # party A's threads share the machine with the stack
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fedlite-failover-") as tmp:
        if args.keep_logs:  # party A's own lines, with times to set against the replicas'
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            logging.basicConfig(
                filename=args.keep_logs / "party_a.log",
                format="%(asctime)s %(name)s %(message)s",
                level=logging.INFO,
            )
        result = measure(args, Path(tmp))
        if args.keep_logs:
            for log in (Path(tmp) / "stack").glob("*.log"):
                shutil.copyfile(log, args.keep_logs / log.name)
    payload = {
        "versions": versions("torch", "sqlalchemy", "psycopg"),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        **result,
    }
    path = write_result("failover", payload, args.out)
    print(json.dumps({k: v for k, v in result.items() if k not in ("kill_log", "per_run")}))
    render(json.loads(path.read_text()))
    print(f"wrote {path} and {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
