"""The papercuts a new user met with ``fedlite-a`` (issue 29), each against a real party B
(uvicorn in a thread, the bundled demo data) and the CLI as a user runs it:

* a loss party B withholds reads "withheld by party B", never ``loss nan``, and the summary
  JSON stays JSON (null, not NaN);
* a ``q`` that does not divide the cut width is one line, not pydantic's dump;
* ``train --help`` explains every flag and shows an example;
* ``predict`` names its id column as the table does (``--id-column``);
* a token party B refuses (unknown, expired) exits with 2, not 1 ("retrying may help");
* ``predict --config run.toml`` finds the run ``train --config run.toml --steps 4`` made;
* ``examples/serve_export.py`` with a wrong id column is one line and exit code 2.
"""

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from party_a.cli.parser import build_parser
from party_b.api import create_app
from party_b.settings import Settings
from tests.utils.cli import DEMO_CONFIG, REPO_ROOT, TOKEN, demo_tables, run_cli
from tests.utils.live import live_server


@pytest.fixture(scope="module")
def party_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path | str]]:
    """Two party Bs on the demo labels: one as configured by default, one whose runs withhold
    every metric (label privacy ``metrics=none``); party A's table with its id column named
    ``customer``."""
    root = tmp_path_factory.mktemp("papercuts")
    features, labels = demo_tables(root)
    renamed = root / "customers.csv"
    pd.read_csv(features, dtype={"id": str}).rename(columns={"id": "customer"}).to_csv(
        renamed, index=False
    )
    plain = Settings(data_dir=root / "b", labels=labels, tokens=f"a:{TOKEN}")
    private = Settings(
        data_dir=root / "b-private", labels=labels, tokens=f"a:{TOKEN}", privacy="off,metrics=none"
    )
    with live_server(create_app(plain)) as url, live_server(create_app(private)) as private_url:
        yield {
            "url": url,
            "private_url": private_url,
            "features": features,
            "customers": renamed,
            "data_dir": root / "b",
            "root": root,
        }


def _train(url: str, features: Path, state: Path, *extra: str) -> tuple[int, str, str]:
    ran = run_cli(
        "a", "train", "--server", url, "--token", TOKEN, "--features", str(features),
        "--config", str(DEMO_CONFIG), "--steps", "4", "--state-dir", str(state), *extra,
    )  # fmt: skip
    return ran.returncode, ran.stdout, ran.stderr


