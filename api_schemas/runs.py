"""JSON bodies of party B's run endpoints (``/v1/runs...``)."""

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from shared.types import MAX_STEP

# A model's keyword arguments as plain JSON values (ints, floats, lists of ints).
ModelKwargs = dict[str, int | float | list[int]]
Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# A moment with its time zone (party B sends UTC, as "...Z"); a naive one is refused.
Moment = Annotated[AwareDatetime, Field(description="RFC 3339 date-time with a time zone")]


class RunStatus(StrEnum):
    CREATED = "created"  # config accepted, waiting for sample alignment
    TRAINING = "training"  # aligned; steps are accepted
    FINISHED = "finished"  # no more steps; evaluate and predict still served


class _Strict(BaseModel):
    """Base of every model the API reads: no unknown fields, no coercion between JSON types.

    Strict: ``"10"``, ``true`` and ``10.0`` are not the integer 10 (a string once rolled a run
    back), ``1`` is not ``true``; an integer is still a valid float. NaN/Infinity parse from
    JSON (Python's json module accepts them) but cannot be sent back as JSON, and no
    hyper-parameter is meaningful at infinity: refuse them on the way in.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


# The downlink of every run stored before the field existed (and of one stored with
# grad_dtype "float32"): the original float32 StepResponse.
STORED_DOWNLINK = "float32"
# The default downlink of a new run (docs/PERFORMANCE.md, "The default downlink", measured
# it): top-k keeping 1 of every TOPK_FRACTION values of a gradient row (FEMNIST's top-256 of
# d = 9216) where that keeps at least TOPK_MIN_K a row, SMALL_D_DOWNLINK below.
TOPK_FRACTION = 36
TOPK_MIN_K = 256
SMALL_D_DOWNLINK = "int4"


def default_downlink(cut_dim: int) -> str:
    """The downlink of a new run that names none, from the width d of its cut layer.

    ``topk:k=ceil(d/36)`` where k >= 256 (d > 9180), ``int4`` below: top-256 of FEMNIST's
    d = 9216 cost no accuracy at 2,000 steps, while top-k at d/36 of d = 96 (next-token)
    lost a fifth of it; 4-bit gradients matched float32 at d = 32 and 96.
    """
    k = -(-cut_dim // TOPK_FRACTION)
    return f"topk:k={k}" if k >= TOPK_MIN_K else SMALL_D_DOWNLINK


class QuantizerSpec(_Strict):
    """How party A compresses activations; party B refuses steps that do not match it."""

    mode: Literal["pq", "raw"] = Field(description="'pq' = FedLite, 'raw' = SplitFed baseline")
    q: int | None = Field(default=None, ge=1, description="subvectors per activation row")
    R: int = Field(default=1, ge=1, description="groups of subvector positions")
    L: int | None = Field(default=None, ge=1, le=65536, description="centroids per group")
    codebook_dtype: Literal["float32", "float16"] = "float32"

    @model_validator(mode="after")
    def _pq_needs_q_and_L(self) -> Self:
        if self.mode == "pq":
            if self.q is None or self.L is None:
                raise ValueError("mode 'pq' needs q and L")
            if self.q % self.R:
                raise ValueError(f"R={self.R} must divide q={self.q}")
        return self


class ShuffleSchedule(_Strict):
    """Seeded epochs over the aligned train samples; each step is one batch of batch_size."""

    kind: Literal["shuffle"] = "shuffle"


class ClientSchedule(_Strict):
    """The paper's horizontal setting: every sample belongs to a client (both parties hold the
    client column); each step samples ``clients_per_step`` clients and ``batch_size`` rows of
    each, and each client's rows travel as their own independently quantized chunk."""

    kind: Literal["clients"]
    clients_per_step: int = Field(ge=1, description="clients sampled per step")


BatchScheduleSpec = Annotated[ShuffleSchedule | ClientSchedule, Field(discriminator="kind")]


class OptimizerSpec(_Strict):
    name: Literal["sgd", "adam", "adagrad"]
    lr: float = Field(gt=0, le=100)
    momentum: float = Field(default=0.0, ge=0, lt=1, description="SGD only")
    weight_decay: float = Field(default=0.0, ge=0)
    initial_accumulator: float = Field(
        default=0.0,
        ge=0,
        le=100,
        description="AdaGrad only: the sum of squared gradients starts here (torch 0, optax and "
        "FedJAX 0.1)",
    )
    eps: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="AdaGrad only: added to the accumulator before the square root (optax's "
        "placement); None = torch's 1e-10 added after it",
    )


