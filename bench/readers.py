"""Reader throughput: our file source per worker vs reading the same files with pyarrow alone.

    python -m bench.readers [--rows 200000] [--batch 256]

The files are the generated Criteo-layout log (`airflow_ett.examples.make_data`), as
TSV and as Parquet. Samples per second, one process each:

- `pyarrow alone`: the whole file read at once (`pyarrow.csv.read_csv`,
  `pyarrow.parquet.read_table`) into numpy: the fastest a stock reader goes, with no
  random access, no cursor, no checks and no ids;
- `pyarrow + ids, as TorchRec`: the same, then the categorical columns made row ids the
  way `torchrec.datasets.criteo.tsv_to_npys` does (`int(v or "0", 16)` per value), the
  stock way to get trainable batches;
- `ours, 1 worker`: `FileSource.rank_batch` from a cursor, batch by batch (random
  access by row range, typed checks, bad-row accounting, vectorised ids): one data
  worker's rate;
- `ours, pipeline (N workers)`: through `DataPipeline` (spawned workers, batches to the
  consumer as tensors and a KeyedJaggedTensor), what the training loop receives;
- `two-tower step`: the example model's training step alone on one batch (the rate the
  pipeline must keep up with on this machine).

pandas is not a dependency of this project (Airflow 3 does not bring it), so pyarrow is
the stock reader measured; pandas' C parser is in the same class as pyarrow's.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from airflow_ett.examples.make_data import NUM_EMBEDDINGS, make
from airflow_ett.trainer.data import DataPipeline
from airflow_ett.trainer.files import file_source
from airflow_ett.trainer.schema import CRITEO_COLUMNS, read_data_spec

SPARSE = {f"cat_{i}": NUM_EMBEDDINGS[i] for i in range(26)}


def spec(data: Path, fmt: str) -> Any:
    if fmt == "criteo_tsv":
        return read_data_spec({"format": fmt, "paths": str(data / "day_*.tsv"),
                               "schema": {"sparse": SPARSE}})
    return read_data_spec({"format": fmt, "paths": str(data / "day_*.parquet"),
                           "dense_transform": "log1p", "schema": {
                               "dense": [f"int_{i}" for i in range(13)], "encoding": "hex",
                               "sparse": SPARSE}})


def stock(data: Path, fmt: str, ids: bool) -> float:
    start = time.perf_counter()
    n = 0
    for path in sorted(data.glob("day_*." + ("tsv" if fmt == "criteo_tsv" else "parquet"))):
        if fmt == "criteo_tsv":
            table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(
                column_names=list(CRITEO_COLUMNS)), parse_options=pacsv.ParseOptions(
                delimiter="\t"), convert_options=pacsv.ConvertOptions(
                column_types={f"cat_{i}": pa.string() for i in range(26)}))
        else:
            table = pq.read_table(path)
        dense = np.stack([table.column(f"int_{i}").fill_null(0).to_numpy()
                          for i in range(13)], axis=1).astype(np.float32)
        labels = table.column("label").to_numpy().astype(np.float32)
        if ids:
            cats = np.array([[int(v or "0", 16) for v in table.column(f"cat_{i}").to_pylist()]
                             for i in range(26)], dtype=np.int64)
            cats %= np.asarray(NUM_EMBEDDINGS)[:, None]
        assert dense.shape[0] == len(labels)
        n += len(labels)
    return n / (time.perf_counter() - start)


def ours(source: Any, rows: int, batch: int) -> float:
    source = source.prepare()
    start = time.perf_counter()
    for cursor in range(0, rows, batch):
        source.rank_batch(cursor)
    return rows / (time.perf_counter() - start)


def pipeline(source: Any, rows: int, batch: int, workers: int) -> float:
    with DataPipeline(source, start_cursor=0, num_workers=workers, prefetch=8) as p:
        p.wait_ready(timeout=120)
        start = time.perf_counter()
        for _ in range(rows // batch):
            p.next_batch(timeout=120)
        return rows // batch * batch / (time.perf_counter() - start)


def model_rate(data: Path, batch: int) -> float:
    import torch

    from airflow_ett.trainer.contract import build_model
    from airflow_ett.trainer.data import make_batch
    from airflow_ett.trainer.model_spec import read_model_spec

    s = spec(data, "criteo_tsv")
    model_spec = read_model_spec("airflow_ett.examples.two_tower:build",
                                 {"embedding_dim": 16, "tower": [128, 64]})
    built = build_model(model_spec, s.schema, device=torch.device("cpu"), seed=1,
                        batch_size=batch)
    model = built.module
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    one = make_batch(file_source(s, batch).prepare(), 0).model_input()
    for _ in range(5):
        model(one)[0].backward()
    steps = 50
    start = time.perf_counter()
    for _ in range(steps):
        loss = model(one)[0]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return steps * batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="readers-"))
    make(data, rows=args.rows, files=2, seed=7, npy=False)
    print(f"# readers, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
          f"{psutil.cpu_count()} CPUs, {args.rows} rows in 2 files, batch {args.batch}")
    step = model_rate(data, args.batch)
    print(f"two-tower training step alone: {step:,.0f} samples/s")
    for fmt in ("criteo_tsv", "parquet"):
        alone = stock(data, fmt, ids=False)
        stock_ids = stock(data, fmt, ids=True)
        one = ours(file_source(spec(data, fmt), args.batch), args.rows, args.batch)
        piped = {w: pipeline(file_source(spec(data, fmt), args.batch), args.rows // 2,
                             args.batch, w) for w in (1, 2)}
        print(f"{fmt}: pyarrow alone {alone:,.0f}/s | pyarrow + ids, as TorchRec "
              f"{stock_ids:,.0f}/s | ours, 1 worker {one:,.0f}/s "
              f"({one / stock_ids:.2f}x stock with ids, {one / alone:.2f}x pyarrow alone) | "
              + " | ".join(f"pipeline {w} worker(s) {r:,.0f}/s" for w, r in piped.items())
              + f" | pipeline 1 worker / training step {piped[1] / step:.2f}")


if __name__ == "__main__":
    main()
