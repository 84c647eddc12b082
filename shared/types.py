"""Names both parties and the wire share, each defined once here.

Imports nothing of ours: ``api_schemas`` (which imports no other package of ours) may read it.
"""

from typing import Final, Literal, TypeAlias

__all__ = ["DECLARED_TYPES", "DIGEST_BYTES", "MAX_STEP", "CodewordCoding", "Task", "WireFloat"]

# What party B's labels are and so which loss and metrics the top model uses.
Task: TypeAlias = Literal["classification", "multilabel", "sequence"]

# Float widths of codebooks and raw activations on the wire (docs/PROTOCOL.md section 3).
WireFloat: TypeAlias = Literal["float32", "float16"]

# How a quantized chunk's codewords travel: bit-packed, or rANS-coded at their entropy.
CodewordCoding: TypeAlias = Literal["packed", "ans"]

DIGEST_BYTES: Final = 8  # batch / id-set digests are 8-byte strings
MAX_STEP: Final = 2**63 - 1  # steps and counts fit a signed 64-bit int on any peer and database

# The types an operator may declare a table's column of, with what each means (party A's
# [data] keys and both command lines' flags; shared.preparation applies them)
DECLARED_TYPES: Final = (
    ("categorical", "categories whatever they hold (e.g. integer codes)"),
    ("numeric", "numbers (a word in one is an error naming its row)"),
)
