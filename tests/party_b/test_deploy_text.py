"""docs/DEPLOY.md says what the product does (issue 34's papercuts of the text):

* every ``fedlite-b token issue`` it shows parses with the real CLI and names the database it
  acts on (``--data-dir`` or ``--database-url``): without it the token lands in
  ``./fedlite-b-data`` of wherever the operator stands, and party B never sees it (the
  scorer-token example of section 3 did);
* section 13 no longer says the run leases are "not built yet" while section 9 describes
  them (they are: ``party_b/store/leases.py``).
"""

import re
import shlex
from pathlib import Path

from party_b.ops.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "docs" / "DEPLOY.md"


def _shell_commands(text: str) -> list[str]:
    """The commands of the ```sh blocks, continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        commands += [line.split(" #")[0].strip() for line in joined.splitlines()]
    return [c for c in commands if c]


def test_every_token_issue_example_parses_and_names_its_database() -> None:
    issued = [
        c for c in _shell_commands(DEPLOY.read_text()) if c.startswith("fedlite-b token issue")
    ]

    assert len(issued) >= 5
    for command in issued:
        words = [w.replace('"$DATABASE_URL"', "x") for w in shlex.split(command)]
        args = build_parser().parse_args(words[1:])
        assert args.data_dir is not None or args.database_url is not None, command


def test_section_13_describes_the_leases_as_built() -> None:
    text = DEPLOY.read_text()
    section = text[text.index("## 13. Replicas") : text.index("## 14. Kubernetes")]

    assert "not built yet" not in section and "not guarded yet" not in section
    assert "lease" in section
