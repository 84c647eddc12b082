"""The experiments' data: each task's party A features and party B labels, from ../shared/data.

Every task is a pair (``FeatureTable`` for party A, a ``LabelSource`` for party B) keyed by the
same sample ids, exactly what the product's two parties hold. The horizontal tasks also give
both sides the client of every sample (a FEMNIST writer, a Shakespeare speaking role, a
synthetic Stack Overflow client), which the 'clients' batch schedule needs.

| task          | party A (features)                 | party B (labels)                          |
|---------------|------------------------------------|-------------------------------------------|
| femnist       | 28x28 images, ink 1 on background 0| 62 classes                                |
| so_tag        | term frequencies of the title words| 100 tags, multi-hot (Recall@5)            |
| shakespeare   | 30 word ids per sequence           | the next word of each position (-100 pad) |
| breast        | FATE breast_hetero host columns    | FATE guest: label + its own 10 columns    |
| default_credit| FATE default_credit host columns   | FATE guest: label + its own 13 columns    |

The data is read from ``$FEDLITE_DATA`` or the read-only ``../shared/data`` beside the
repository and never copied. Loaders are cached per process.
"""

from __future__ import annotations

import ast
import functools
import gzip
import json
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from party_a.features import FeatureTable, load_features
from party_b.labels import LabelSource, load_label_table
from shared.schedule import SCHEDULE_VERSION, split_train_eval

__all__ = [
    "ClassLabels",
    "TASKS",
    "TagLabels",
    "TaskData",
    "TokenLabels",
    "data_dir",
    "label_source_from_env",
    "load_task",
]

TASK_ENV = "FEDLITE_EXPERIMENT_TASK"  # JSON {"task": ..., "options": {...}} for party B's factory
PAD, OOV, BOS, EOS = 0, 1, 2, 3  # Shakespeare special tokens; words start at 4
IGNORE = -100  # sequence targets that take no part in loss or accuracy (party_b.top.IGNORE)