# A feature party's name: it appears in URL paths (docs/PROTOCOL.md section 12).
PARTY_NAME = r"^[a-z][a-z0-9_-]{0,31}$"
MAX_PARTIES = 16
Fusion = Literal["concat", "sum", "mean"]


class FeatureParty(_Strict):
    """One feature party of a run with several (docs/PROTOCOL.md section 12.1): its name,
    the width of its activations and how they and its gradients travel."""

    name: str = Field(pattern=PARTY_NAME, description="unique in the run; used in URL paths")
    cut_dim: int = Field(ge=1, description="d_p, the width of this party's activations")
    quantizer: QuantizerSpec
    downlink: str = Field(
        default_factory=lambda data: default_downlink(data.get("cut_dim", 1)),
        min_length=1,
        max_length=80,
        description="how this party's gradients travel back (as RunCreate.downlink); "
        "default: the rule of docs/PROTOCOL.md section 4.2.1 for its cut_dim",
    )

    @model_validator(mode="after")
    def _pq_fits_cut_dim(self) -> Self:
        q = self.quantizer.q
        if self.quantizer.mode == "pq" and q is not None and self.cut_dim % q:
            raise ValueError(
                f"party {self.name}: quantizer.q={q} must divide cut_dim={self.cut_dim}"
            )
        return self


def _none(value: object) -> bool:
    return value is None


