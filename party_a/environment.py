"""The FEDLITE_A_* environment variables party A reads, and the check that refuses any other
(a typo would otherwise silently fall back to a default). Its own small module: every
``fedlite-a`` command runs the check, and it needs neither pydantic nor the run config.
"""

import difflib
from collections.abc import Mapping

from party_a.errors import ConfigError

__all__ = ["ENVIRONMENT", "check_environment"]

# Every FEDLITE_A_* variable party A reads; any other is a mistake (as an unknown TOML key is).
ENVIRONMENT = {
    "FEDLITE_A_SERVER": "party B's base URL (--server)",
    "FEDLITE_A_TOKEN": "the API token party B issued (--token)",
    "FEDLITE_A_CA_BUNDLE": "CA certificates to trust for party B (--ca-bundle)",
    "FEDLITE_A_CLIENT_CERT": "party A's client certificate for mutual TLS (--client-cert)",
    "FEDLITE_A_CLIENT_KEY": "its private key (--client-key)",
    "FEDLITE_A_STATE_DIR": "party A's state directory (--state-dir)",
}


def check_environment(environ: Mapping[str, str]) -> None:
    """ConfigError for a FEDLITE_A_* variable party A does not read (a typo would otherwise
    silently fall back to a default)."""
    unknown = sorted(
        k for k in environ if k.upper().startswith("FEDLITE_A_") and k not in ENVIRONMENT
    )
    if not unknown:
        return
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name.upper(), ENVIRONMENT, n=1)
        lines.append(f"  {name}" + (f" (did you mean {close[0]}?)" if close else ""))
    raise ConfigError(
        "unknown environment variable(s):\n"
        + "\n".join(lines)
        + f"\nparty A reads only {', '.join(ENVIRONMENT)}"
    )
