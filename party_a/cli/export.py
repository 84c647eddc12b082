"""``fedlite-a export``: party A's half of a trained run, ready to serve without party A's
trainer: the bottom model (torch.export program), the fitted preparation (columns, medians,
z-score, vocabularies: ``party_a.preparation``), the quantizer config and the frozen serving
codebook (see party_a.inference).

Scoring from the export is what ``predict`` does: table -> preparation -> bottom -> codewords
against the frozen codebook (or raw z), sent with HMAC(run key, id) to party B.
"""

from pathlib import Path
from typing import Any

import torch

from party_a.config import PartyAConfig
from party_a.errors import ConfigError
from party_a.features import FeatureTransform
from party_a.preparation import bottom_kwargs
from party_a.store import LocalRun, LocalStore
from shared.models import build_bottom, takes_tokens
from shared.models import cut_dim as model_cut_dim
from shared.pq.frozen import save_program, write_export
from shared.training import state_from_bytes

__all__ = ["export_run"]


def export_run(store: LocalStore, local: LocalRun, out: Path) -> dict[str, Any]:
    """Write the export of ``local`` at its newest checkpoint to ``out``; the manifest."""
    config = PartyAConfig.model_validate(local.config)
    serving = store.serving(local.id)
    checkpoint = store.load_checkpoint(local.id)
    if serving is None or checkpoint is None:
        raise ConfigError(f"run {local.name!r} has not been trained in this state directory")
    transform = FeatureTransform.from_json(serving.transform)
    pq = config.quantizer.mode == "pq"
    if pq and (serving.codebook is None or serving.codebook_step != checkpoint.step):
        raise ConfigError(
            f"run {local.name!r} has no serving codebook for its step {checkpoint.step}: "
            "finish training (`fedlite-a train`) or run `fedlite-a evaluate` once, which "
            "freeze it"
        )
    kwargs = bottom_kwargs(config.run.model, dict(config.model.bottom), transform)
    model = build_bottom(config.run.model, **kwargs)
    model.load_state_dict(state_from_bytes(checkpoint.model_state))
    tokens = takes_tokens(config.run.model)
    example = torch.zeros((2, transform.width), dtype=torch.long if tokens else torch.float)
    files = {"bottom.pt2": save_program(model, (example,))}
    if pq:
        assert serving.codebook is not None
        files["codebook.npy"] = serving.codebook
    manifest: dict[str, Any] = {
        "party": "A",
        "run": {"name": local.name, "id": local.remote_id, "server": local.server},
        "step": checkpoint.step,
        "model": config.run.model,
        "bottom": kwargs,
        "input": "int64 token ids" if tokens else "float32",
        # the program's input columns: the transform's output (party_a.preparation)
        "input_columns": transform.output_names(),
        "cut_dim": model_cut_dim(config.run.model, **kwargs),
        "transform": transform.to_json(),
        "quantizer": {
            "mode": config.quantizer.mode,
            "q": config.quantizer.q,
            "R": config.quantizer.R,
            "L": config.quantizer.L,
            "codebook_dtype": config.quantizer.codebook_dtype,
        },
        "codebook": "codebook.npy" if pq else None,
        "alignment_key": local.alignment_key,  # ids travel as HMAC(key, id), as in predict
    }
    write_export(out, manifest, files)
    return manifest
