"""One training step at the FEMNIST shape, broken down, in process and over HTTP.

Party A here is the product's ``BottomTrainer`` (FEMNIST CNN bottom, B=20, d=9216) on real
FEMNIST images; party B is the product's ``Service``, called directly (in process, through
``party_b.inprocess.InProcessTransport``) or behind ``fedlite-b serve`` on 127.0.0.1 (over
HTTP, ``HttpTransport``). Four sessions train side by side, interleaved in blocks of steps
so that they share the noise of a shared machine: {FedLite q=1152 L=2, SplitFed raw} x
{in process, HTTP}.

Per step, party A times: bottom forward, quantize (k-means + the z~ it will correct
against), encode request, round trip, decode response, gradient correction, bottom
backward + SGD. Party B's step log gives decode + dequantize, top forward/backward/update
and the rest (encoding the gradient) of each step. The HTTP overhead is the round trip over
HTTP minus the round trip in process; the codec's share is measured on the same messages.

    python -m benchmarks.step [--steps 150] [--block 10]
"""

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from api_schemas import RunCreate
from benchmarks.common import (
    SHARED_DATA,
    TOKEN,
    party_b_server,
    summary_ms,
    timed,
    versions,
    write_result,
)
from party_a.bottom import BottomTrainer
from party_a.errors import problem_from_body
from party_a.transport import Transport
from party_a.transport.http import HttpTransport
from party_b.inprocess import InProcessTransport, in_process_party_b
from party_b.labels import load_label_table
from shared import codec
from shared.alignment import hmac_ids
from shared.correction import correct_gradient
from shared.models import seed_dropout
from shared.pq import GroupedProductQuantizer, PQConfig
from shared.schedule import batch_digest, batch_positions, split_train_eval, step_seed

A_PARTS = ["bottom_fwd", "quantize", "encode_request", "round_trip", "decode_response",
           "correction", "bottom_bwd_opt"]  # fmt: skip


