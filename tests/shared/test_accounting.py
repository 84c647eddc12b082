"""Bit accounting: the paper's formula, measured wire sizes, and the ``fedlite-a ratio`` CLI."""

import json
import subprocess
import sys

import pytest

from shared.accounting import compression_report, paper_message_bits


def test_paper_femnist_point_is_490x() -> None:
    size = paper_message_bits(d=9216, batch=20, q=1152, L=2, R=1)
    assert size.codebook_bits == 64 * 9216 * 2 / 1152
    assert size.codeword_bits == 20 * 1152
    assert 490 < size.ratio < 491


def test_paper_formula_by_hand_for_grouped_pq() -> None:
    size = paper_message_bits(d=96, batch=3840, q=12, L=240, R=1, phi=32)
    assert size.total_bits == pytest.approx(32 * 96 * 240 / 12 + 3840 * 12 * 7.906890595608519)
    assert size.raw_bits == 32 * 96 * 3840


def test_wire_sizes_are_measured_from_real_messages() -> None:
    report = compression_report(d=9216, batch=20, q=1152, L=2)
    # payload: codebook 1*2*8 float32 = 64 B, codewords 20*1152 bits = 2880 B; plus headers
    assert 64 + 2880 < report["wire_bytes"] < 64 + 2880 + 200
    assert 20 * 9216 * 4 < report["raw_wire_bytes"] < 20 * 9216 * 4 + 200
    assert report["wire_ratio"] == report["raw_wire_bytes"] / report["wire_bytes"]
    half = compression_report(d=9216, batch=20, q=1152, L=2, codebook_dtype="float16")
    assert report["wire_bytes"] - half["wire_bytes"] == 32  # 16 floats lose 2 bytes each


def test_invalid_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="q"):
        paper_message_bits(d=10, batch=2, q=3, L=2)


def test_cli_prints_one_json_object_with_the_papers_ratio() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "party_a.cli", "ratio"]
        + ["--d", "9216", "--batch", "20", "--q", "1152", "--L", "2", "--R", "1"],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(out.stdout)
    assert 490 < report["paper_ratio"] < 491
    assert {"paper_ratio", "wire_bytes", "raw_wire_bytes", "wire_ratio"} <= report.keys()


def test_cli_reports_bad_parameters_without_a_traceback() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "party_a.cli", "ratio"]
        + ["--d", "100", "--batch", "20", "--q", "3", "--L", "2"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "q | d" in out.stderr and "Traceback" not in out.stderr
