"""Party A's half of a training step, in code order, with no HTTP and no database.

    z = bottom(x)                      -> quantize z per chunk -> encode the step request
    ... party B answers ...
    decode the response -> g = dh/dz~ + lambda * n_c/n * (z - z~) -> z.backward(g) -> step

lambda is in the paper's units, per client batch-mean: a chunk of n_c of the step's n rows is
one client's batch (see shared.correction); a vertical run sends one chunk, weight 1.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.func import functional_call

from party_a.errors import ProtocolError
from shared import codec, threads
from shared.correction import correct_gradient
from shared.devices import to_host
from shared.models import build_bottom, build_seeded, seed_dropout, takes_tokens
from shared.pq import GroupedProductQuantizer, PQConfig
from shared.schedule import step_seed
from shared.training import clear_gradients, make_optimizer, state_from_bytes, state_to_bytes

__all__ = ["FREEZE_SAMPLES", "BottomTrainer", "PendingStep", "StepResult"]

FREEZE_SAMPLES = 4096  # training samples the serving codebook is fitted on, at most


@dataclass
class PendingStep:
    """What party A keeps between sending a step and applying its answer."""

    step: int
    z: Tensor  # (rows, d) with autograd history back to the bottom model
    z_tilde: Tensor  # (rows, d) exactly what party B will dequantize
    body: bytes  # the encoded request (resent verbatim on retry)
    chunk_sizes: tuple[int, ...]  # activation rows of each chunk of the request
    # pipelining (party_a.loop): the detached copy of the parameters z was computed with;
    # None when z's graph leads to the live parameters (one step in flight)
    stashed: dict[str, Tensor] | None = None
    threads: int = 1  # the step's intra-op threads (shared.threads), for its backward too


@dataclass(frozen=True)
class StepResult:
    step: int
    loss: float
    metrics: dict[str, float]
    bytes_received: int


class BottomTrainer:
    """Bottom model, optimizer and quantizer of one run."""

    def __init__(
        self,
        *,
        model: str,
        bottom_kwargs: dict[str, Any],
        quantizer: dict[str, Any],
        optimizer: dict[str, Any],
        seed: int,
        device: torch.device | None = None,
    ) -> None:
        """``quantizer``: mode ("pq"/"raw"), q, R, L, codebook_dtype, iterations, lambda,
        codewords ("packed" or "ans"). ``device``: where the model, its optimizer and the
        k-means run (default the CPU); initialised on the CPU first, so a run starts from the
        same weights on any device."""
        self.device = device or torch.device("cpu")
        self.model = build_seeded(lambda: build_bottom(model, **bottom_kwargs), seed)
        self.model.to(self.device)
        self.optimizer = make_optimizer(self.model.parameters(), optimizer)
        self.seed = seed
        self.tokens = takes_tokens(model)
        self.lam = float(quantizer.get("lambda", 0.0))
        self.codebook_dtype: codec.WireFloat = quantizer.get("codebook_dtype", "float32")
        self.codewords: codec.CodewordCoding = quantizer.get("codewords", "packed")
        self.pq = quantizer["mode"] == "pq"
        self._quantizer_spec = quantizer
        self._quantizers: dict[int, GroupedProductQuantizer] = {}
        self.frozen: Tensor | None = None  # the serving codebook (R, L, s), see freeze_codebook
        self._macs_per_sample: int | None = None  # of a training step (shared.threads)

    # ------------------------------------------------------------------ training

    def request(
        self,
        step: int,
        x: np.ndarray,
        digest: bytes,
        *,
        chunk_sizes: Sequence[int] | None = None,
        stash: bool = False,
    ) -> PendingStep:
        """Forward the batch and encode the step request (chunks quantized independently).

        ``chunk_sizes`` count samples; a sample is one activation row, or T rows (one per
        token) for sequence models. ``stash``: forward with a detached copy of the
        parameters (weight stashing), so that this step's gradient is taken at the weights
        that made z even when other steps update the model before its answer arrives.
        Runs on the step's intra-op threads (``shared.threads``: from its size and the
        cores, or the operator's ``--torch-threads``).
        """
        inputs = self._input(x)
        step_threads = self._threads(inputs)
        with threads.intra_op(step_threads):
            pending = self._request(step, inputs, digest, chunk_sizes, stash)
        pending.threads = step_threads
        return pending

    def _request(
        self,
        step: int,
        inputs: Tensor,
        digest: bytes,
        chunk_sizes: Sequence[int] | None,
        stash: bool,
    ) -> PendingStep:
        self.model.train()
        seed_dropout(self.model, step_seed(self.seed, step, "dropout-bottom"))
        stashed = None
        if stash:
            stashed = {
                name: p.detach().clone().requires_grad_(p.requires_grad)
                for name, p in self.model.named_parameters()
            }
            z = functional_call(self.model, stashed, (inputs,))
        else:
            z = self.model(inputs)  # (rows, d)
        per_sample = int(z.shape[0]) // max(len(inputs), 1)
        sizes = [per_sample * b for b in chunk_sizes] if chunk_sizes else None
        chunks, z_tilde = self._compress(z, step, "kmeans", sizes)
        body = codec.encode_step_request(
            codec.StepRequest(step=step, batch_digest=digest, chunks=chunks),
            codebook_dtype=self.codebook_dtype,
            codewords=self.codewords,
        )
        rows = tuple(c.B for c in chunks)
        return PendingStep(
            step=step, z=z, z_tilde=z_tilde, body=body, chunk_sizes=rows, stashed=stashed
        )

    def apply(self, pending: PendingStep, response: bytes) -> StepResult:
        """Decode party B's answer, correct the gradient and update the bottom model."""
        with threads.intra_op(pending.threads):
            return self._apply(pending, response)

    def _apply(self, pending: PendingStep, response: bytes) -> StepResult:
        try:
            answer = codec.decode_step_response(response)
        except codec.CodecError as exc:
            raise ProtocolError(f"step {pending.step}: undecodable response: {exc}") from None
        if answer.step != pending.step or answer.grad.shape != tuple(pending.z.shape):
            raise ProtocolError(
                f"step {pending.step}: response for step {answer.step} with gradient "
                f"{answer.grad.shape}, expected {tuple(pending.z.shape)}"
            )
        grad = torch.from_numpy(answer.grad).to(self.device)
        corrected = correct_gradient(
            grad, pending.z, pending.z_tilde, self.lam, chunk_rows=pending.chunk_sizes
        )
        clear_gradients(self.optimizer)
        if pending.stashed is None:
            torch.autograd.backward(pending.z, corrected)
        else:  # the gradient at the stashed weights, applied to the live ones
            trained = [w for w in pending.stashed.values() if w.requires_grad]
            torch.autograd.backward(pending.z, corrected, inputs=trained)
            for name, p in self.model.named_parameters():
                p.grad = pending.stashed[name].grad
        self.optimizer.step()
        return StepResult(
            step=pending.step,
            loss=answer.loss,
            metrics=answer.metrics,
            bytes_received=len(response),
        )

    # ------------------------------------------------------------------ serving

    @torch.no_grad()
    def activations(
        self, x: np.ndarray, *, chunk_size: int, raw: bool = False
    ) -> tuple[codec.Activations, ...]:
        """Forward only (eval mode), in chunks of ``chunk_size`` samples, each quantized
        against the frozen serving codebook (``frozen``): a sample's activations on the wire
        -- and so its score -- do not depend on the other samples of the request. With
        ``raw``, send z itself even in a FedLite run."""
        z = self.forward(x)
        chunk_size *= int(z.shape[0]) // max(len(x), 1)  # rows: T per sample for sequences
        sizes = [min(chunk_size, len(z) - i) for i in range(0, len(z), chunk_size)]
        if raw or not self.pq:
            return tuple(codec.RawActivations(p) for p in to_host(torch.split(z, sizes)))
        if self.frozen is None:
            raise ValueError("no frozen serving codebook: call freeze_codebook() first")
        quantizer = self._quantizer(int(z.shape[1]))
        frozen = self.frozen.to(self.device)
        codewords = to_host([quantizer.assign(p, frozen).codewords for p in torch.split(z, sizes)])
        return tuple(codec.PQActivations(self.frozen.numpy(), c) for c in codewords)

    @torch.no_grad()
    def forward(self, x: np.ndarray) -> Tensor:
        """z (rows, d) of the model in eval mode (no dropout), in blocks of 4096 samples."""
        self.model.eval()
        if len(x) == 0:
            raise ValueError("no samples to forward")
        parts = [self.model(self._input(x[i : i + 4096])) for i in range(0, len(x), 4096)]
        return torch.cat(parts).detach()

    def freeze_codebook(self, x_train: np.ndarray, step: int) -> Tensor:
        """Fit the serving codebook (R, L, s) on the training samples' activations at model
        step ``step`` and keep it in ``frozen``; deterministic in (model, seed, step).

        At most ``FREEZE_SAMPLES`` samples (a seeded choice) and 256 points per centroid
        take part: the codebook summarizes the training distribution, it need not see all
        of it.
        """
        rng = np.random.default_rng(step_seed(self.seed, step, "serving-codebook"))
        if len(x_train) > FREEZE_SAMPLES:
            x_train = x_train[np.sort(rng.choice(len(x_train), FREEZE_SAMPLES, replace=False))]
        z = self.forward(x_train)
        base = self._quantizer(int(z.shape[1]))
        fitting = GroupedProductQuantizer(
            base.d, dataclasses.replace(base.config, max_points_per_centroid=256)
        )
        code = fitting.encode(z, seed=step_seed(self.seed, step, "serving-codebook"))
        # what party B will read off the wire; kept and stored with the run, device-neutral
        self.frozen = code.rounded(self.codebook_dtype).codebook.cpu().contiguous()
        return self.frozen

    # ------------------------------------------------------------------ state

    def state(self) -> tuple[bytes, bytes]:
        return state_to_bytes(self.model.state_dict()), state_to_bytes(self.optimizer.state_dict())

    def load_state(self, model_state: bytes, optimizer_state: bytes) -> None:
        self.model.load_state_dict(state_from_bytes(model_state))
        self.optimizer.load_state_dict(state_from_bytes(optimizer_state))

    # ------------------------------------------------------------------ internals

    def _threads(self, inputs: Tensor) -> int:
        """Intra-op threads of a training step on ``inputs`` (a batch of samples)."""
        if self._macs_per_sample is None:
            self._macs_per_sample = threads.macs_per_sample(self.model, inputs[:1])
        return threads.choose(self._macs_per_sample * len(inputs))

    def _input(self, x: np.ndarray) -> Tensor:
        t = torch.from_numpy(np.ascontiguousarray(x))
        return (t.long() if self.tokens else t.float()).to(self.device)

    def _compress(
        self, z: Tensor, step: int, purpose: str, chunk_sizes: Sequence[int] | None
    ) -> tuple[tuple[codec.Activations, ...], Tensor]:
        """Chunks for the wire and the z~ (rows, d) party B will rebuild from them."""
        sizes = list(chunk_sizes) if chunk_sizes else [int(z.shape[0])]
        if sum(sizes) != z.shape[0]:
            raise ValueError(f"chunk sizes {sizes} do not add up to {z.shape[0]} rows")
        detached = z.detach()
        if not self.pq:
            chunk_list: list[codec.Activations] = [
                codec.RawActivations(part) for part in to_host(torch.split(detached, sizes))
            ]
            return tuple(chunk_list), detached
        quantizer = self._quantizer(int(z.shape[1]))
        codes = quantizer.encode_many(
            torch.split(detached, sizes),
            seeds=[step_seed(self.seed, step, f"{purpose}-{i}") for i in range(len(sizes))],
        )
        # party B rebuilds z~ from the codebook as it travels: use the same one here
        codes = [code.rounded(self.codebook_dtype) for code in codes]
        rebuilt = [quantizer.decode(code) for code in codes]
        # off a GPU in one wait for every chunk (shared.devices.to_host); as they are on a CPU
        host = to_host([t for code in codes for t in (code.codebook, code.codewords)])
        chunks: list[codec.Activations] = [
            codec.PQActivations(host[i], host[i + 1]) for i in range(0, len(host), 2)
        ]
        return tuple(chunks), torch.cat(rebuilt) if len(rebuilt) > 1 else rebuilt[0]

    def _quantizer(self, d: int) -> GroupedProductQuantizer:
        if d not in self._quantizers:
            spec = self._quantizer_spec
            self._quantizers[d] = GroupedProductQuantizer(
                d,
                PQConfig(
                    q=int(spec["q"]),
                    L=int(spec["L"]),
                    R=int(spec.get("R", 1)),
                    iterations=int(spec.get("iterations", 10)),
                ),
            )
        return self._quantizers[d]