class RunCreate(_Strict):
    """Everything party B needs to train its top model for one run."""

    name: str = Field(min_length=1, max_length=120, description="a label for humans")
    model: str = Field(description="split-model name, e.g. 'tabular_mlp', 'femnist_cnn'")
    top: ModelKwargs = Field(
        default_factory=dict,
        description="top-model kwargs; num_classes/side_features are filled in by party B",
    )
    cut_dim: int | None = Field(
        default=None,
        ge=1,
        description="d, the width of party A's activations; with parties, the fused width "
        "the top model reads (filled in)",
    )
    quantizer: QuantizerSpec | None = Field(
        default=None,
        exclude_if=_none,
        description="how party A compresses activations (required without parties)",
    )
    optimizer: OptimizerSpec = Field(description="party B's optimizer for the top model")
    batch_size: int = Field(
        ge=1, description="rows per training step (per client with the 'clients' schedule)"
    )
    schedule: BatchScheduleSpec = Field(
        default_factory=ShuffleSchedule, description="how each step's rows are chosen"
    )
    steps: int = Field(ge=1, description="training steps the run will take")
    seed: int = Field(ge=0, lt=2**63)
    schedule_version: Literal[1, 2] = Field(
        default=2,
        description="how the train/eval split and every step's rows are derived from the seed: "
        "2 = SHA-256 draws (docs/PROTOCOL.md, 'Derived values'); 1 = numpy's generator, the "
        "version of runs stored before the field existed (not reproducible outside Python)",
    )
    checkpoint_interval: int = Field(default=50, ge=1, description="steps between checkpoints")
    eval_fraction: float = Field(default=0.2, ge=0, lt=1)
    use_side_features: bool = Field(
        default=True, description="feed party B's own feature columns to the top model"
    )
    grad_dtype: Literal["float32", "float16"] = Field(
        default="float32",
        description="kept for compatibility: 'float16' is downlink 'float16' when downlink is "
        "not given",
    )
    downlink: str | None = Field(
        # a run that names none gets the rule's choice for its cut_dim (validated before it);
        # a run with parties has one per party instead (None here)
        default_factory=lambda data: default_downlink(data.get("cut_dim") or 1),
        min_length=1,
        max_length=80,
        exclude_if=_none,
        description="how party B's gradients travel back: float32, float16, bfloat16, int8, "
        "int4, int2, int1, topk:k=<per row>, pq:q=<sub-vectors>,L=<codewords>[,R=<groups>] "
        "(docs/PROTOCOL.md section 4.2.1); default: topk:k=ceil(cut_dim/36) where that is "
        "at least 256, int4 below",
    )
    parties: list[FeatureParty] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PARTIES,
        exclude_if=_none,
        description="the run's feature parties, in fusion order, each with its own width, "
        "quantizer and downlink (docs/PROTOCOL.md section 12); none: one feature party, the "
        "caller, with cut_dim, quantizer and downlink above",
    )
    fusion: Fusion | None = Field(
        default=None,
        exclude_if=_none,
        description="with parties: how party B fuses their activations: concat (default), "
        "or sum / mean where every cut_dim is the same",
    )

    @classmethod
    def from_stored(cls, config: Mapping[str, Any]) -> Self:
        """A run spec as party B stored it: a run stored before ``schedule_version`` existed
        used version 1, and one stored before ``downlink`` existed sends its ``grad_dtype``,
        and each keeps doing so, so that it resumes bit-identically. (Every run stored since
        holds its resolved ``downlink``: a new default never reaches a stored run.)"""
        if config.get("parties") is not None:  # stored since parties existed: all there
            return cls.model_validate(config)
        downlink = config.get("grad_dtype", STORED_DOWNLINK)
        return cls.model_validate({"schedule_version": 1, "downlink": downlink, **config})

    @model_validator(mode="before")
    @classmethod
    def _resolve_downlink(cls, data: Any) -> Any:
        """No ``downlink``: ``grad_dtype = "float16"`` means float16, otherwise the default
        for new runs (``default_downlink`` of the cut_dim, filled in by the field's factory).
        Both given and disagreeing is an error rather than a silent choice."""
        if not isinstance(data, dict):
            return data
        if data.get("parties") is not None:
            return _with_parties(data)
        if data.get("fusion") is not None:
            raise ValueError("fusion: a run fuses the activations of its parties; give parties")
        grad_dtype = data.get("grad_dtype", "float32")
        downlink = data.get("downlink")
        if downlink is None:
            rest = {k: v for k, v in data.items() if k != "downlink"}  # an explicit null too
            return {**rest, "downlink": "float16"} if grad_dtype == "float16" else rest
        if grad_dtype == "float16" and downlink != "float16":
            raise ValueError(
                f"grad_dtype 'float16' and downlink {downlink!r} disagree: give downlink only"
            )
        return data

    @model_validator(mode="after")
    def _pq_fits_cut_dim(self) -> Self:
        if self.parties is not None:
            return self  # each party's own, checked in FeatureParty
        if self.cut_dim is None or self.quantizer is None:
            raise ValueError("cut_dim and quantizer are required (or parties, each with its own)")
        q = self.quantizer.q
        if self.quantizer.mode == "pq" and q is not None and self.cut_dim % q:
            raise ValueError(f"quantizer.q={q} must divide cut_dim={self.cut_dim}")
        return self

    @model_validator(mode="after")
    def _parties_fit_together(self) -> Self:
        """Unique names; sum and mean need one width; cut_dim is the fused width."""
        if self.parties is None:
            return self
        names = [p.name for p in self.parties]
        if len(set(names)) != len(names):
            raise ValueError(f"party names must be unique, got {names}")
        widths = [p.cut_dim for p in self.parties]
        if self.fusion in ("sum", "mean") and len(set(widths)) != 1:
            raise ValueError(f"fusion {self.fusion!r} needs one cut_dim for all parties: {widths}")
        fused = sum(widths) if self.fusion == "concat" else widths[0]
        if self.cut_dim is not None and self.cut_dim != fused:
            raise ValueError(
                f"cut_dim={self.cut_dim} is not the fused width {fused} of the parties "
                f"({self.fusion}); leave it out"
            )
        self.cut_dim = fused
        return self

    @property
    def width(self) -> int:
        """d of the top model's input: party A's cut_dim, or the parties' fused width."""
        assert self.cut_dim is not None, "validated: set or filled in"
        return self.cut_dim

    def feature_parties(self) -> list[FeatureParty]:
        """The run's feature parties; a run without ``parties`` has one, named ``a``."""
        if self.parties is not None:
            return list(self.parties)
        assert self.quantizer is not None and self.downlink is not None
        return [
            FeatureParty(
                name="a", cut_dim=self.width, quantizer=self.quantizer, downlink=self.downlink
            )
        ]