def femnist(n: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """ids, images (n, 1, 28, 28) float32 in [0, 1], labels (n,) of real FEMNIST samples."""
    path = SHARED_DATA / "femnist_leaf_subset" / "femnist_leaf_subset_uint8.npz"
    if path.exists():
        with np.load(path) as data:
            x = data["x_train"][:n].astype(np.float32) / 255.0
            y = data["y_train"][:n].astype(np.int64)
    else:  # digits as a stand-in, upsampled to 28x28
        from sklearn.datasets import load_digits

        digits = load_digits()
        t = torch.from_numpy(digits.images[:n].astype(np.float32) / 16.0).unsqueeze(1)
        x = torch.nn.functional.interpolate(t, size=(28, 28), mode="bilinear").numpy()[:, 0]
        y = digits.target[:n].astype(np.int64)
    ids = [f"f{i:05d}" for i in range(len(x))]
    return ids, x[:, None], y


@dataclass
class Session:
    """One run seen from party A: its transport, bottom trainer and per-step timings."""

    name: str
    transport: Transport
    spec: RunCreate
    bottom: BottomTrainer
    run_id: str = ""
    aligned: list[bytes] = field(default_factory=list)
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    train_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    step: int = 0
    times: dict[str, list[float]] = field(default_factory=dict)
    last: dict[str, bytes] = field(default_factory=dict)
    quantizer: GroupedProductQuantizer | None = None  # None for SplitFed (raw)

    def prepare(self, ids: list[str]) -> None:
        run = self.transport.create_run(self.spec)
        self.run_id = run.id
        keys = hmac_ids(bytes.fromhex(run.alignment_key), ids)
        answer = self.transport.align(run.id, [k.hex() for k in keys])
        self.aligned = [bytes.fromhex(h) for h in answer.intersection]
        row_of = {k: i for i, k in enumerate(keys)}
        self.rows = np.array([row_of[k] for k in self.aligned], dtype=np.int64)
        self.train_pos, _ = split_train_eval(len(self.aligned), seed=0, eval_fraction=0.2)

    def train_step(self, images: np.ndarray, *, record: bool) -> None:
        """One step as ``BottomTrainer.request`` / ``apply`` do it, from the same public parts
        (``shared.pq.quantizer``, ``shared.codec``, ``shared.correction``), with a timer around
        each; the first step checks that its request is byte-identical to ``request``'s."""
        t = self.step + 1
        positions = self.train_pos[
            batch_positions(t, batch_size=self.spec.batch_size, n=len(self.train_pos), seed=0)
        ]
        digest = batch_digest([self.aligned[p] for p in positions])
        x = images[self.rows[positions]]
        bottom = self.bottom
        expected = bottom.request(t, x, digest).body if t == 1 else None
        marks = [time.perf_counter()]
        bottom.model.train()
        seed_dropout(bottom.model, step_seed(bottom.seed, t, "dropout-bottom"))
        z = bottom.model(torch.from_numpy(np.ascontiguousarray(x)).float())
        marks.append(time.perf_counter())
        chunks, z_tilde = self.compress(z.detach(), t)
        marks.append(time.perf_counter())
        body = codec.encode_step_request(
            codec.StepRequest(step=t, batch_digest=digest, chunks=chunks)
        )
        marks.append(time.perf_counter())
        if expected is not None and body != expected:
            raise AssertionError("the timed step is not the product's: request bytes differ")
        response = self.transport.step(self.run_id, body)
        marks.append(time.perf_counter())
        answer = codec.decode_step_response(response)
        marks.append(time.perf_counter())
        grad = correct_gradient(torch.from_numpy(answer.grad), z, z_tilde, 1e-4)
        marks.append(time.perf_counter())
        bottom.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(z, grad)
        bottom.optimizer.step()
        marks.append(time.perf_counter())
        self.step = t
        self.last = {"request": body, "response": response}
        if record:
            for part, start, stop in zip(A_PARTS, marks[:-1], marks[1:], strict=True):
                self.times.setdefault(part, []).append(stop - start)
            self.times.setdefault("total", []).append(marks[-1] - marks[0])

    def compress(self, z: torch.Tensor, step: int) -> tuple[tuple[codec.Activations], torch.Tensor]:
        """One chunk for the wire and the z~ party B rebuilds from it (as BottomTrainer)."""
        if self.quantizer is None:
            return (codec.RawActivations(z.numpy()),), z
        code = self.quantizer.encode(z, seed=step_seed(self.bottom.seed, step, "kmeans-0"))
        chunk = codec.PQActivations(code.codebook.numpy(), code.codewords.numpy())
        return (chunk,), self.quantizer.decode(code)


def spec(mode: str) -> RunCreate:
    quantizer: dict[str, Any] = (
        {"mode": "pq", "q": 1152, "L": 2, "R": 1} if mode == "fedlite" else {"mode": "raw"}
    )
    return RunCreate.model_validate(
        {
            "name": f"step-{mode}",
            "model": "femnist_cnn",
            "cut_dim": 9216,
            "quantizer": quantizer,
            "optimizer": {"name": "sgd", "lr": 0.01},
            "batch_size": 20,
            "steps": 100_000,
            "seed": 0,
            "checkpoint_interval": 50,
            "eval_fraction": 0.2,
            "use_side_features": False,
        }
    )


def bottom_for(mode: str) -> BottomTrainer:
    quantizer: dict[str, Any] = (
        {"mode": "pq", "q": 1152, "L": 2, "R": 1, "lambda": 1e-4}
        if mode == "fedlite"
        else {"mode": "raw"}
    )
    return BottomTrainer(
        model="femnist_cnn",
        bottom_kwargs={},
        quantizer=quantizer,
        optimizer={"name": "sgd", "lr": 0.01},
        seed=0,
    )


def quantizer_for(mode: str) -> GroupedProductQuantizer | None:
    """The quantizer ``bottom_for(mode)`` builds for d=9216 (BottomTrainer's defaults)."""
    if mode != "fedlite":
        return None
    return GroupedProductQuantizer(9216, PQConfig(q=1152, L=2, R=1, iterations=10))


def party_b_parts(session: Session) -> dict[str, Any]:
    """Party B's side of the recorded steps, from its step log (medians, ms)."""
    log = session.transport.step_log(session.run_id)  # type: ignore[attr-defined]
    log = [row for row in log if row["step"] > session.step - len(session.times["total"])]
    decode = [row["decode_ms"] for row in log]
    compute = [row["compute_ms"] for row in log]
    rest = [row["total_ms"] - row["decode_ms"] - row["compute_ms"] for row in log]
    return {
        "decode_dequantize_ms": statistics.median(decode),
        "top_fwd_bwd_opt_ms": statistics.median(compute),
        "encode_response_and_checks_ms": statistics.median(rest),
        "service_total_ms": statistics.median(row["total_ms"] for row in log),
    }


def codec_parts(session: Session, repeats: int) -> dict[str, float]:
    """The four codec calls of one step, timed on this session's last messages (ms)."""
    request, response = session.last["request"], session.last["response"]
    decoded_request = codec.decode_step_request(request)
    decoded_response = codec.decode_step_response(response)

    def med(fn: Any) -> float:
        return float(summary_ms(timed(fn, repeats, warmup=3))["median_ms"])

    return {
        "encode_request_ms": med(lambda: codec.encode_step_request(decoded_request)),
        "decode_request_ms": med(lambda: codec.decode_step_request(request)),
        "encode_response_ms": med(lambda: codec.encode_step_response(decoded_response)),
        "decode_response_ms": med(lambda: codec.decode_step_response(response)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="recorded steps per session")
    parser.add_argument("--warmup", type=int, default=20, help="unrecorded steps first")
    parser.add_argument("--block", type=int, default=10, help="steps per session per turn")
    parser.add_argument("--no-malloc-tuning", action="store_true", help="for party B")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    load_before = os.getloadavg()
    ids, images, labels = femnist(3000)
    with tempfile.TemporaryDirectory(prefix="fedlite-step-") as tmp:
        work = Path(tmp)
        table = work / "labels.csv"
        with table.open("w") as f:
            f.write("id,y\n" + "".join(f"{i},{y}\n" for i, y in zip(ids, labels, strict=True)))
        source = load_label_table(table, id_column="id", label_column="y", feature_columns=None)
        service, caller = in_process_party_b(source, work / "inprocess.sqlite")
        tuning = not args.no_malloc_tuning
        with party_b_server(work / "party_b", table, malloc_tuning=tuning) as url:
            http = HttpTransport(url, TOKEN)
            local = InProcessTransport(service, caller, problem=problem_from_body)
            local.step_log = lambda run_id: [  # type: ignore[attr-defined]
                r.model_dump() for r in service.runs.step_log(caller, run_id, 0, 100_000)
            ]
            sessions = [
                Session(
                    f"{mode}/{where}",
                    transport,
                    spec(mode),
                    bottom_for(mode),
                    quantizer=quantizer_for(mode),
                )
                for mode in ("fedlite", "splitfed")
                for where, transport in (("inprocess", local), ("http", http))
            ]
            for session in sessions:
                session.prepare(ids)
                for _ in range(args.warmup):
                    session.train_step(images, record=False)
            while any(len(s.times.get("total", [])) < args.steps for s in sessions):
                for session in sessions:
                    for _ in range(args.block):
                        session.train_step(images, record=True)
            results: dict[str, Any] = {}
            for session in sessions:
                results[session.name] = {
                    "party_a": {
                        part: summary_ms(session.times[part]) for part in [*A_PARTS, "total"]
                    },
                    "party_b": party_b_parts(session),
                    "codec": codec_parts(session, 50),
                    "request_bytes": len(session.last["request"]),
                    "response_bytes": len(session.last["response"]),
                }
            http.close()

    for mode in ("fedlite", "splitfed"):
        over_http, in_process = results[f"{mode}/http"], results[f"{mode}/inprocess"]
        round_trip = over_http["party_a"]["round_trip"]["median_ms"]
        http_only = round_trip - in_process["party_a"]["round_trip"]["median_ms"]
        codec_ms = sum(over_http["codec"].values())
        total = over_http["party_a"]["total"]["median_ms"]
        results[mode] = {
            "step_total_http_ms": total,
            "step_total_inprocess_ms": in_process["party_a"]["total"]["median_ms"],
            "http_overhead_ms": http_only,
            "codec_ms": codec_ms,
            "http_and_codec_share": (http_only + codec_ms) / total,
            "http_share": http_only / total,
        }
        print(mode, {k: round(v, 3) for k, v in results[mode].items()}, flush=True)
    path = write_result(
        "step",
        {
            "versions": versions("torch", "numpy", "fastapi", "uvicorn", "httpx", "msgpack"),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "steps": args.steps,
            "party_b_malloc_tuning": not args.no_malloc_tuning,
            "sessions": results,
        },
        args.out,
    )
    for name, r in results.items():
        if "party_a" in r:
            parts = {k: round(v["median_ms"], 2) for k, v in r["party_a"].items()}
            print(name, parts, {k: round(v, 2) for k, v in r["party_b"].items()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
