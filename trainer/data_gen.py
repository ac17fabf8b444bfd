"""The synthetic click log: its spec (`ClickLogSpec`, a `data_source.Source`) and its samples.

numpy and the standard library only, never torch: the pipeline's worker processes are
*spawned* (forking a process that holds torch's threads is unsafe, and the trainer runs
under torchrun), so each worker pays for every import of the modules it unpickles.
Keeping torch out of them makes a worker start in a fraction of a second instead of
seconds; `data.py` turns the arrays into tensors and a `KeyedJaggedTensor` in the
consumer, where torch is already loaded.

Determinism: sample `i` is a pure function of `(seed, i)`, computed with counter-based
hashing (splitmix64 over uint64 arrays) rather than a sequential RNG. Every batch can be
generated alone, in any worker, in any order, so resuming at cursor `c` reproduces exactly
the samples from `c` on, and the number of workers or ranks never changes the data.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from airflow_ett.trainer.data_source import RawBatch, check_cursor, check_rank, is_int

__all__ = [
    "ClickLogSpec",
    "generate_rank_batch",
    "generate_samples",
]

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)

# Stream tags: independent hash streams derived from one seed.
_TAG_SAMPLES = 0x5A4D_504C_4553  # per-sample values (dense, ids, label noise)
_TAG_PARAMS = 0x5041_5241_4D53  # the hidden "true model" the labels come from

# Label model. The logit is  LABEL_BIAS + dense part + sparse part, each part scaled to a
# standard deviation of about 1.5, so the best achievable log loss (about 0.45) is well
# below the 0.69 of a constant guess: a model that learns shows a clearly falling loss.
LABEL_BIAS = -0.5
_PART_STD = 1.5
# Ids are skewed towards low rows (id = floor(n * u**ID_SKEW)): real click logs have hot
# ids, and a per-id effect is only learnable for ids seen often enough.
ID_SKEW = 2.0


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's output function, vectorised: a bijective, well-mixing uint64 hash.

    numpy wraps uint64 array arithmetic modulo 2**64 silently, which is what we want.
    """
    z = x + _GOLDEN
    z ^= z >> _S30
    z *= _MUL1
    z ^= z >> _S27
    z *= _MUL2
    z ^= z >> _S31
    return z


def _mix(value: int) -> int:
    """splitmix64 of one Python int (kept in uint64 arrays so that overflow wraps quietly)."""
    return int(_splitmix64(np.array([value & _MASK64], dtype=np.uint64))[0])


