"""Party A's run configuration: a TOML file (``--config run.toml``), flags override it.

Example (every table but [run] is optional)::

    [run]
    name = "breast"              # the local name a run is resumed by
    model = "tabular_mlp"
    steps = 300
    batch_size = 32              # rows per step (per client with the 'clients' schedule)
    seed = 0
    checkpoint_interval = 25
    eval_fraction = 0.2
    use_side_features = true     # party B feeds its own columns to the top model
    # downlink = "int8"          # how party B's gradients travel back (docs/PROTOCOL.md
                                 # 4.2.1); unset: the default of the cut width d (int4 below
                                 # d = 9181, topk:k=ceil(d/36) above)
    schedule = { kind = "shuffle" }  # or { kind = "clients", clients_per_step = 10 }
    pipeline_depth = 1           # steps in flight (docs/PROTOCOL.md, "Pipelining")
    device = "cpu"               # where party A computes: "cpu", "cuda", "cuda:N" or "auto"
                                 # (a local choice: not part of the run, --device overrides it)
    # party = "telco"            # one feature party of a run with several (PROTOCOL.md 12)

    [model.bottom]               # party A's bottom model (in_features defaults to the data)
    hidden = [64]
    cut_dim = 32

    [model.top]                  # sent to party B
    hidden = [32]

    [quantizer]                  # mode = "raw" is the SplitFed baseline
    mode = "pq"
    q = 8
    L = 4
    R = 1
    lambda = 0.001               # gradient correction strength, party A's alone
    iterations = 10              # k-means Lloyd iterations per batch
    codewords = "packed"         # or "ans": entropy-coded where smaller (PROTOCOL.md 3.1)

    [optimizer.bottom]
    name = "adam"
    lr = 0.001

    [optimizer.top]
    name = "adam"
    lr = 0.001

    [data]
    feature_columns = []         # default: every column but the id (and the client column)
    standardize = true           # z-score the number columns (training rows' statistics)
    # group_column = "writer"    # the client of each row; the 'clients' schedule needs it
    # categorical = ["branch"]   # categories whatever they hold (text and booleans are)
    # numeric = ["score"]        # numbers (a word in them is an error naming the row)
    # drop = ["name"]            # columns the run never reads
    max_categories = 1000        # values a categorical column keeps, the most frequent
    min_frequency = 5            # a value in fewer training rows joins the "other" bucket
"""

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api_schemas import BatchScheduleSpec, OptimizerSpec, QuantizerSpec, RunCreate, ShuffleSchedule
from api_schemas.runs import PARTY_NAME
from party_a.environment import ENVIRONMENT, check_environment
from party_a.errors import ConfigError

if TYPE_CHECKING:
    from party_a.features import ColumnRules
    from shared.preparation import PreparationSettings

__all__ = ["ENVIRONMENT", "PartyAConfig", "check_environment", "load_config"]

ModelKwargs = dict[str, int | float | list[int]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunSection(_Strict):
    name: str = Field(min_length=1, max_length=120)
    model: str
    steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    schedule: BatchScheduleSpec = Field(default_factory=ShuffleSchedule)
    seed: int = Field(default=0, ge=0)
    checkpoint_interval: int = Field(default=50, ge=1)
    eval_fraction: float = Field(default=0.2, ge=0, lt=1)
    use_side_features: bool = True
    grad_dtype: Literal["float32", "float16"] = "float32"
    # party B's gradient representation; None: RunCreate's default for the cut_dim
    downlink: str | None = None
    # steps in flight at once (party_a.loop): 1 = send a step, wait, apply, as before
    pipeline_depth: int = Field(default=1, ge=1, le=16)
    # where this party A computes (shared.devices): a local execution choice, left out of the
    # run's fingerprint, so a run trained on one device is resumed, evaluated or served on
    # another
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda|cuda:[0-9]+|auto)$")
    # this party's name in a run with several feature parties (party B's operator created
    # the run and issued this party's token); None: a run of this party alone
    party: str | None = Field(default=None, pattern=PARTY_NAME)


class ModelSection(_Strict):
    bottom: ModelKwargs = Field(default_factory=dict)
    top: ModelKwargs = Field(default_factory=dict)


class QuantizerSection(QuantizerSpec):
    lambda_: float = Field(default=0.0, ge=0, alias="lambda")
    iterations: int = Field(default=10, ge=0)
    # step requests' codewords: "packed" (section 3) or "ans", rANS-coded at their empirical
    # entropy where that is smaller (docs/PROTOCOL.md 3.1); party B reads either
    codewords: Literal["packed", "ans"] = "packed"

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def spec(self) -> QuantizerSpec:
        return QuantizerSpec.model_validate(
            self.model_dump(include={"mode", "q", "R", "L", "codebook_dtype"})
        )