def _strict_json(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_withheld_loss_reads_as_withheld_and_the_summary_stays_json(
    party_b: dict[str, Path | str], tmp_path: Path
) -> None:
    summary = tmp_path / "summary.json"
    code, _out, err = _train(
        str(party_b["private_url"]), Path(party_b["features"]), tmp_path / "a",
        "--summary-json", str(summary),
    )  # fmt: skip

    assert code == 0, err
    assert "step 4/4 loss withheld by party B" in err
    assert "nan" not in err.lower().replace("finance", "")
    data = _strict_json(summary.read_text())
    assert isinstance(data, dict) and data["last_loss"] is None


def test_q_that_does_not_divide_the_cut_width_is_one_line(
    party_b: dict[str, Path | str], tmp_path: Path
) -> None:
    code, _out, err = _train(
        str(party_b["url"]), Path(party_b["features"]), tmp_path / "a", "--q", "5"
    )
    assert code == 2
    lines = [line for line in err.splitlines() if not line.startswith("fedlite-a: [")]
    assert lines == [
        "fedlite-a train: the run's config does not fit its model: "
        "quantizer.q=5 must divide cut_dim=32"
    ]


def test_an_unknown_model_is_one_line_after_the_table_checks(
    party_b: dict[str, Path | str], tmp_path: Path
) -> None:
    code, _out, err = _train(
        str(party_b["url"]), Path(party_b["features"]), tmp_path / "a", "--model", "resnet"
    )
    said = [line for line in err.splitlines() if not line.startswith("fedlite-a: [")]
    assert code == 2 and len(said) == 1, err
    assert said[0].startswith("fedlite-a train: unknown model 'resnet'; known: [")


def test_train_help_explains_every_flag_and_shows_an_example() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # the subcommands
    train = sub.choices["train"]  # type: ignore[index]
    silent = [a.option_strings for a in train._actions if a.option_strings and not a.help]
    assert silent == []
    text = run_cli("a", "train", "--help").stdout
    for flag in ("--steps", "--batch-size", "--seed", "--checkpoint-interval", "--eval-fraction"):
        assert flag in text
    assert "example:\n  fedlite-a train --server https://" in text


def test_predict_names_the_id_column_as_the_table_does(
    party_b: dict[str, Path | str], tmp_path: Path
) -> None:
    table, state = Path(party_b["customers"]), tmp_path / "a"
    code, _out, err = _train(str(party_b["url"]), table, state, "--id-column", "customer")
    assert code == 0, err
    out = tmp_path / "scores.csv"
    scored = run_cli(
        "a", "predict", "--server", str(party_b["url"]), "--token", TOKEN,
        "--features", str(table), "--id-column", "customer", "--name", "breast-demo",
        "--state-dir", str(state), "--ids", "s0001,s0002", "--out", str(out),
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    assert out.read_text().splitlines()[0] == "customer,score_0,score_1"
    assert pd.read_csv(out, dtype={"customer": str})["customer"].tolist() == ["s0001", "s0002"]


def test_a_refused_token_exits_2_with_the_reason(party_b: dict[str, Path | str]) -> None:
    url = str(party_b["url"])
    unknown = run_cli("a", "check", "--server", url, "--token", "not-a-token-0123456789")
    dashed = run_cli("a", "check", "--server", url, "--token=-not-a-token-0123456789")
    issued = run_cli(
        "b", "token", "issue", "--name", "brief", "--expires", "1s",
        "--data-dir", str(party_b["data_dir"]),
    )  # fmt: skip
    token = issued.stdout.strip()
    assert token.startswith("fl_"), token  # never "-...", which a command line takes for a flag
    expired = run_cli("a", "check", "--server", url, "--token", token)
    deadline = time.monotonic() + 120  # a bound for a hang: the token is valid for 1 s
    while "expired at" not in expired.stderr and expired.returncode == 0:
        assert time.monotonic() < deadline, "the token never expired"
        expired = run_cli("a", "check", "--server", url, "--token", token)

    assert unknown.returncode == 2, unknown.stderr
    assert "Unauthorized (401): unknown or revoked token" in unknown.stderr
    assert "fedlite-b token issue" in unknown.stderr  # who can fix it
    assert dashed.returncode == 2 and "unknown or revoked token" in dashed.stderr, dashed.stderr
    assert expired.returncode == 2, expired.stderr
    assert "the token 'brief' expired at" in expired.stderr


def test_predict_with_the_same_config_finds_a_run_trained_with_a_flag_override(
    party_b: dict[str, Path | str], tmp_path: Path
) -> None:
    url, features, state = str(party_b["url"]), Path(party_b["features"]), tmp_path / "a"
    code, _out, err = _train(url, features, state)  # --config breast.toml --steps 4
    assert code == 0, err
    common = ["--server", url, "--token", TOKEN, "--features", str(features),
              "--config", str(DEMO_CONFIG), "--state-dir", str(state)]  # fmt: skip

    scored = run_cli("a", "predict", *common, "--ids", "s0001")
    evaluated = run_cli("a", "evaluate", *common)
    changed = run_cli("a", "predict", *common, "--ids", "s0001", "--steps", "9")
    repeated = run_cli("a", "predict", *common, "--ids", "s0001", "--steps", "4")  # as trained

    assert scored.returncode == 0, scored.stderr
    assert scored.stdout.splitlines()[1].startswith("s0001,")
    assert evaluated.returncode == 0, evaluated.stderr
    assert math.isfinite(json.loads(evaluated.stdout)["loss"])
    assert changed.returncode == 2 and "run.steps: a trained run's config cannot change" in (
        changed.stderr
    )
    assert repeated.returncode == 0, repeated.stderr  # a flag that repeats the run is no change


def test_serve_export_with_a_wrong_id_column_is_one_line(
    party_b: dict[str, Path | str], tmp_path: Path
) -> None:
    url, features, state = str(party_b["url"]), Path(party_b["features"]), tmp_path / "a"
    code, _out, err = _train(url, features, state)
    assert code == 0, err
    export = tmp_path / "export"
    exported = run_cli(
        "a", "export", "--name", "breast-demo", "--state-dir", str(state), "--out", str(export)
    )
    assert exported.returncode == 0, exported.stderr
    script = str(REPO_ROOT / "examples" / "serve_export.py")

    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, script, "party-a", "--export", str(export), *args,
             "--out", str(tmp_path / "z.npz")],
            capture_output=True, text=True, timeout=300,
            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip

    wrong = serve("--features", str(features), "--id-column", "customer")
    missing = serve("--features", str(party_b["customers"]), "--id-column", "customer")
    right = serve("--features", str(features))

    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert wrong.stderr.strip().count("\n") == 0
    assert "no id column 'customer'" in wrong.stderr and "its columns: id, f00" in wrong.stderr
    assert missing.returncode == 0, missing.stderr  # the same rows under another id column
    assert right.returncode == 0, right.stderr


def test_a_table_too_large_for_party_bs_body_limit_is_refused_before_the_psi(
    tmp_path: Path,
) -> None:
    """The PSI request travels whole (35 bytes an id): over party B's max_body_bytes, party
    A says so before sending anything, naming the setting, the value that takes it and how
    many ids would fit, instead of a 413 that tells it to send a smaller body."""
    from party_b.store.audit import AuditFilter, audit_entries

    features, labels = demo_tables(tmp_path)
    small = Settings(
        data_dir=tmp_path / "b",
        labels=labels,
        tokens=f"a:{TOKEN}",
        limits={"max_body_bytes": 16 * 1024},  # 569 ids make a 19,946-byte PSI request
    )
    app = create_app(small)
    with live_server(app) as url:
        refused = run_cli(
            "a", "align", "--server", url, "--token", TOKEN, "--features", str(features),
            "--state-dir", str(tmp_path / "a"),
        )  # fmt: skip
    with app.state.sessions() as db:
        psi = audit_entries(db, AuditFilter(action="psi"))

    assert refused.returncode == 2, refused.stderr
    message = refused.stderr.strip()
    assert "the PSI request for 569 ids is 19,946 bytes" in message, message
    assert "party B's limit of 16,384 bytes" in message
    assert "FEDLITE_B_LIMIT_MAX_BODY_BYTES to at least 19,946" in message
    assert "align a table of at most about 467 ids" in message
    assert psi == []  # nothing reached party B's PSI
