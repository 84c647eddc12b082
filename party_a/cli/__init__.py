"""``fedlite-a``: party A's command line (the feature holder).

    fedlite-a align    --server URL --token T --features FILE --id-column id
                                             private set intersection with party B (cached)
    fedlite-a train    --server URL --token T --features FILE --id-column id --config run.toml
    fedlite-a evaluate (same flags)          held-out metrics, computed at party B
    fedlite-a predict  (same flags) --ids a,b,c   scores for given ids (serving)
    fedlite-a finish   --server URL --token T --name RUN   close a run left open (--no-finish)
    fedlite-a export   --name RUN --out DIR  the trained bottom model, transform and codebook
    fedlite-a runs     [--state-dir DIR]     the runs party A's state knows
    fedlite-a show / delete --server URL --token T --name RUN   inspect / delete a run
    fedlite-a ratio    --d 9216 --batch 20 --q 1152 --L 2   message sizes, no server needed
    fedlite-a check    --server URL --token T   is party B reachable and the token valid?
    fedlite-a demo-data --out FILE           party A's half of the bundled demo data

The token may come from FEDLITE_A_TOKEN and the server from FEDLITE_A_SERVER instead of flags
(keeps the secret out of the process list); any other FEDLITE_A_* variable is an error.
Party A's state (checkpoints, step log) lives in ``--state-dir`` (default FEDLITE_A_STATE_DIR,
else ./fedlite-a-state); ``train`` creates or resumes a run there, ``evaluate``, ``predict``
and ``finish`` only use one that ``train`` made. Global flags (-v, --version,
--torch-threads N) go anywhere.

Exit codes: 0 done; 1 party B refused the request or could not be reached; 2 a configuration
or usage error (bad flag, URL, certificate, config file, unknown run, a token party B does
not accept or whose scope does not cover the command), which retrying will not fix.
"""

import logging
import os
import sys
import time
from collections.abc import Sequence

from party_a.cli.parser import build_parser
from party_a.errors import ConfigError, FedliteError, Forbidden, Unauthorized
from party_a.phases import show_phases

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    args = build_parser().parse_args(argv)
    show_phases(sys.stderr, started=started)  # "loading features", "PSI: ...", as they happen
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    try:
        from party_a.environment import check_environment

        check_environment(os.environ)
        if args.torch_threads is not None:
            from shared import threads  # imports torch: only when asked

            threads.pin(args.torch_threads)  # the operator's count wins (shared.threads)
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"fedlite-a {args.command}: {exc}", file=sys.stderr)
        return 2
    except (Unauthorized, Forbidden) as exc:
        # a refused credential does not heal by retrying: exit 2, as for a wrong flag
        print(
            f"fedlite-a {args.command}: {exc} (party B's operator issues, renews and scopes "
            "tokens: fedlite-b token issue)",
            file=sys.stderr,
        )
        return 2
    except FedliteError as exc:
        print(f"fedlite-a {args.command}: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"fedlite-a {args.command}: {exc}", file=sys.stderr)
        return 2
    return code