def _with_parties(data: dict[str, Any]) -> dict[str, Any]:
    """A run with parties: no run-wide quantizer, downlink or grad_dtype (each party has its
    own); fusion concat unless given."""
    given = [k for k in ("quantizer", "downlink") if data.get(k) is not None]
    if data.get("grad_dtype", "float32") != "float32":
        given.append("grad_dtype")
    if given:
        raise ValueError(f"{', '.join(given)}: give each party its own, in parties, not the run")
    fusion = data.get("fusion") or "concat"
    return {**data, "fusion": fusion, "quantizer": None, "downlink": None}


class AlignmentInfo(BaseModel):
    aligned: int = Field(description="samples in the intersection")
    train: int
    eval: int


class RunPrivacyOut(BaseModel):
    """The label-privacy policy party B gave the run when it was created (docs/PRIVACY.md):
    what every party's replies of this run may tell of party B's labels."""

    policy: str = Field(
        description="the policy as party B's switch spells it (`fedlite-b serve --privacy`), "
        "e.g. `metrics=none,label_epsilon=2,forward_loss=true` (the default, `protected`)"
    )
    label_dp: bool = Field(
        description="label differential privacy: the run trains and evaluates on randomized "
        "labels (evaluations are on them too), drawn once per party B label table"
    )
    epsilon: float | None = Field(
        description="the run's label-DP epsilon; null when the policy gives no formal bound"
    )
    label_keep: float | None = Field(
        default=None,
        description="the probability that a randomized label is the true one, "
        "e^epsilon / (e^epsilon + classes - 1): with an evaluation's `label_rate` it debiases "
        "the evaluation into an estimate of the true-label metrics; null without label DP "
        "and under RRWithPrior (`prior_fraction`), whose rows have no common rate",
    )
    metrics: str = Field(description="what step replies carry: `all`, `loss` or `none`")
    predict_train_ids: bool = Field(
        description="whether predict scores ids of the run's training split (403 otherwise)"
    )


class RunOut(BaseModel):
    id: str
    name: str
    status: RunStatus
    config: RunCreate
    created_at: Moment
    step: int = Field(description="last training step applied (0 = none)")
    checkpoints: list[int] = Field(description="steps party B can resume from")
    alignment_key: str = Field(description="hex HMAC key for hashing sample ids (this run only)")
    alignment: AlignmentInfo | None = None
    num_classes: int
    classes: list[str] | None = Field(
        default=None,
        description="the label table's classes as text, in score order: score_i (a predict "
        "answer's column i) is the probability of classes[i], and with two classes classes[1] "
        "is the positive class AUC ranks; null where party B's labels are not a table of "
        "named classes (or from a party B older than it)",
    )
    side_features: int = Field(description="party B feature columns the top model uses")
    model_sha256: str | None = Field(
        default=None,
        description="SHA-256 of the top model's parameters at ``step`` (GET /v1/runs/{id} of "
        "an aligned run only): equal checksums mean bit-identical top models",
    )
    privacy: RunPrivacyOut | None = Field(
        default=None,
        description="the run's label-privacy policy (null from a party B older than it)",
    )


class PartyOut(BaseModel):
    """What a party token may act for: one feature party of one run (GET /v1/party)."""

    run_id: str
    party: str


class RunList(BaseModel):
    runs: list[RunOut]


class AlignmentIn(_Strict):
    hashed_ids: list[Hex] = Field(
        min_length=1,
        description="HMAC-SHA256(alignment_key, id), hex, of the ids in the private set "
        "intersection (GET/POST /v1/psi); party A sends no other id",
    )


class AlignmentOut(BaseModel):
    intersection: list[str] = Field(
        description="hashed ids both parties hold, in the order of party B's raw ids"
    )
    train: int
    eval: int


class ResumeIn(_Strict):
    from_step: int = Field(ge=0, le=MAX_STEP, description="a step listed in the run's checkpoints")


class StepLogOut(BaseModel):
    step: int
    loss: float | None
    accuracy: float | None
    bytes_in: int
    bytes_out: int
    decode_ms: float
    compute_ms: float
    total_ms: float
    created_at: Moment


class StepLogPage(BaseModel):
    steps: list[StepLogOut]


class EvalResultOut(BaseModel):
    step: int
    split: str
    n: int
    loss: float | None
    metrics: dict[str, float | None]
    created_at: Moment