def data_dir() -> Path:
    """``$FEDLITE_DATA``, else ``../shared/data`` next to this repository."""
    env = os.environ.get("FEDLITE_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


# ---------------------------------------------------------------------------------------------
# Label sources (party B): the LabelSource protocol of party_b.labels
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassLabels:
    """One class per row: targets (n,) int64."""

    row_ids: list[str]
    labels: np.ndarray  # (n,) int64
    num_outputs: int
    row_groups: list[str] | None = None
    task: Literal["classification"] = "classification"
    side_width: int = 0
    accuracy_excludes: tuple[int, ...] = ()
    prediction_excludes: tuple[int, ...] = ()
    labeled: np.ndarray | None = None  # every row has a label

    @property
    def ids(self) -> list[str]:
        return self.row_ids

    @property
    def groups(self) -> list[str] | None:
        return self.row_groups

    def targets(self, rows: np.ndarray) -> Tensor:
        return torch.from_numpy(self.labels[rows])

    def side(self, rows: np.ndarray) -> Tensor:
        return torch.zeros((len(rows), 0))


@dataclass(frozen=True)
class TagLabels:
    """Several tags per row: targets (n, tags) float32 multi-hot."""

    row_ids: list[str]
    tags: np.ndarray  # (n, num_tags) uint8
    row_groups: list[str] | None = None
    task: Literal["multilabel"] = "multilabel"
    side_width: int = 0
    accuracy_excludes: tuple[int, ...] = ()
    prediction_excludes: tuple[int, ...] = ()
    labeled: np.ndarray | None = None  # every row has a label

    @property
    def ids(self) -> list[str]:
        return self.row_ids

    @property
    def num_outputs(self) -> int:
        return int(self.tags.shape[1])

    @property
    def groups(self) -> list[str] | None:
        return self.row_groups

    def targets(self, rows: np.ndarray) -> Tensor:
        return torch.from_numpy(self.tags[rows].astype(np.float32))

    def side(self, rows: np.ndarray) -> Tensor:
        return torch.zeros((len(rows), 0))


@dataclass(frozen=True)
class TokenLabels:
    """The next token of every position: targets (n * T,) int64, row-major, -100 = padding.

    The loss counts every non-padding target, OOV and EOS included (FedJAX's ``train_loss``
    masks padding only). Accuracy by default is FedJAX's ``accuracy_in_vocab`` of the paper's
    Stack Overflow next-word model: EOS targets (and padding) left out, the argmax taken with
    pad / oov / bos / eos masked, so an OOV target always counts as a mistake. The pre-audit
    accuracy (``accuracy_excludes=(OOV,)``, no prediction mask) left OOV targets out and
    scored EOS.
    """

    row_ids: list[str]
    next_tokens: np.ndarray  # (n, T) int64
    vocab_size: int  # words + 4 specials
    row_groups: list[str] | None = None
    task: Literal["sequence"] = "sequence"
    side_width: int = 0
    accuracy_excludes: tuple[int, ...] = (EOS,)
    prediction_excludes: tuple[int, ...] = (PAD, OOV, BOS, EOS)
    labeled: np.ndarray | None = None  # every row has a label

    @property
    def ids(self) -> list[str]:
        return self.row_ids

    @property
    def num_outputs(self) -> int:
        return self.vocab_size

    @property
    def groups(self) -> list[str] | None:
        return self.row_groups

    def targets(self, rows: np.ndarray) -> Tensor:
        return torch.from_numpy(self.next_tokens[rows].reshape(-1))

    def side(self, rows: np.ndarray) -> Tensor:
        return torch.zeros((len(rows), 0))


# ---------------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskData:
    """Both parties' data of one task and the split model that fits it."""

    name: str
    model: str  # a shared.models name
    bottom: dict[str, Any]  # party A's bottom kwargs
    top: dict[str, Any]  # top kwargs party A sends (party B fills in the output width)
    features: FeatureTable  # party A
    labels: LabelSource  # party B
    notes: dict[str, Any] = field(default_factory=dict)  # sizes, for the records


def _freeze(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True)


def load_task(name: str, **options: Any) -> TaskData:
    """The task ``name`` (see ``TASKS``) with loader ``options`` (e.g. ``max_clients``)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    return _load_cached(name, _freeze(options))


@functools.cache
def _load_cached(name: str, frozen: str) -> TaskData:
    return TASKS[name](**json.loads(frozen))


def label_source_from_env() -> LabelSource:
    """Party B's factory for ``fedlite-b serve --label-source``: the task named in
    ``$FEDLITE_EXPERIMENT_TASK`` (JSON ``{"task": ..., "options": {...}}``)."""
    spec = json.loads(os.environ[TASK_ENV])
    return load_task(spec["task"], **spec.get("options", {})).labels


def _keep_clients(groups: np.ndarray, max_clients: int | None) -> np.ndarray:
    """Row mask of the first ``max_clients`` clients in name order (smoke tests)."""
    if max_clients is None:
        return np.ones(len(groups), dtype=bool)
    return np.isin(groups, np.unique(groups)[:max_clients])


def femnist(*, max_clients: int | None = None) -> TaskData:
    """FEMNIST (LEAF, 5% non-IID sample): writers are clients.

    Train rows plus the test rows of writers that also have train rows (LEAF's own per-writer
    90/10 split); the run's ``eval_fraction`` draws the held-out set from these. The 79
    writers that appear only in test are left out: they have no training data.
    """
    npz = np.load(data_dir() / "femnist_leaf_subset" / "femnist_leaf_subset_uint8.npz")
    in_train = np.isin(npz["writer_test"], npz["writer_train"])
    x = np.concatenate([npz["x_train"], npz["x_test"][in_train]])
    y = np.concatenate([npz["y_train"], npz["y_test"][in_train]]).astype(np.int64)
    writers = np.concatenate([npz["writer_train"], npz["writer_test"][in_train]])
    keep = _keep_clients(writers, max_clients)
    x, y, writers = x[keep], y[keep], writers[keep]
    ids = [f"femnist-{i:05d}" for i in range(len(y))]
    groups = writers.tolist()
    # LEAF stores ink dark on a white background (1.0); FedJAX's EMNIST preprocessing feeds
    # 1 - pixels, background 0, and so do we: with zero-bias convolutions a white background
    # lights up every activation and hides the strokes.
    pixels = 1.0 - x.reshape(len(x), 784).astype(np.float32) / np.float32(255.0)
    return TaskData(
        name="femnist",
        model="femnist_cnn",
        bottom={},
        top={},
        features=FeatureTable(
            ids=ids, x=pixels, columns=[f"p{i}" for i in range(784)], groups=groups
        ),
        labels=ClassLabels(row_ids=ids, labels=y, num_outputs=62, row_groups=groups),
        notes={"rows": len(ids), "clients": len(set(groups)), "classes": 62},
    )


_SO_TOKEN = re.compile(r"[a-z0-9#+.]+")


def so_bag_of_words(
    docs: list[list[str]], vocab_size: int, *, binary: bool = False
) -> tuple[np.ndarray, dict[str, int]]:
    """(n, |vocab|) float32 bags of ``docs`` (token lists) and the vocabulary {word: column}.

    The vocabulary is the ``vocab_size`` most frequent words over all docs (ties: first seen).
    Not binary: x[i, w] = count of w in doc i / len(doc i) -- TFF's ``reduce_mean`` of one-hot
    rows over a vocabulary plus one OOV column that is then dropped, so OOV words count in the
    denominator. An empty doc is all zeros. Binary: x[i, w] = 1 if w occurs in doc i.
    """
    counts = Counter(w for doc in docs for w in doc)
    vocab = {w: i for i, (w, _) in enumerate(counts.most_common(vocab_size))}
    x = np.zeros((len(docs), len(vocab)), dtype=np.float32)
    for row, doc in enumerate(docs):
        cols = [vocab[w] for w in doc if w in vocab]
        if binary:
            x[row, cols] = 1.0
        elif doc:
            np.add.at(x[row], cols, np.float32(1.0 / len(doc)))
    return x, vocab


def so_tag(
    *,
    vocab_size: int = 1000,
    cut_dim: int = 2000,
    client_rows: int = 125,
    max_clients: int | None = None,
    bag: Literal["frequency", "binary"] = "frequency",
) -> TaskData:
    """Stack Overflow titles -> 100 tags; the data has no users, so clients are a synthetic IID
    partition into groups of ``client_rows`` rows (seeded).

    Features: the bag of words of the title over the ``vocab_size`` most frequent title words
    (occurrences over all 30,000 rows). ``bag="frequency"`` is the paper's (TFF's / FedJAX's
    Stack Overflow tag preprocessing): each word's count divided by the number of words of
    the title, out-of-vocabulary words included in that number, so a row sums to the share of
    in-vocabulary words (<= 1). ``bag="binary"`` is the 0/1 bag the experiments used before
    the audit (docs/AUDIT.md).
    """
    if bag not in ("frequency", "binary"):
        raise ValueError(f"bag must be 'frequency' or 'binary', got {bag!r}")
    df = pd.read_csv(
        data_dir() / "stackoverflow_tags_hse" / "validation.tsv.gz",
        sep="\t",
        keep_default_na=False,
    )
    x, vocab = so_bag_of_words(
        [_SO_TOKEN.findall(t.lower()) for t in df["title"]], vocab_size, binary=bag == "binary"
    )
    tag_lists = [ast.literal_eval(t) for t in df["tags"]]
    tag_names = sorted({t for ts in tag_lists for t in ts})
    tag_index = {t: i for i, t in enumerate(tag_names)}
    tags = np.zeros((len(df), len(tag_names)), dtype=np.uint8)
    for row, ts in enumerate(tag_lists):
        tags[row, [tag_index[t] for t in ts]] = 1
    order = np.random.default_rng(0x50).permutation(len(df))
    client_of = np.empty(len(df), dtype=np.int64)
    client_of[order] = np.arange(len(df)) // client_rows
    groups_all = np.array([f"so{c:04d}" for c in client_of])
    keep = _keep_clients(groups_all, max_clients)
    ids = [f"so-{i:05d}" for i in np.flatnonzero(keep)]
    groups = groups_all[keep].tolist()
    return TaskData(
        name="so_tag",
        model="so_tag",
        bottom={"vocab_size": len(vocab), "cut_dim": cut_dim},
        top={},
        features=FeatureTable(ids=ids, x=x[keep], columns=list(vocab), groups=groups),
        labels=TagLabels(row_ids=ids, tags=tags[keep], row_groups=groups),
        notes={
            "rows": len(ids),
            "clients": len(set(groups)),
            "vocab": len(vocab),
            "tags": len(tag_names),
            "bag": bag,
        },
    )


_LEGACY_ACCURACY: dict[str, Any] = {"accuracy_excludes": (OOV,), "prediction_excludes": ()}
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|[.,!?;:]")


def shakespeare(
    *,
    vocab_words: int = 2000,
    seq_len: int = 30,
    hidden: int = 256,
    max_clients: int | None = None,
    accuracy: Literal["fedjax", "legacy"] = "fedjax",
) -> TaskData:
    """Federated Shakespeare (TFF), word-level next-token prediction; clients = speaking roles.

    Each role's snippets (train and test files together, in order) become one token stream
    ``<bos> words <eos> <bos> ...`` of lower-cased words and punctuation, cut into sequences
    of ``seq_len`` + 1 tokens (the last one padded). Input: the first ``seq_len`` tokens;
    target: the next token of each position, -100 where the input is padding. Vocabulary: the
    ``vocab_words`` most frequent words over the train file, plus pad / oov / bos / eos.
    ``accuracy``: "fedjax" is FedJAX's accuracy_in_vocab (``TokenLabels``); "legacy" the
    experiments' accuracy before the audit (OOV targets left out, EOS scored, no mask).
    """
    if accuracy not in ("fedjax", "legacy"):
        raise ValueError(f"accuracy must be 'fedjax' or 'legacy', got {accuracy!r}")
    root = data_dir() / "shakespeare_tff"
    streams: dict[str, list[str]] = {}
    train_counts: Counter[str] = Counter()
    for split in ("train", "test"):
        with gzip.open(root / f"shakespeare_{split}.jsonl.gz", "rt") as fh:
            for line in fh:
                row = json.loads(line)
                words = _WORD.findall(row["snippet"].lower())
                if not words:
                    continue
                streams.setdefault(row["client_id"], []).extend(["<bos>", *words, "<eos>"])
                if split == "train":
                    train_counts.update(words)
    vocab = {w: i + 4 for i, (w, _) in enumerate(train_counts.most_common(vocab_words))}
    special = {"<bos>": BOS, "<eos>": EOS}
    clients = sorted(streams)
    if max_clients is not None:
        clients = clients[:max_clients]
    inputs, targets, groups = [], [], []
    for client in clients:
        tokens = np.array([special.get(w, vocab.get(w, OOV)) for w in streams[client]])
        for start in range(0, len(tokens) - 1, seq_len):
            window = tokens[start : start + seq_len + 1]
            x = np.full(seq_len, PAD, dtype=np.int64)
            y = np.full(seq_len, IGNORE, dtype=np.int64)
            x[: len(window) - 1] = window[:-1]
            y[: len(window) - 1] = window[1:]
            inputs.append(x)
            targets.append(y)
            groups.append(client)
    ids = [f"sh-{i:06d}" for i in range(len(inputs))]
    vocab_size = len(vocab) + 4
    return TaskData(
        name="shakespeare",
        model="next_token_lstm",
        bottom={"vocab_size": vocab_size, "embed_dim": 96, "hidden": hidden, "cut_dim": 96},
        top={},
        features=FeatureTable(
            ids=ids, x=np.stack(inputs), columns=[f"t{i}" for i in range(seq_len)], groups=groups
        ),
        labels=TokenLabels(
            row_ids=ids,
            next_tokens=np.stack(targets),
            vocab_size=vocab_size,
            row_groups=groups,
            **({} if accuracy == "fedjax" else _LEGACY_ACCURACY),
        ),
        notes={
            "rows": len(ids),
            "clients": len(clients),
            "vocab": vocab_size,
            "seq_len": seq_len,
            "accuracy": accuracy,
        },
    )


def _fate(
    pair: str,
    *,
    hidden: int = 64,
    cut_dim: int = 32,
    standardize: Literal["all", "train"] = "all",
    split_seed: int = 0,
    eval_fraction: float = 0.2,
) -> TaskData:
    """FATE's hetero pair read by the product's own loaders: guest = party B, host = party A.

    Both loaders z-score every column over the whole table, the held-out rows included (the
    product's behaviour, docs/AUDIT.md). ``standardize="train"`` refits both parties' columns
    on the training rows only: the rows that a run with seed ``split_seed`` and
    ``eval_fraction`` trains on (aligned order = sorted common ids, ``split_train_eval``).
    """
    if standardize not in ("all", "train"):
        raise ValueError(f"standardize must be 'all' or 'train', got {standardize!r}")
    root = data_dir() / "fate_hetero"
    labels = load_label_table(
        root / f"{pair}_hetero_guest.csv.gz", id_column="id", label_column="y", feature_columns=None
    )
    features = load_features(
        root / f"{pair}_hetero_host.csv.gz", id_column="id", feature_columns=None, standardize=True
    )
    if standardize == "train":
        aligned = sorted(set(features.ids) & set(labels.ids))
        train_pos, _ = split_train_eval(
            len(aligned), seed=split_seed, eval_fraction=eval_fraction, version=SCHEDULE_VERSION
        )
        train_ids = {aligned[p] for p in train_pos}
        features = replace(features, x=_zscore_on(features.x, features.ids, train_ids))
        labels = replace(labels, features=_zscore_on(labels.features, labels.ids, train_ids))
    return TaskData(
        name=pair,
        model="tabular_mlp",
        bottom={"in_features": features.x.shape[1], "hidden": [hidden], "cut_dim": cut_dim},
        top={"hidden": [32]},
        features=features,
        labels=labels,
        notes={
            "rows": len(features.ids),
            "host_features": int(features.x.shape[1]),
            "guest_features": labels.side_width,
            "standardize": standardize,
        },
    )


def _zscore_on(x: np.ndarray, ids: list[str], fit_ids: set[str]) -> np.ndarray:
    """``x`` (n, k) z-scored with the mean / std of the rows whose id is in ``fit_ids``.

    z-scoring is invariant to a positive affine map of a column, so refitting the loaders'
    whole-table z-scores on the training rows equals fitting the raw columns on them."""
    fit = x[[i in fit_ids for i in ids]]
    std = fit.std(axis=0, keepdims=True)
    z: np.ndarray = (x - fit.mean(axis=0, keepdims=True)) / np.where(std > 0, std, 1.0)
    return z.astype(np.float32)


def breast(**options: Any) -> TaskData:
    return _fate("breast", **options)


def default_credit(**options: Any) -> TaskData:
    return _fate("default_credit", **options)


TASKS: dict[str, Callable[..., TaskData]] = {
    "femnist": femnist,
    "so_tag": so_tag,
    "shakespeare": shakespeare,
    "breast": breast,
    "default_credit": default_credit,
}
