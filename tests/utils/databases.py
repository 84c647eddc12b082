"""Database URLs for party B's store tests: SQLite always, PostgreSQL when one is configured.

``FEDLITE_TEST_POSTGRES_URL`` names a server (``.ci/run`` starts one from Debian's packages and
sets it). Without it the PostgreSQL cases are skipped with the reason, except under CI, where
they must run. Each test gets a fresh database of its own, dropped afterwards.
"""

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

POSTGRES_ENV = "FEDLITE_TEST_POSTGRES_URL"


def postgres_server_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        message = (
            f"no PostgreSQL server configured: set {POSTGRES_ENV}, e.g. "
            "postgresql+psycopg://postgres@127.0.0.1:54329/postgres (.ci/run starts one)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return url


@contextmanager
def fresh_database(backend: str, tmp_path: Path) -> Iterator[str]:
    """A SQLAlchemy URL of an empty database on ``backend`` ('sqlite' or 'postgresql')."""
    if backend == "sqlite":
        tmp_path.mkdir(parents=True, exist_ok=True)
        yield f"sqlite:///{tmp_path / f'store-{secrets.token_hex(4)}.sqlite'}"
        return
    server = make_url(postgres_server_url())
    name = f"fedlite_test_{secrets.token_hex(6)}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
