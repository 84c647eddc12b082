"""The package as installed: its metadata says Python 3.11-3.13, every module imports on the
oldest of them (the one this suite runs on: syntax or stdlib calls of 3.12+ would fail here),
the product's dependencies carry no development tool, and `make` picks a supported Python
from what is on PATH."""

import os
import subprocess
import sys
import tomllib
from importlib.metadata import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("party_a", "party_b", "shared", "api_schemas")
DEV_TOOLS = {"pytest", "ruff", "mypy", "locust", "matplotlib", "faiss-cpu", "schemathesis",
             "hypothesis", "h5py", "trustme", "uv"}  # fmt: skip


def _project() -> dict[str, object]:
    project: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def test_metadata_supports_python_3_11_to_3_13() -> None:
    installed = metadata("fedlite-vfl")
    supported = SpecifierSet(installed["Requires-Python"])

    assert supported == SpecifierSet(str(_project()["requires-python"]))  # installed is current
    assert all(v in supported for v in ("3.11", "3.12", "3.13"))
    assert not any(v in supported for v in ("3.10", "3.14"))
    assert sys.version_info[:2] in ((3, 11), (3, 12), (3, 13))


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    code = (
        "import importlib, pkgutil\n"
        f"for name in {PACKAGES!r}:\n"
        "    package = importlib.import_module(name)\n"
        "    for info in pkgutil.walk_packages(package.__path__, name + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error::SyntaxWarning", "-c", code],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip

    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_product_install_carries_no_development_tool() -> None:
    dependencies = {Requirement(r).name.lower() for r in _project()["dependencies"]}  # type: ignore[attr-defined]

    assert not dependencies & DEV_TOOLS
    dev = " ".join(_project()["optional-dependencies"]["dev"])  # type: ignore[index]
    for extra in ("test", "lint", "loadtest", "experiments", "postgres"):
        assert extra in dev  # make test installs every extra


@pytest.mark.parametrize(
    ("on_path", "picked"),
    [
        (["python3.13", "python3.12"], "python3.12"),
        (["python3.13", "python3.11"], "python3.11"),
        (["python3.13"], "python3.13"),
    ],
)
def test_make_picks_the_first_supported_python_on_path(
    tmp_path: Path, on_path: list[str], picked: str
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in on_path:
        (bin_dir / name).symlink_to(sys.executable)
    make = "/usr/bin/make" if Path("/usr/bin/make").exists() else "make"
    # .ci/run exports PYTHON, which `PYTHON ?=` rightly prefers: the choice from PATH is what
    # a user without it gets.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "MAKEFLAGS", "MFLAGS")}

    done = subprocess.run(
        [make, "-s", "-f", str(ROOT / "Makefile"), "--eval", "show: ; $(info $(PYTHON))", "show"],
        capture_output=True, text=True, cwd=tmp_path,
        env={**env, "PATH": str(bin_dir)},
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(bin_dir / picked)
