"""Steps per second across a WAN: party A and party B in two network namespaces.

Party B is ``fedlite-b serve`` in namespace B; party A is the product's ``PartyATrainer`` over
``HttpTransport`` in namespace A, through ``benchmarks.wan.netproxy`` (RTT/2 each way) and a
veth pair shaped by tbf (``benchmarks.wan.netns``). For every scenario (bandwidth, RTT), task
and method it trains ``--steps`` steps and measures the steady rate after ``--warmup`` steps.

Methods: SplitFed (raw float32 both ways), FedLite (PQ uplink, float32 gradients: the paper's)
and FedLite with each downlink named by ``--downlink`` (``default``: the one a new run of the
product gets for the task's cut width, top-256 on FEMNIST and int4 on default_credit; any
other name is a representation of docs/PROTOCOL.md 4.2.1 set as ``[run] downlink``), each at
pipeline depth K = 1 and every ``--depths`` value. One checkpoint at the end, so the rate is
the steady pipelined one (a run with ``checkpoint_interval`` c refills K-1 steps every c).

    sudo python -m benchmarks.wan [--steps 40] [--warmup 8] [--downlink default]

Without root or iproute2 it writes the reason into the JSON and exits 0.

What pipelining costs in accuracy, the other side of its speed here, is
``python -m benchmarks.wan.staleness``'s (no network: party B in process); ``report`` renders
both into docs/PERFORMANCE.md.
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, versions, write_result
from benchmarks.wan import netns
from party_b.ops.launch import child_process

SCENARIOS = [(100.0, 10.0), (20.0, 40.0)]  # (Mbit/s, RTT ms)
PORT_B, PORT_PROXY = 8000, 9000
TOKEN = "wan-benchmark-token-0123456789"
# the sweeps' settings: FEMNIST q=1152 L=2 at its headline lambda, default_credit q=8 L=2
TASKS: dict[str, dict[str, Any]] = {
    "femnist": {
        "options": {"max_clients": 60},  # fewer ids to align; a step is the same
        "run": {"batch_size": 20, "lr_bottom": 0.1, "lr_top": 0.1, "optimizer": "sgd"},
        "pq": {"q": 1152, "L": 2, "lam": 2e-4},
    },
    "default_credit": {
        "options": {},
        "run": {"batch_size": 256, "lr_bottom": 0.003, "lr_top": 0.003, "optimizer": "adam"},
        "pq": {"q": 8, "L": 2, "lam": 1e-3},
    },
}


def methods(downlinks: list[str]) -> list[dict[str, Any]]:
    """name, experiments method and downlink (a name for ``_downlink``; none: float32)."""
    out: list[dict[str, Any]] = [
        {"name": "splitfed", "method": "splitfed"},
        {"name": "fedlite", "method": "fedlite"},
    ]
    for name in downlinks:
        out.append({"name": f"fedlite+{name}", "method": "fedlite", "downlink": name})
    return out


def _downlink(name: str | None, d: int) -> str:
    """A method's downlink on a cut layer of width ``d``: ``default`` is the one a new run of
    the product gets there (api_schemas.default_downlink: top-256 at FEMNIST's 9,216, int4 at
    default_credit's 32); no name is float32, the experiments' (and the paper's) downlink."""
    from api_schemas import default_downlink

    if name is None:
        return "float32"
    return default_downlink(d) if name == "default" else name


# ---------------------------------------------------------------------------- party A side


def _mark(marks: list[float], _result: object, _summary: object) -> None:
    marks.append(time.perf_counter())


def party_a(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Inside namespace A: train every run of ``spec`` against ``spec['url']``; one record
    per run with its steady steps/s and bytes per step."""
    import torch

    from experiments.runner import RunConfig
    from experiments.tasks import load_task
    from party_a.config import load_config
    from party_a.store import LocalStore
    from party_a.trainer import PartyATrainer
    from party_a.transport.http import HttpTransport
    from shared.models import cut_dim

    torch.set_num_threads(1)
    task_spec = TASKS[spec["task"]]
    task = load_task(spec["task"], **task_spec["options"])
    d = cut_dim(task.model, **task.bottom)
    state = Path(spec["state_dir"])
    records = []
    with HttpTransport(spec["url"], TOKEN, timeout=300) as transport:
        for run in spec["runs"]:
            pq = task_spec["pq"] if run["method"] == "fedlite" else {}
            config = RunConfig(
                task=spec["task"], method=run["method"], steps=spec["steps"],
                eval_fraction=0.1, **task_spec["run"], **pq,
            )  # fmt: skip
            overrides = {
                **config.party_a_config(task),
                "run.name": run["name"],
                "run.pipeline_depth": run["depth"],
                "run.downlink": _downlink(run.get("downlink"), d),
            }
            marks: list[float] = []  # perf_counter() at each applied step
            trainer = PartyATrainer(
                config=load_config(None, overrides),
                features=task.features,
                transport=transport,
                store=LocalStore.in_directory(state),
                server=spec["url"],
                on_step=functools.partial(_mark, marks),
            )
            trainer.prepare()
            summary = trainer.train()
            w = spec["warmup"]
            steady = (len(marks) - w) / (marks[-1] - marks[w - 1])
            records.append(
                {
                    **{k: run[k] for k in ("method_name", "depth", "name")},
                    "downlink": overrides["run.downlink"],
                    "steps": summary.last_step,
                    "steps_per_s": steady,
                    "seconds_per_step": 1.0 / steady,
                    "uplink_bytes_per_step": summary.bytes_sent / summary.last_step,
                    "downlink_bytes_per_step": summary.bytes_received / summary.last_step,
                    "resent": summary.resent,
                    "rollbacks": summary.rollbacks,
                    "last_loss": summary.last_loss,
                }
            )
            print(json.dumps(records[-1]), flush=True)
    return records


# ---------------------------------------------------------------------------- orchestration


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _wait_healthy(link: netns.Link, proc: subprocess.Popen[bytes], log: Path) -> None:
    probe = f"import httpx; httpx.get('http://{link.addr_b}:{PORT_B}/healthz', timeout=2)"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"party B exited: {log.read_text()[-2000:]}")
        ok = subprocess.run(netns.in_ns(link.ns_a, [sys.executable, "-c", probe]),
                            capture_output=True)  # fmt: skip
        if ok.returncode == 0:
            return
        time.sleep(1.0)
    raise RuntimeError(f"party B did not come up: {log.read_text()[-2000:]}")


def _task_runs(
    task: str, link: netns.Link, args: argparse.Namespace, work: Path
) -> list[dict[str, Any]]:
    from experiments.runner import EXPERIMENT_LIMITS
    from experiments.tasks import TASK_ENV
    from party_b.service import HOLD_SECONDS

    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        TASK_ENV: json.dumps({"task": task, "options": TASKS[task]["options"]}),
        "FEDLITE_B_LIMIT_MAX_BATCH": str(EXPERIMENT_LIMITS.max_batch),
        "FEDLITE_B_LIMIT_MAX_ALIGNED_IDS": str(EXPERIMENT_LIMITS.max_aligned_ids),
        # the hold of steps that overtake their predecessor (the default, named to be sure)
        "FEDLITE_B_STEP_HOLD_SECONDS": str(HOLD_SECONDS),
    }
    serve = _python(
        "party_b.ops.cli", "serve", "--host", link.addr_b, "--port", str(PORT_B),
        "--data-dir", str(work / f"b-{task}"), "--tokens", f"wan:{TOKEN}",
        "--label-source", "experiments.tasks:label_source_from_env",
        "--torch-threads", "1", "--log-level", "warning",
    )  # fmt: skip
    records: list[dict[str, Any]] = []
    log_b = work / f"party_b-{task}.log"
    with child_process(netns.in_ns(link.ns_b, serve), log_b, env=env, cwd=ROOT) as party_b:
        _wait_healthy(link, party_b, log_b)
        for mbit, rtt in args.scenarios:
            link.shape(mbit)
            label = f"{mbit:g}mbit-{rtt:g}ms"
            proxy = _python(
                "benchmarks.wan.netproxy", "--listen", f"127.0.0.1:{PORT_PROXY}",
                "--target", f"{link.addr_b}:{PORT_B}", "--delay-ms", str(rtt / 2),
            )  # fmt: skip
            runs = [
                {**m, "method_name": m["name"], "depth": k, "name": f"{label}-{m['name']}-K{k}"}
                for m in methods(args.downlink)
                for k in [1, *args.depths]
            ]
            spec = {
                "task": task, "url": f"http://127.0.0.1:{PORT_PROXY}", "runs": runs,
                "steps": args.steps, "warmup": args.warmup, "state_dir": str(work / f"a-{task}"),
            }  # fmt: skip
            spec_path, out_path = (
                work / f"spec-{task}-{label}.json",
                work / f"out-{task}-{label}.json",
            )
            spec_path.write_text(json.dumps(spec))
            with child_process(
                netns.in_ns(link.ns_a, proxy), work / f"proxy-{label}.log", env=env, cwd=ROOT
            ):
                time.sleep(1.0)
                command = _python("benchmarks.wan", "party-a", str(spec_path), str(out_path))
                done = subprocess.run(
                    netns.in_ns(link.ns_a, ["nice", "-n", "10", *command]),
                    env=env, cwd=ROOT, capture_output=True, text=True,
                )  # fmt: skip
                if done.returncode != 0:
                    raise RuntimeError(f"party A failed ({task}, {label}): {done.stderr[-3000:]}")
            for record in json.loads(out_path.read_text()):
                records.append({"task": task, "mbit": mbit, "rtt_ms": rtt, **record})
                print(json.dumps(records[-1]), flush=True)
    return records


def _speedups(records: list[dict[str, Any]]) -> None:
    """Each record's steps/s over SplitFed's at K = 1 in the same task and scenario."""
    for r in records:
        base = [
            b["steps_per_s"] for b in records
            if (b["task"], b["mbit"], b["rtt_ms"]) == (r["task"], r["mbit"], r["rtt_ms"])
            and b["method_name"] == "splitfed" and b["depth"] == 1
        ]  # fmt: skip
        r["vs_splitfed_k1"] = r["steps_per_s"] / base[0] if base else None


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.wan", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command")
    inner = sub.add_parser("party-a", help="(internal) party A's runs inside namespace A")
    inner.add_argument("spec", type=Path)
    inner.add_argument("out", type=Path)
    parser.add_argument("--tasks", default="femnist,default_credit")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--depths", default="4", help="pipeline depths K > 1, comma-separated")
    parser.add_argument(
        "--downlink",
        action="append",
        help="FedLite's downlink besides float32: a representation (docs/PROTOCOL.md 4.2.1) "
        "or 'default', the product's default for the task's cut width (the default)",
    )
    parser.add_argument("--scenario", action="append", help="MBIT:RTT_MS (default 100:10, 20:40)")
    args = parser.parse_args()
    if args.command == "party-a":
        args.out.write_text(json.dumps(party_a(json.loads(args.spec.read_text()))))
        return
    args.depths = [int(k) for k in args.depths.split(",") if k]
    args.downlink = args.downlink or ["default"]
    args.scenarios = (
        [tuple(float(v) for v in s.split(":")) for s in args.scenario]
        if args.scenario
        else SCENARIOS
    )
    payload: dict[str, Any] = {
        "versions": versions("torch", "httpx", "uvicorn"),
        "settings": {k: v for k, v in vars(args).items() if k != "command"},
        "latency": (
            "user-space proxy, RTT/2 each way (benchmarks.wan.netproxy); tbf on both veth ends"
        ),
        "code": subprocess.run(
            ["git", "log", "-1", "--format=%H %s"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
    }
    reason = netns.unavailable()
    if reason is not None:
        print(f"skipped: {reason}")
        write_result("wan", {**payload, "skipped": reason, "runs": []})
        return
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedlite-wan-") as tmp, netns.link() as link:
        for task in args.tasks.split(","):
            records += _task_runs(task, link, args, Path(tmp))
    _speedups(records)
    print(f"wrote {write_result('wan', {**payload, 'runs': records})}")


if __name__ == "__main__":
    main()
