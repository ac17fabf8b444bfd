"""A small click log in the Criteo layout, generated (never downloaded), in three forms.

    python -m airflow_ett.examples.make_data --out DIR [--rows N] [--files K] [--seed S]

writes, for each of K parts (`day_<k>`):

- `day_<k>.tsv`: TorchRec's Criteo TSV (`torchrec.datasets.criteo`): no header, tab
  separated: label, 13 integer columns (`int_0`..`int_12`, some empty as in Criteo), 26
  categorical columns (`cat_0`..`cat_25`, 8-digit hex ids, some empty);
- `day_<k>.parquet`: the same rows as typed Parquet columns (label int8, int64 and string
  columns, empty cells as nulls);
- `day_<k>_dense.npy`, `_sparse.npy`, `_labels.npy`: TorchRec's preprocessed form, made
  from the TSV by TorchRec's own `BinaryCriteoUtils.tsv_to_npys`;
- `schema.json`: the `data.schema` that reads them (table sizes per feature).

Labels come from a hidden two-tower-like rule over a few features plus noise, so a model
that learns shows a falling loss. Deterministic in `--seed`: the same bytes every time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

DENSE: Final = 13
SPARSE: Final = 26
#: Distinct ids of each categorical column (a mix of small and large vocabularies).
VOCAB: Final = tuple(50 * (1 + (i * 7) % 20) for i in range(SPARSE))
#: Table size each feature is hashed into: a little larger than its vocabulary.
NUM_EMBEDDINGS: Final = tuple(2 * v for v in VOCAB)
MISSING: Final = 0.05  # share of empty cells


def schema() -> dict[str, Any]:
    """The `data.schema` for the generated files (Criteo names, hex ids)."""
    return {"sparse": {f"cat_{i}": NUM_EMBEDDINGS[i] for i in range(SPARSE)}}


def _rows(n: int, seed: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                                      npt.NDArray[np.int64], npt.NDArray[np.bool_],
                                      npt.NDArray[np.bool_]]:
    rng = np.random.default_rng(seed)
    # ids skewed to small indices (hot ids), mapped to stable 8-digit hex values
    u = rng.random((n, SPARSE))
    index = np.floor(np.asarray(VOCAB) * u ** 2).astype(np.int64)
    ids = (index * 2654435761 + np.arange(SPARSE) * 40503) % (16 ** 8)
    dense = np.floor(rng.exponential(5.0, (n, DENSE))).astype(np.int64)
    dense[rng.random((n, DENSE)) < 0.02] = -1
    effect_rng = np.random.default_rng(seed + 1)
    effects = [effect_rng.normal(0, 1, v) for v in VOCAB]
    user = sum(effects[i][index[:, i]] for i in range(0, 4))
    item = sum(effects[i][index[:, i]] for i in range(13, 17))
    logit = 0.8 * user * np.tanh(item) + 0.3 * np.log1p(np.maximum(dense[:, 0], 0)) - 1.0
    labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    dense_missing = rng.random((n, DENSE)) < MISSING
    cat_missing = rng.random((n, SPARSE)) < MISSING
    return labels, dense, ids, dense_missing, cat_missing


def _tsv(labels: Any, dense: Any, ids: Any, dense_missing: Any, cat_missing: Any) -> bytes:
    lines = []
    for r in range(len(labels)):
        cells = [str(int(labels[r]))]
        cells += ["" if dense_missing[r, j] else str(int(dense[r, j])) for j in range(DENSE)]
        cells += ["" if cat_missing[r, j] else f"{int(ids[r, j]):08x}" for j in range(SPARSE)]
        lines.append("\t".join(cells))
    return ("\n".join(lines) + "\n").encode()


def _parquet(path: Path, labels: Any, dense: Any, ids: Any, dense_missing: Any,
             cat_missing: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, Any] = {"label": pa.array(labels, type=pa.int8())}
    for j in range(DENSE):
        columns[f"int_{j}"] = pa.array(dense[:, j], type=pa.int64(), mask=dense_missing[:, j])
    for j in range(SPARSE):
        columns[f"cat_{j}"] = pa.array([f"{int(v):08x}" for v in ids[:, j]], type=pa.string(),
                                       mask=cat_missing[:, j])
    pq.write_table(pa.table(columns), path, row_group_size=4096)


def _npy(tsv: Path) -> None:
    """TorchRec's own conversion of the TSV (`BinaryCriteoUtils.tsv_to_npys`)."""
    from torchrec.datasets.criteo import BinaryCriteoUtils

    stem = str(tsv.with_suffix(""))
    BinaryCriteoUtils.tsv_to_npys(str(tsv), f"{stem}_dense.npy", f"{stem}_sparse.npy",
                                  f"{stem}_labels.npy")


def make(out: Path, *, rows: int = 20_000, files: int = 2, seed: int = 7,
         npy: bool = True) -> list[Path]:
    """Write the parts under `out` (created); returns the TSV files."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    per = -(-rows // files)
    for k in range(files):
        n = min(per, rows - k * per)
        parts = _rows(n, seed * 1000 + k)
        tsv = out / f"day_{k}.tsv"
        tsv.write_bytes(_tsv(*parts))
        _parquet(out / f"day_{k}.parquet", *parts)
        if npy:
            _npy(tsv)
        written.append(tsv)
    (out / "schema.json").write_text(json.dumps(schema(), indent=2) + "\n")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_ett.examples.make_data",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-npy", action="store_true", help="skip TorchRec's .npy form")
    args = parser.parse_args(argv)
    if not 1 <= args.files <= args.rows <= 10**8:
        print("make_data: error: need 1 <= --files <= --rows <= 1e8", file=sys.stderr)
        return 2
    for path in make(args.out, rows=args.rows, files=args.files, seed=args.seed,
                     npy=not args.no_npy):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
