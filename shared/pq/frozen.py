"""A party's half of a trained model, exported for serving without the service.

An export is a directory, mode 700, files mode 600 (it holds a model and the run's alignment
key): ``manifest.json`` plus the model as a ``torch.export`` program (``*.pt2``; loading it
needs torch alone, the same version that wrote it) and, for party A in a FedLite run, the
frozen serving codebook (``codebook.npy``, (R, L, d/q) float32). See docs/DEPLOY.md,
"Serving from the export", and ``examples/serve_export.py``.
"""

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from shared.pq.quantizer import GroupedProductQuantizer, PQConfig

__all__ = [
    "EXPORT_FORMAT",
    "ExportError",
    "Program",
    "codebook_from_bytes",
    "codebook_to_bytes",
    "load_program",
    "quantizer_of",
    "read_manifest",
    "save_program",
    "write_export",
]

EXPORT_FORMAT = "fedlite-export/1"


class ExportError(ValueError):
    """An export that cannot be written or read as asked."""


class Program:
    """A loaded ``.pt2`` model: call it like the module it was exported from."""

    def __init__(self, path: Path) -> None:
        self._module = torch.export.load(str(path)).module()

    @torch.no_grad()
    def __call__(self, *inputs: Tensor) -> Tensor:
        out: Tensor = self._module(*inputs)
        return out


def save_program(module: nn.Module, examples: tuple[Tensor, ...]) -> bytes:
    """``module`` (eval mode) as a torch.export program with a dynamic batch dimension."""
    batch = torch.export.Dim("batch")
    program = torch.export.export(
        module.eval(), examples, dynamic_shapes=tuple({0: batch} for _ in examples)
    )
    out = io.BytesIO()
    torch.export.save(program, out)
    return out.getvalue()


def load_program(directory: Path, name: str) -> Program:
    return Program(directory / name)


def write_export(directory: Path, manifest: dict[str, Any], files: dict[str, bytes]) -> None:
    """Create ``directory`` (it must not exist, or be empty) with the manifest and files."""
    directory = Path(directory)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ExportError(f"{directory} exists and is not an empty directory")
    if not directory.parent.is_dir():
        raise ExportError(f"no directory {directory.parent} to create {directory.name} in")
    directory.mkdir(mode=0o700, exist_ok=True)
    body = json.dumps({"format": EXPORT_FORMAT, **manifest}, indent=2).encode() + b"\n"
    for name, data in {**files, "manifest.json": body}.items():
        fd = os.open(directory / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)


def read_manifest(directory: Path, party: str) -> dict[str, Any]:
    """The manifest of ``party``'s export in ``directory``, checked."""
    path = Path(directory) / "manifest.json"
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise ExportError(f"no export in {directory} (no manifest.json)") from None
    if manifest.get("format") != EXPORT_FORMAT:
        raise ExportError(f"{path}: format {manifest.get('format')!r}, expected {EXPORT_FORMAT}")
    if manifest.get("party") != party:
        raise ExportError(f"{path} is party {manifest.get('party')}'s export, not party {party}'s")
    return manifest


def quantizer_of(manifest: dict[str, Any]) -> GroupedProductQuantizer:
    """The grouped product quantizer of an export's ``quantizer`` section (mode pq)."""
    spec = manifest["quantizer"]
    return GroupedProductQuantizer(
        int(manifest["cut_dim"]), PQConfig(q=int(spec["q"]), L=int(spec["L"]), R=int(spec["R"]))
    )


def codebook_to_bytes(codebook: Tensor) -> bytes:
    """A codebook (R, L, s) as .npy bytes (float32)."""
    out = io.BytesIO()
    np.save(out, codebook.numpy().astype(np.float32), allow_pickle=False)
    return out.getvalue()


def codebook_from_bytes(data: bytes) -> Tensor:
    return torch.from_numpy(np.load(io.BytesIO(data), allow_pickle=False))
