"""``fedlite-b export``: party B's half of a trained run, ready to serve without the service:
the top model (torch.export program) at the run's newest checkpoint, the classes its
outputs score, the transform of party B's own feature columns when the run uses them, and
the quantizer config that party A's codewords are read with.

Scoring from the export is what ``predict`` does at party B: z~ (dequantized from party A's
frozen codebook and codewords, or raw z) and side features -> top model -> softmax (sigmoid
per tag for multi-label runs).
"""

from pathlib import Path
from typing import Any

import torch

from api_schemas import RunCreate, RunStatus
from party_b import store
from party_b.labels import LabelSource, LabelTable
from party_b.ops.maintenance import MaintenanceError
from party_b.service.admission import Admission
from party_b.service.loader import restore
from party_b.settings import Settings
from shared.pq.frozen import save_program, write_export

__all__ = ["export_run"]


def export_run(settings: Settings, labels: LabelSource, run_id: str, out: Path) -> dict[str, Any]:
    """Write the export of run ``run_id`` to ``out``; returns the manifest."""
    engine = store.make_engine(settings.resolved_database_url())
    try:
        with store.make_session_factory(engine)() as session:
            run = store.run_by_id(session, run_id)
            if run is None:
                raise MaintenanceError(f"no run {run_id!r} in {settings.resolved_database_url()}")
            checkpoint = store.load_checkpoint(session, run_id)
            if run.status == RunStatus.CREATED.value or checkpoint is None:
                raise MaintenanceError(f"run {run_id} was never aligned: nothing to export")
            spec = RunCreate.from_stored(run.config)
            trainer = Admission(labels, settings.limits).new_trainer(spec)
            restore(trainer, checkpoint)
            step, name, key = checkpoint.step, run.name, run.alignment_key
    finally:
        engine.dispose()
    model = trainer.model
    side = model.side_features
    examples: tuple[torch.Tensor, ...] = (torch.zeros(2, spec.width),)
    if side:
        examples += (torch.zeros(2, side),)
    table = labels if isinstance(labels, LabelTable) else None
    manifest: dict[str, Any] = {
        "party": "B",
        "run": {"name": name, "id": run_id},
        "step": step,
        "model": spec.model,
        "task": labels.task,
        "output": "sigmoid" if labels.task == "multilabel" else "softmax",
        "classes": table.classes if table else list(range(labels.num_outputs)),
        "cut_dim": spec.width,  # a run with parties: their fused width
        "quantizer": spec.quantizer.model_dump() if spec.quantizer else None,
        "parties": [
            {"name": p.name, "cut_dim": p.cut_dim, "quantizer": p.quantizer.model_dump()}
            for p in spec.parties
        ]
        if spec.parties
        else None,
        "fusion": spec.fusion,
        "side": _side(settings, table) if side else None,
        "alignment_key": key,  # party A's ids arrive as HMAC(key, id), as in predict
    }
    write_export(out, manifest, {"top.pt2": save_program(model, examples)})
    return manifest


def _side(settings: Settings, table: LabelTable | None) -> dict[str, Any]:
    """How party B's own feature columns are read and prepared for this model: the fitted
    preparation (``shared.preparation.SideFeatures``: medians, indicators, z-scores, one-hot
    categories), and for a table of numbers without empty cells its z-score alone, as
    exports written before categories had it."""
    if table is None:
        raise MaintenanceError(
            "this run's side features come from a label source in code (--label-source), "
            "not a table: fedlite-b export cannot say how to read them"
        )
    if table.side_preparation is None and table.feature_mean is None:
        raise MaintenanceError("the label table carries no fitted preparation of its columns")
    return {
        "id_column": settings.id_column,
        "columns": table.feature_names,
        "preparation": table.side_preparation,
        "mean": table.feature_mean,
        "scale": table.feature_scale,
    }
