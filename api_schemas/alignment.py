"""JSON body of party B's PSI endpoint (``GET /v1/psi``); the PSI messages are msgpack."""

from pydantic import BaseModel, Field

__all__ = ["PsiInfo"]


class PsiInfo(BaseModel):
    dataset_version: str = Field(
        description="public name of party B's current id set; party A caches intersections "
        "under it, and it changes when party B's label table changes"
    )
    protocol: str = Field(description="the PSI construction party B speaks (see docs)")
    size: int = Field(description="ids party B holds (|Y|; the PSI set-up reveals it anyway)")
    max_ids: int = Field(description="most ids one PSI request may hold")
    alignment_formats: list[str] = Field(
        default=["json"],
        description="how party B takes a run's alignment: 'json' (POST /v1/runs/{id}/alignment, "
        "hex keys) and 'keys' (POST /v1/runs/{id}/alignment/keys, msgpack key prefixes, "
        "docs/PROTOCOL.md 8.1); absent from a party B older than 'keys': json only",
    )
    max_batch: int | None = Field(
        default=None,
        description="most rows (ids) one step, evaluate or predict request may hold "
        "(FEDLITE_B_LIMIT_MAX_BATCH); a client sends a longer list of ids to predict in "
        "requests of at most this many; absent from a party B older than it",
    )
    max_body_bytes: int | None = Field(
        default=None,
        description="largest request body party B reads (FEDLITE_B_LIMIT_MAX_BODY_BYTES); "
        "absent from a party B older than it",
    )