def _unit(h: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
    """Map hashes to uniform floats in [0, 1) using their top 53 bits (exact in float64)."""
    return (h >> _S11).astype(np.float64) * (1.0 / (1 << 53))


def _spec_error(name: str, value: object, rule: str) -> ValueError:
    return ValueError(f"ClickLogSpec.{name} {rule}, got {value!r}")


def _spec_tables(raw: object) -> list[tuple[str, int]]:
    """`ClickLogSpec.tables` as (name, int rows) pairs: non-empty, names unique."""
    bad = _spec_error
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise bad("tables", raw, "must be a sequence of (name, num_embeddings)")
    tables: list[tuple[str, int]] = []
    for i, entry in enumerate(raw):
        if isinstance(entry, str | bytes) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise bad(f"tables[{i}]", entry, "must be a (name, num_embeddings) pair")
        name, rows = entry
        if not isinstance(name, str) or not name:
            raise bad(f"tables[{i}] name", name, "must be a non-empty string")
        if not is_int(rows) or int(rows) <= 0:
            raise bad(f"tables[{i}] ({name!r}) num_embeddings", rows, "must be an integer > 0")
        tables.append((name, int(rows)))
    if not tables:
        raise bad("tables", raw, "must name at least one sparse feature")
    names = [n for n, _ in tables]
    if len(set(names)) != len(names):
        raise bad("tables", names, "must have unique feature names")
    return tables


@dataclass(frozen=True)
class ClickLogSpec:
    """What the synthetic click log looks like: the only input besides the cursor.

    `tables` lists `(feature name, num_embeddings)` in KeyedJaggedTensor key order; every
    sample has exactly `ids_per_feature` ids per feature, so batch shapes never vary and a
    compiled model never recompiles for the data. `batch_size` is per rank. Lists given for
    `tables` (from JSON or TOML) are normalised to tuples, so the spec stays hashable and
    picklable into spawned workers.
    """

    seed: int
    num_dense: int
    tables: tuple[tuple[str, int], ...]
    ids_per_feature: int
    batch_size: int

    def __post_init__(self) -> None:
        bad = _spec_error
        if not is_int(self.seed) or not 0 <= int(self.seed) <= _MASK64:
            raise bad("seed", self.seed, "must be an integer in [0, 2**64)")
        if not is_int(self.num_dense) or int(self.num_dense) < 0:
            raise bad("num_dense", self.num_dense, "must be an integer >= 0")
        if not is_int(self.ids_per_feature) or int(self.ids_per_feature) <= 0:
            raise bad("ids_per_feature", self.ids_per_feature, "must be an integer > 0")
        if not is_int(self.batch_size) or int(self.batch_size) <= 0:
            raise bad("batch_size", self.batch_size, "must be an integer > 0")
        tables = _spec_tables(self.tables)
        for attr in ("seed", "num_dense", "ids_per_feature", "batch_size"):
            object.__setattr__(self, attr, int(getattr(self, attr)))
        object.__setattr__(self, "tables", tuple(tables))

    @property
    def feature_names(self) -> list[str]:
        """The KJT keys, in order."""
        return [name for name, _ in self.tables]

    @property
    def num_features(self) -> int:
        return len(self.tables)

    @property
    def max_ids(self) -> tuple[int, ...]:
        """Ids per sample of each feature (all `ids_per_feature`): the fast batch's."""
        return (self.ids_per_feature,) * len(self.tables)

    def prepare(self) -> ClickLogSpec:
        """Nothing to index: every sample is generated from its cursor."""
        return self

    def rank_batch(self, cursor: int, rank: int = 0, world_size: int = 1) -> RawBatch:
        return generate_rank_batch(self, cursor, rank, world_size)


class _Params:
    """The hidden labelling model of one seed: dense weights and per-feature id-effect keys.

    Per-id effects are hashed on the fly from (feature key, id) instead of being stored,
    so tables of any size cost no memory.
    """

    def __init__(self, spec: ClickLogSpec) -> None:
        seed_key = _mix(spec.seed)
        self.sample_key = np.uint64(_mix(seed_key ^ _TAG_SAMPLES))
        param_key = _mix(seed_key ^ _TAG_PARAMS)
        d = spec.num_dense
        w_hash = _splitmix64(np.uint64(param_key) + np.arange(d, dtype=np.uint64) * _GOLDEN)
        self.dense_w = 2.0 * _unit(w_hash) - 1.0  # U(-1, 1): variance 1/3
        # x ~ U(-sqrt3, sqrt3) has variance 1, so var(x @ w) = d / 3.
        self.dense_scale = _PART_STD / math.sqrt(d / 3.0) if d else 0.0
        f_idx = np.arange(1, spec.num_features + 1, dtype=np.uint64)
        self.feature_keys = _splitmix64(np.uint64(param_key ^ 0xFEA7) + f_idx * _MUL1)
        # Mean of L effects U(-1, 1) per feature, summed over F features: var ~ F / (3 L).
        var = spec.num_features / (3.0 * spec.ids_per_feature)
        self.sparse_scale = _PART_STD / math.sqrt(var)
        slots = spec.num_dense + spec.num_features * spec.ids_per_feature + 1
        s_idx = np.arange(1, slots + 1, dtype=np.uint64)
        self.slot_keys = _splitmix64(self.sample_key ^ (s_idx * _MUL2))
        self.rows = np.array([rows for _, rows in spec.tables], dtype=np.float64)


_PARAMS_CACHE: dict[ClickLogSpec, _Params] = {}
_PARAMS_LOCK = threading.Lock()


def _params(spec: ClickLogSpec) -> _Params:
    with _PARAMS_LOCK:
        params = _PARAMS_CACHE.get(spec)
        if params is None:
            if len(_PARAMS_CACHE) > 32:
                _PARAMS_CACHE.clear()
            params = _PARAMS_CACHE[spec] = _Params(spec)
        return params


def generate_samples(
    spec: ClickLogSpec, first: int, count: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Samples `[first, first + count)` as `(dense [n, D], ids [F, n, L], labels [n])`.

    Each sample hashes its index into one uint64 per slot (D dense values, F*L ids, one
    label draw); nothing depends on neighbouring samples. Labels are Bernoulli draws
    (from the sample's own hashed uniform) of sigmoid(bias + w.x + per-id effects), a
    fixed function of the features that a DLRM can learn.
    """
    first = check_cursor(first, "first sample")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count!r}")
    p = _params(spec)
    d, f, ell = spec.num_dense, spec.num_features, spec.ids_per_feature
    idx = np.arange(count, dtype=np.uint64) + np.uint64(first)
    row = _splitmix64(p.sample_key + idx * _GOLDEN)  # [n]
    h = _splitmix64(row[:, None] ^ p.slot_keys[None, :])  # [n, slots]
    u = _unit(h)
    x = (2.0 * u[:, :d] - 1.0) * math.sqrt(3.0)  # [n, D], unit variance
    dense = x.astype(np.float32)
    u_ids = u[:, d : d + f * ell].reshape(count, f, ell)
    rows = p.rows[None, :, None]
    ids = np.minimum(np.floor(rows * u_ids**ID_SKEW), rows - 1).astype(np.int64)  # [n, F, L]
    effect_h = _splitmix64(p.feature_keys[None, :, None] + ids.astype(np.uint64) * _GOLDEN)
    effects = (2.0 * _unit(effect_h) - 1.0).mean(axis=2).sum(axis=1)  # [n]
    logit = LABEL_BIAS + p.sparse_scale * effects
    if d:
        logit = logit + p.dense_scale * (dense.astype(np.float64) @ p.dense_w)
    prob = 1.0 / (1.0 + np.exp(-logit))
    labels = (u[:, -1] < prob).astype(np.float32)
    return dense, np.ascontiguousarray(ids.transpose(1, 0, 2)), labels


def generate_rank_batch(
    spec: ClickLogSpec, cursor: int, rank: int = 0, world_size: int = 1
) -> RawBatch:
    """Rank `rank`'s share of the global batch at `cursor`: rows `[c + r*B, c + (r+1)*B)`.

    The returned cursor range is the global one, `[c, c + W*B)`, so progress reported by
    rank 0 moves the shared cursor by the whole step.
    """
    cursor = check_cursor(cursor)
    check_rank(rank, world_size)
    b = spec.batch_size
    dense, ids, labels = generate_samples(spec, cursor + rank * b, b)
    lengths = np.full(spec.num_features * b, spec.ids_per_feature, dtype=np.int32)
    return RawBatch(cursor, cursor + world_size * b, dense, ids.reshape(-1), lengths, labels)
