"""First contact says what it does and fails fast:

* ``fedlite-a train`` prints each phase as it begins (features, the run, the PSI, the
  alignment, training, evaluation), in order, with the seconds since it started;
* ``fedlite-b serve`` logs its own start-up phases (label table, tokens, the PSI set-up built
  in the background);
* a wrong column name is told from the table's header, before torch or the rows load, on
  both sides.
"""

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from party_b.api import create_app
from party_b.settings import Settings
from tests.utils.cli import DEMO_CONFIG, REPO_ROOT, TOKEN, demo_tables, run_cli
from tests.utils.live import live_server
from tests.utils.servers import PartyBProcess


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    root = tmp_path_factory.mktemp("first-contact")
    features, labels = demo_tables(root)
    settings = Settings(data_dir=root / "b", labels=labels, tokens=f"a:{TOKEN}")
    with live_server(create_app(settings)) as url:
        yield url, features, labels


def test_train_says_each_phase_as_it_begins(world: tuple[str, Path, Path], tmp_path: Path) -> None:
    url, features, _labels = world
    ran = run_cli(
        "a", "train", "--server", url, "--token", TOKEN, "--features", str(features),
        "--config", str(DEMO_CONFIG), "--name", "phases", "--steps", "4",
        "--state-dir", str(tmp_path / "a"),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr

    phases = re.findall(r"^fedlite-a: \[\s*([\d.]+) s\] (.*)$", ran.stderr, flags=re.M)
    said = [text for _seconds, text in phases]
    expected = [
        "checking",
        "loading features from",
        "features: 569 rows, 20 columns",
        "creating run 'phases' at party B",
        "PSI: 569 ids here, 569 at party B",
        "PSI: 569 ids in common",
        "aligning the run on 569 ids",
        "aligned: 569 samples",
        "training: steps 1 to 4",
        "evaluating on",
    ]
    assert len(said) == len(expected), said
    for text, start in zip(said, expected, strict=True):
        assert text.startswith(start), (text, start)
    seconds = [float(s) for s, _text in phases]
    assert seconds == sorted(seconds)

    again = run_cli(
        "a", "evaluate", "--server", url, "--token", TOKEN, "--features", str(features),
        "--name", "phases", "--state-dir", str(tmp_path / "a"),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "run 'phases': finished at party B, step 4" in again.stderr
    assert "evaluating the eval split" in again.stderr
    assert "PSI" not in again.stderr  # aligned already: no PSI, no alignment


_PROBE = """
import json, sys
from {module} import main
code = main(sys.argv[1:])
print(json.dumps({{"code": code, "torch": "torch" in sys.modules}}))
"""


def _probe(module: str, *argv: str, cwd: Path) -> tuple[int, bool, str]:
    ran = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module), *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    answer = json.loads(ran.stdout.strip().splitlines()[-1])
    return answer["code"], answer["torch"], ran.stderr


def test_a_wrong_column_is_told_from_the_header_before_torch_loads(
    world: tuple[str, Path, Path], tmp_path: Path
) -> None:
    url, features, labels = world
    code, torch, err = _probe(
        "party_a.cli", "train", "--server", url, "--token", TOKEN, "--features", str(features),
        "--id-column", "ID", "--config", str(DEMO_CONFIG), "--state-dir", str(tmp_path / "a"),
        cwd=tmp_path,
    )  # fmt: skip
    assert code == 2 and not torch, err
    assert "no id column (--id-column) 'ID' (did you mean 'id'?)" in err
    said = [line for line in err.strip().splitlines() if not line.startswith("fedlite-a: [")]
    assert "its columns: id, f00," in err and len(said) == 1

    code, torch, err = _probe(
        "party_b.ops.cli", "serve", "--labels", str(labels), "--label-column", "label",
        "--data-dir", str(tmp_path / "b"), "--tokens", f"a:{TOKEN}", cwd=tmp_path,
    )  # fmt: skip
    assert code == 2 and not torch, err
    assert "no label column (--label-column) 'label'" in err
    assert len(err.strip().splitlines()) == 1, err


def test_party_b_logs_its_start_up_phases(world: tuple[str, Path, Path], tmp_path: Path) -> None:
    _url, _features, labels = world
    server = PartyBProcess(tmp_path / "b", labels, {"a": TOKEN}, extra_args=["--log-level", "info"])
    server.start()
    try:
        deadline = time.monotonic() + 120  # a bound for a hang, not a speed: load decides it
        while "PSI set-up ready" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.1)  # the PSI set-up is built in the background after start-up
    finally:
        server.stop()
    log = server.log()
    order = [
        "starting party B: loading torch",
        "loading the label table",
        "label table: 569 ids (569 labelled), 2 classes, 10 feature columns",
        "1 active API token(s); mutual TLS off",
        "building the PSI set-up of 569 ids",
        "PSI set-up ready",
    ]
    at = [log.find(line) for line in order]
    assert -1 not in at and at == sorted(at), (at, log)
