"""benchmarks/traffic.py on two tiny real runs: the record fields, bytes that are the real
messages' lengths, and the generated table agreeing with the JSON."""

import json
from pathlib import Path

from benchmarks import report, traffic

FIELDS = {
    "task",
    "seed",
    "method",
    "steps",
    "uplink_bytes_per_step",
    "downlink_bytes_per_step",
    "splitfed_bytes_per_step",
    "total_ratio",
    "metric",
    "value",
    "splitfed_value",
}


def test_traffic_records_measure_both_directions_against_splitfed(tmp_path: Path) -> None:
    out = tmp_path / "traffic.json"
    traffic.main(
        ["--tasks", "femnist", "--smoke", "--downlinks", "pq:q=1152,L=2", "--out", str(out)]
    )

    doc = json.loads(out.read_text())
    splitfed, fedlite = doc["records"]
    assert set(splitfed) == FIELDS and set(fedlite) == FIELDS
    assert splitfed["method"] == "up raw / down float32" and splitfed["total_ratio"] == 1.0
    assert fedlite["method"] == "up pq:q=1152,L=2 / down pq:q=1152,L=2"
    assert fedlite["steps"] == splitfed["steps"] == 3 and fedlite["seed"] == splitfed["seed"] == 0
    # 2 clients x up to 20 images, d = 9216: float32 both ways against 1 bit per sub-vector
    assert splitfed["downlink_bytes_per_step"] > 9216 * 4 * 20
    assert fedlite["downlink_bytes_per_step"] < splitfed["downlink_bytes_per_step"] / 100
    assert fedlite["uplink_bytes_per_step"] < splitfed["uplink_bytes_per_step"] / 100
    total = fedlite["uplink_bytes_per_step"] + fedlite["downlink_bytes_per_step"]
    assert fedlite["total_ratio"] == fedlite["splitfed_bytes_per_step"] / total
    # every run is kept beside the JSON, so a second call trains nothing
    assert len(list((tmp_path / "traffic-runs").glob("*.json"))) == 2

    table = "\n".join(report.traffic_table(doc))
    assert f"{fedlite['total_ratio']:,.1f}x" in table and fedlite["method"] in table
