"""Raw categorical values to row ids, vectorised: what `schema.ENCODINGS` promise.

numpy and pyarrow only (the data workers never import torch). `encode_columns` takes
the columns of one batch and returns, for each, `(ids, bad)`: int64 row ids in
`[0, num_embeddings)` and a boolean mask of the values that cannot be encoded (the
caller turns those rows into counted, named bad rows). Hashes are fixed functions of
the bytes or the integer (FNV-1a 64 then splitmix64's finaliser), the same on every
host, process and run: a restore, another worker count or another machine maps a value
to the same row.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from airflow_ett.trainer.schema import SparseFeature

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
#: Hex digit value of every byte, -1 for a byte that is not one.
_HEX = np.full(256, -1, dtype=np.int64)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i
#: A categorical value longer than this cannot be a hex id (16 digits is 64 bits).
_MAX_HEX_DIGITS = 16

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
#: One feature's raw values, flat: a pyarrow column (strings, binary or integers) or a
#: numpy array of integers (the `.npy` form's).
Column: TypeAlias = "pa.Array | pa.ChunkedArray | npt.NDArray[np.generic]"


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser: avalanche, so `% rows` uses every bit."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MUL1
        z = (z ^ (z >> np.uint64(27))) * _MUL2
        return z ^ (z >> np.uint64(31))


def _binary(values: pa.Array | pa.ChunkedArray) -> tuple[IntArray, npt.NDArray[np.uint8],
                                                         BoolArray]:
    """(offsets [n+1], bytes, valid [n]) of a string/binary column, zero-copy."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    arr = values.cast(pa.large_binary())
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64, count=arr.offset + n + 1)[arr.offset:]
    data = (np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None and bufs[2].size
            else np.zeros(1, dtype=np.uint8))
    valid = (np.ones(n, dtype=bool) if arr.null_count == 0
             else np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
    return offsets.astype(np.int64, copy=False), data, valid


def _bytewise(offsets: IntArray, data: npt.NDArray[np.uint8]
              ) -> tuple[IntArray, IntArray, int]:
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    return starts, lengths, int(lengths.max()) if len(lengths) else 0


def hash_bytes(values: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.uint64]:
    """FNV-1a 64 of each value's bytes (a null hashes as the empty value: a missing
    value is a bucket of its own, as Criteo's empty cells are), then mixed."""
    offsets, data, _ = _binary(values)
    starts, lengths, longest = _bytewise(offsets, data)
    h = np.full(len(starts), _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(longest):
            more = lengths > j
            byte = data[np.where(more, starts + j, 0)].astype(np.uint64)
            h = np.where(more, (h ^ byte) * _FNV_PRIME, h)
    return _mix(h ^ lengths.astype(np.uint64))


def parse_hex(values: pa.Array | pa.ChunkedArray) -> tuple[npt.NDArray[np.uint64], BoolArray]:
    """Each value read as a hexadecimal integer (empty or null: 0, as TorchRec's
    `int(v or "0", 16)`); bad: a byte that is not a hex digit, or more than 16 digits."""
    offsets, data, _ = _binary(values)
    starts, lengths, longest = _bytewise(offsets, data)
    out = np.zeros(len(starts), dtype=np.uint64)
    bad = lengths > _MAX_HEX_DIGITS
    with np.errstate(over="ignore"):
        for j in range(min(longest, _MAX_HEX_DIGITS)):
            more = lengths > j
            digit = _HEX[data[np.where(more, starts + j, 0)]]
            bad |= more & (digit < 0)
            out = np.where(more, out * np.uint64(16) + np.maximum(digit, 0).astype(np.uint64),
                           out)
    return out, bad


def parse_decimal(values: pa.Array | pa.ChunkedArray) -> tuple[IntArray, BoolArray]:
    """Each string value read as a decimal integer; bad: anything else (null included)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    try:
        parsed = pc.cast(values, pa.int64())
        ok = np.asarray(parsed.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        return np.asarray(parsed.fill_null(0).to_numpy(zero_copy_only=False), np.int64), ~ok
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        out = np.zeros(len(values), dtype=np.int64)
        bad = np.zeros(len(values), dtype=bool)
        for i, item in enumerate(values.to_pylist()):
            try:
                out[i] = int(item)
            except (TypeError, ValueError, OverflowError):
                bad[i] = True
        return out, bad


def _ints(values: Column) -> tuple[IntArray, BoolArray]:
    """An integer column as int64 and its nulls (a null integer id is a bad value)."""
    if isinstance(values, np.ndarray):
        return values.astype(np.int64, copy=False), np.zeros(len(values), dtype=bool)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    nulls = ~np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    ints = np.asarray(values.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False),
                      dtype=np.int64)
    return ints, nulls


def _is_text(values: Column) -> bool:
    if isinstance(values, np.ndarray):
        return False
    t = values.type
    return bool(pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
                or pa.types.is_large_binary(t))


def _codes(values: Column, encoding: str, text: bool
           ) -> tuple[npt.NDArray[np.uint64], BoolArray]:
    """The 64-bit code of each value before the table size is applied: a hash, a hex or
    decimal integer (as uint64), and the values that have none."""
    if encoding == "hash":
        if text:
            return hash_bytes(values), np.zeros(len(values), dtype=bool)
        ints, nulls = _ints(values)
        return _mix(ints.astype(np.uint64) ^ np.uint64(0x5EED)), nulls
    if encoding == "hex":
        return parse_hex(values)
    ints, bad = parse_decimal(values) if text else _ints(values)
    bad = bad | (ints < 0)
    return np.where(bad, 0, ints).astype(np.uint64), bad


def encode_columns(items: list[tuple[Column, SparseFeature]],
                   vocabularies: dict[int, pa.Array] | None = None
                   ) -> list[tuple[IntArray, BoolArray]]:
    """Row ids and bad values of several features' columns (flat values each): features
    of one encoding and kind are encoded in one vectorised pass (a batch has tens of
    features; one pass each would cost a millisecond apiece in numpy overhead alone).
    `vocabularies[i]`: item i's vocabulary (encoding 'vocabulary')."""
    out: list[tuple[IntArray, BoolArray] | None] = [None] * len(items)
    groups: dict[tuple[str, bool], list[int]] = {}
    for i, (values, feature) in enumerate(items):
        if feature.encoding == "vocabulary":
            out[i] = (by_vocabulary(values, (vocabularies or {})[i]),
                      np.zeros(len(values), dtype=bool))
        else:
            groups.setdefault((feature.encoding, _is_text(values)), []).append(i)
    for (encoding, text), members in groups.items():
        columns = [items[i][0] for i in members]
        joined: Column
        if text:
            joined = pa.concat_arrays([_flat(c).cast(pa.large_binary()) for c in columns])
        else:
            ints = [_ints(c) for c in columns]
            joined = np.concatenate([values for values, _ in ints])
            nulls = np.concatenate([null for _, null in ints])
        codes, bad = _codes(joined, encoding, text)
        if not text:
            bad = bad | nulls
        sizes = [len(c) for c in columns]
        rows = np.repeat(np.asarray([items[i][1].num_embeddings for i in members],
                                    dtype=np.uint64), sizes)
        if encoding == "id":
            bad = bad | (codes >= rows)
            ids = np.where(bad, 0, codes).astype(np.int64)
        else:
            ids = (codes % rows).astype(np.int64)
        for i, lo, hi in zip(members, np.cumsum([0, *sizes[:-1]]), np.cumsum(sizes),
                             strict=True):
            out[i] = (ids[lo:hi], bad[lo:hi])
    return [x for x in out if x is not None]


def _flat(values: Column) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values


def by_vocabulary(values: Column, vocabulary: pa.Array) -> IntArray:
    """Each value's line in the vocabulary (1-based), 0 for a value not in it."""
    text = values if not isinstance(values, np.ndarray) else pa.array(values.astype(str))
    found = pc.index_in(text.cast(pa.binary()), value_set=vocabulary)
    return np.asarray(found.fill_null(-1).to_numpy(zero_copy_only=False), np.int64) + 1