class OptimizerSection(_Strict):
    bottom: OptimizerSpec = Field(default_factory=lambda: OptimizerSpec(name="sgd", lr=0.1))
    top: OptimizerSpec = Field(default_factory=lambda: OptimizerSpec(name="sgd", lr=0.1))


class DataSection(_Strict):
    feature_columns: list[str] = Field(default_factory=list)
    standardize: bool = True
    group_column: str | None = None
    # what a column is, whatever the file suggests (party_a.features): integer codes are
    # categories, numbers stored as text are numbers; drop: columns the run never reads
    categorical: list[str] = Field(default_factory=list)
    numeric: list[str] = Field(default_factory=list)
    drop: list[str] = Field(default_factory=list)
    # a categorical column keeps its max_categories most frequent values seen in at least
    # min_frequency training rows; the rest share an "other" bucket (shared.preparation)
    max_categories: int = Field(default=1000, ge=1)
    min_frequency: int = Field(default=5, ge=1)

    def unset_preparation(self) -> set[str]:
        """The keys added with categories that are at their defaults: a run's fingerprint
        leaves them out, so that state directories from before them keep matching."""
        defaults = DataSection()
        keys = ("categorical", "numeric", "drop", "max_categories", "min_frequency")
        return {k for k in keys if getattr(self, k) == getattr(defaults, k)}

    def rules(self) -> "ColumnRules":
        from party_a.features import ColumnRules

        return ColumnRules(
            feature_columns=tuple(self.feature_columns),
            categorical=tuple(self.categorical),
            numeric=tuple(self.numeric),
            drop=tuple(self.drop),
        )

    def settings(self) -> "PreparationSettings":
        from shared.preparation import PreparationSettings

        return PreparationSettings(
            max_categories=self.max_categories, min_frequency=self.min_frequency
        )


class PartyAConfig(_Strict):
    run: RunSection
    model: ModelSection = Field(default_factory=ModelSection)
    quantizer: QuantizerSection = Field(
        default_factory=lambda: QuantizerSection.model_validate({"mode": "raw"})
    )
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    data: DataSection = Field(default_factory=DataSection)

    def check_model(self) -> None:
        """ConfigError for a model name the registry does not know. Not a validator: the
        registry loads torch (seconds), and reading a config (``finish``, ``show``, or
        ``train`` before its first line of output) should not."""
        from shared.models import MODEL_NAMES

        if self.run.model not in MODEL_NAMES:
            raise ConfigError(f"unknown model {self.run.model!r}; known: {list(MODEL_NAMES)}")

    def on_device(self, device: str | None) -> "PartyAConfig":
        """This config computing on ``device`` (None: as it is). The device is a local
        choice, no part of the run (its fingerprint leaves it out), so it may change for a
        trained run; it is checked when the trainer resolves it."""
        if device is None:
            return self
        return self.model_copy(update={"run": self.run.model_copy(update={"device": device})})

    def run_create(self, cut_dim: int) -> RunCreate:
        """The run as party B sees it (lambda and the bottom model stay with party A)."""
        # no downlink in the config: party B's default for new runs (RunCreate fills it in)
        downlink = {} if self.run.downlink is None else {"downlink": self.run.downlink}
        try:
            return RunCreate.model_validate(self._run_fields(cut_dim) | downlink)
        except ValidationError as exc:
            # one line per rule (e.g. "quantizer.q=5 must divide cut_dim=32"), not pydantic's
            # dump of the whole spec
            rules = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
            raise ConfigError(f"the run's config does not fit its model: {rules}") from None

    def _run_fields(self, cut_dim: int) -> dict[str, Any]:
        return {
            "name": self.run.name,
            "model": self.run.model,
            "top": self.model.top,
            "cut_dim": cut_dim,
            "quantizer": self.quantizer.spec(),
            "optimizer": self.optimizer.top,
            "batch_size": self.run.batch_size,
            "schedule": self.run.schedule,
            "steps": self.run.steps,
            "seed": self.run.seed,
            "checkpoint_interval": self.run.checkpoint_interval,
            "eval_fraction": self.run.eval_fraction,
            "use_side_features": self.run.use_side_features,
            "grad_dtype": self.run.grad_dtype,
        }


def load_config(path: Path | None, overrides: dict[str, Any]) -> PartyAConfig:
    """Read ``path`` (TOML) and apply dotted-key ``overrides`` ({"quantizer.L": 8, ...})."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"no such config file: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    for dotted, value in overrides.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"cannot set {dotted}: {part} is not a table")
        node[leaf] = value
    try:
        return PartyAConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [f"  {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        where = f" in {path}" if path else ""
        raise ConfigError(f"invalid configuration{where}:\n" + "\n".join(lines)) from None
