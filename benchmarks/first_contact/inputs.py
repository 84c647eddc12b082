"""The first-contact benchmark's data: FATE's default_credit pair cut to about issue 29's
sizes (party A 29,200 ids, party B 29,600, seeded), so that the intersection is about 28,800."""

import gzip
import random
from pathlib import Path

from benchmarks.common import SHARED_DATA

__all__ = ["A_IDS", "B_IDS", "PAIR", "tables"]

PAIR = SHARED_DATA / "fate_hetero"
A_IDS, B_IDS = 29_200, 29_600


def _subset(source: Path, out: Path, keep: int, seed: int) -> Path:
    """``keep`` rows of a gzipped CSV (header kept), chosen with ``seed``, as a plain CSV."""
    with gzip.open(source, "rt") as handle:
        header, *rows = handle.read().splitlines()
    chosen = sorted(random.Random(seed).sample(range(len(rows)), keep))
    out.write_text("\n".join([header, *(rows[i] for i in chosen)]) + "\n")
    return out


def tables(directory: Path) -> tuple[Path, Path]:
    """(party A's features, party B's labels) at the issue's sizes."""
    features = _subset(PAIR / "default_credit_hetero_host.csv.gz", directory / "a.csv", A_IDS, 1)
    labels = _subset(PAIR / "default_credit_hetero_guest.csv.gz", directory / "b.csv", B_IDS, 2)
    return features, labels
