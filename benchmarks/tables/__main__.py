"""``python -m benchmarks.tables credit | big``: see ``benchmarks/tables/__init__.py``."""

import argparse
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, machine, versions

OUT = RESULTS / "tables.json"


def _save(part: str, payload: dict[str, Any], before: list[float], command: str) -> Path:
    """Write ``payload`` as ``part`` of tables.json, with when, where and the load around it
    (the other part is kept as it was)."""
    import time

    doc: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {}
    doc["benchmark"] = "tables"
    doc[part] = {
        "command": command,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "loadavg_before": before,
        "loadavg_after": list(os.getloadavg()),
        **payload,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=2) + "\n")
    return OUT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tables")
    sub = parser.add_subparsers(dest="what", required=True)
    credit = sub.add_parser("credit", help="credit_data: the product against central baselines")
    credit.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    big = sub.add_parser("big", help="a 1,000,000 x 100 Parquet table prepared")
    big.add_argument("--rows", type=int, default=1_000_000)
    child = sub.add_parser("big-child", help=argparse.SUPPRESS)
    child.add_argument("kind", choices=["prepare", "pandas"])
    child.add_argument("path", type=Path)
    args = parser.parse_args(argv)

    if args.what == "big-child":  # one measurement in a fresh process (its own peak RSS)
        from benchmarks.tables import big as big_table

        measure = big_table.child_prepare if args.kind == "prepare" else big_table.child_pandas
        print(json.dumps(measure(args.path)))
        return 0
    before = list(os.getloadavg())
    if args.what == "credit":
        from benchmarks.tables import credit as credit_table

        payload = credit_table.measure(args.seeds)
        command = "python -m benchmarks.tables credit --seeds " + " ".join(map(str, args.seeds))
    else:
        from benchmarks.tables import big as big_table

        payload = big_table.measure(args.rows)
        payload["versions"] = versions("numpy", "pandas", "pyarrow")
        command = f"python -m benchmarks.tables big --rows {args.rows}"
    print(f"wrote {_save(args.what, payload, before, command)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
