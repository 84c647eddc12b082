"""How much disk the product install takes: fedlite-vfl and every distribution it needs
(its dependency closure without extras), as installed in this Python environment.

    python -m benchmarks.install_size

Sizes are the files each distribution's RECORD lists, measured on disk (bytecode included
where Python wrote it). Run it in an environment made by ``docker/install.sh`` (what `make
demo`, the images and the README's figure are about); in a development environment it
counts the same distributions and leaves the extras out. Writes
``benchmarks/results/install_size.json``.
"""

from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from benchmarks.common import versions, write_result

__all__ = ["closure", "main"]


def closure(name: str, seen: dict[str, metadata.Distribution] | None = None) -> dict[str, Any]:
    """``name`` and every distribution its requirements pull in (no extras), by name."""
    seen = {} if seen is None else seen
    key = name.lower().replace("_", "-")
    if key in seen:
        return seen
    seen[key] = metadata.distribution(name)
    for text in seen[key].requires or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            closure(requirement.name, seen)
    return seen


def _size(dist: metadata.Distribution) -> int:
    paths = (Path(str(dist.locate_file(f))) for f in dist.files or [])
    return sum(p.stat().st_size for p in paths if p.is_file())


def main() -> None:
    sizes = {name: _size(dist) for name, dist in sorted(closure("fedlite-vfl").items())}
    total = sum(sizes.values())
    result = {
        "distributions": len(sizes),
        "total_bytes": total,
        "total_gb": round(total / 1e9, 2),
        "largest_mb": {
            k: round(v / 1e6, 1) for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])[:8]
        },
        "versions": versions("torch"),
    }
    print(write_result("install_size", result))
    print(f"{len(sizes)} distributions, {total / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
