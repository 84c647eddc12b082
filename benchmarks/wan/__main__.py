"""Steps per second across a WAN: party A and party B in two network namespaces.

Party B is ``fedlite-b serve`` in namespace B; party A is the product's ``PartyATrainer`` over
``HttpTransport`` in namespace A, through ``benchmarks.wan.netproxy`` (RTT/2 each way) and a
veth pair shaped by tbf (``benchmarks.wan.netns``). For every scenario (bandwidth, RTT), task
and method it trains ``--steps`` steps and measures the steady rate after ``--warmup`` steps,
``--repeats`` times, the repeats interleaved. Each run also keeps the CPU seconds per step of
party A, party B and the proxy, the bytes the link carried and the largest gap between two
applied steps: ``report`` puts each point's spread beside its nearer bound (link or CPU).

Methods: SplitFed (raw float32 both ways), FedLite (PQ uplink, float32 gradients: the paper's)
and FedLite with each downlink named by ``--downlink`` (``default``: the one a new run of the
product gets for the task's cut width, top-256 on FEMNIST and int4 on default_credit; any
other name is a representation of docs/PROTOCOL.md 4.2.1 set as ``[run] downlink``), each at
pipeline depth K = 1 and every ``--depths`` value. One checkpoint at the end, so the rate is
the steady pipelined one (a run with ``checkpoint_interval`` c refills K-1 steps every c).

    sudo python -m benchmarks.wan [--steps 60] [--warmup 10] [--repeats 3] [--downlink default]
    sudo python -m benchmarks.wan --tasks femnist --scenario 20:40 --methods fedlite+default

Without root or iproute2 it writes the reason into the JSON and exits 0.

What pipelining costs in accuracy, the other side of its speed here, is
``python -m benchmarks.wan.staleness``'s (no network: party B in process); ``report`` renders
both into docs/PERFORMANCE.md.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
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


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wire_bytes(dev: str) -> tuple[int, int]:
    """Bytes this namespace's end of the link has sent and received (its sysfs counters:
    everything on the wire, headers of HTTP, TCP and IP included)."""
    stats = Path("/sys/class/net") / dev / "statistics"
    return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())


@dataclass
class Marks:
    """Per applied step: when (perf_counter), the CPU seconds every process of the setup had
    spent by then (party A, party B, the latency proxy) and the link's byte counters."""

    pids: dict[str, int]  # party A's own is read in-process
    dev: str
    when: list[float] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)
    wire: list[tuple[int, int]] = field(default_factory=list)

    def __call__(self, _result: object, _summary: object) -> None:
        self.when.append(time.perf_counter())
        cpu = {"party_a": time.process_time()}
        cpu.update({name: _cpu_seconds(pid) for name, pid in self.pids.items()})
        self.cpu.append(cpu)
        self.wire.append(_wire_bytes(self.dev))

    def steady(self, warmup: int) -> dict[str, Any]:
        """The window after ``warmup`` steps: steps/s, the largest gap between two steps
        against the median gap, CPU seconds per step of each process, wire bytes per step."""
        w, last = warmup - 1, len(self.when) - 1
        steps = last - w
        gaps = [b - a for a, b in zip(self.when[w:-1], self.when[w + 1 :], strict=True)]
        cpu = {k: (self.cpu[last][k] - self.cpu[w][k]) / steps for k in self.cpu[w]}
        return {
            "steps_per_s": steps / (self.when[last] - self.when[w]),
            "max_gap_ms": 1000 * max(gaps),
            "median_gap_ms": 1000 * statistics.median(gaps),
            "cpu_s_per_step": cpu,
            "wire_up_bytes_per_step": (self.wire[last][0] - self.wire[w][0]) / steps,
            "wire_down_bytes_per_step": (self.wire[last][1] - self.wire[w][1]) / steps,
        }


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
            marks = Marks(spec["pids"], spec["dev"])
            trainer = PartyATrainer(
                config=load_config(None, overrides),
                features=task.features,
                transport=transport,
                store=LocalStore.in_directory(state),
                server=spec["url"],
                on_step=marks,
            )
            trainer.prepare()
            summary = trainer.train()
            steady = marks.steady(spec["warmup"])
            records.append(
                {
                    **{k: run[k] for k in ("method_name", "depth", "name", "repeat")},
                    "downlink": overrides["run.downlink"],
                    "steps": summary.last_step,
                    **steady,
                    "seconds_per_step": 1.0 / steady["steps_per_s"],
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
        _wait_healthy(link, party_b, log_b)  # (ip netns exec execs: the pid is party B's)
        for mbit, rtt in args.scenarios:
            link.shape(mbit)
            label = f"{mbit:g}mbit-{rtt:g}ms"
            proxy = _python(
                "benchmarks.wan.netproxy", "--listen", f"127.0.0.1:{PORT_PROXY}",
                "--target", f"{link.addr_b}:{PORT_B}", "--delay-ms", str(rtt / 2),
            )  # fmt: skip
            # every method and depth once per repeat, repeats interleaved (A B A B): each
            # point's spread is over the same stretch of the machine's noise
            runs = [
                {
                    **m, "method_name": m["name"], "depth": k, "repeat": rep,
                    "name": f"{label}-{m['name']}-K{k}-r{rep}",
                }
                for rep in range(args.repeats)
                for m in methods(args.downlink)
                if args.methods is None or m["name"] in args.methods
                for k in [1, *args.depths]
            ]  # fmt: skip
            spec_path, out_path = (
                work / f"spec-{task}-{label}.json",
                work / f"out-{task}-{label}.json",
            )
            with child_process(
                netns.in_ns(link.ns_a, proxy), work / f"proxy-{label}.log", env=env, cwd=ROOT
            ) as proxy_process:
                spec = {
                    "task": task, "url": f"http://127.0.0.1:{PORT_PROXY}", "runs": runs,
                    "steps": args.steps, "warmup": args.warmup,
                    "state_dir": str(work / f"a-{task}"),
                    "pids": {"party_b": party_b.pid, "proxy": proxy_process.pid},
                    "dev": link.dev_a,
                }  # fmt: skip
                spec_path.write_text(json.dumps(spec))
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
    parser.add_argument("--out", type=Path, help="default benchmarks/results/wan.json")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of every point, interleaved (default 3)"
    )
    parser.add_argument("--depths", default="4", help="pipeline depths K > 1, comma-separated")
    parser.add_argument(
        "--downlink",
        action="append",
        help="FedLite's downlink besides float32: a representation (docs/PROTOCOL.md 4.2.1) "
        "or 'default', the product's default for the task's cut width (the default)",
    )
    parser.add_argument("--scenario", action="append", help="MBIT:RTT_MS (default 100:10, 20:40)")
    parser.add_argument(
        "--methods", help="only these methods, comma-separated (e.g. fedlite+default)"
    )
    args = parser.parse_args()
    if args.command == "party-a":
        args.out.write_text(json.dumps(party_a(json.loads(args.spec.read_text()))))
        return
    args.depths = [int(k) for k in args.depths.split(",") if k]
    args.methods = args.methods.split(",") if args.methods else None
    args.downlink = args.downlink or ["default"]
    args.scenarios = (
        [tuple(float(v) for v in s.split(":")) for s in args.scenario]
        if args.scenario
        else SCENARIOS
    )
    payload: dict[str, Any] = {
        "versions": versions("torch", "httpx", "uvicorn"),
        "settings": {k: v for k, v in vars(args).items() if k not in ("command", "out")},
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
        write_result("wan", {**payload, "skipped": reason, "runs": []}, args.out)
        return
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedlite-wan-") as tmp, netns.link() as link:
        for task in args.tasks.split(","):
            records += _task_runs(task, link, args, Path(tmp))
    _speedups(records)
    print(f"wrote {write_result('wan', {**payload, 'runs': records}, args.out)}")


if __name__ == "__main__":
    main()
