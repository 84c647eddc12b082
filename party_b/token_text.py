"""The text of a new bearer token, the one secret an operator copies into a shell.

Kept free of heavy imports: the operator commands and the stack launcher make tokens too.
"""

import secrets

__all__ = ["TOKEN_PREFIX", "new_token"]

TOKEN_PREFIX = "fl_"


def new_token(nbytes: int = 32) -> str:
    """A fresh token: ``nbytes`` random bytes as URL-safe base64 (43 characters for 32),
    after ``fl_``.

    Why the prefix: a bare ``secrets.token_urlsafe`` begins with ``-`` one time in 64, and a
    command line then reads ``--token -Xy..`` as two flags (argparse: "expected one
    argument"); a fixed prefix also lets a secret scanner recognise a leaked token.
    """
    return TOKEN_PREFIX + secrets.token_urlsafe(nbytes)
