"""The model contract: what a model owner's factory gets, and what it gives back.

    def build(context: ModelContext) -> TrainModel: ...

`context` holds the data `schema` (the label, the dense columns, the sparse features with
their table sizes: `DataSchema`), the `device` to build on, the owner's `config` table as
written beside `model = "pkg.module:build"`, and the per-rank `batch_size` and
`world_size`. The factory returns a `TrainModel`:

- `module`: an `nn.Module` whose embedding tables are TorchRec modules
  (`EmbeddingBagCollection`, `EmbeddingCollection`) and whose `forward(batch)` returns
  `(loss, output)`, the convention of TorchRec's own train pipelines. `batch` is a
  `torchrec.datasets.utils.Batch` (`dense_features` [B, D] float32, `sparse_features` a
  KeyedJaggedTensor keyed by the schema's feature names, `labels` [B] float32).
- `compile`: dotted names of the submodules worth compiling (the dense parts; the
  embedding lookups are not compiled: they break graphs). Empty: nothing is compiled.

Everything the trainer does with a model works from this alone: the trainer seeds
torch's RNG before calling the factory (every rank and attempt starts from the same
weights), shards the TorchRec tables with `DistributedModelParallel` when there is more
than one process (row-wise Adagrad fused into backward for the tables, Adagrad for the
rest), compiles the named parts on the fast batch (with the tables' outputs detached, so
the warm-up updates nothing), checkpoints `module`'s state dict with DCP and publishes it.
The bundled DLRM (`trainer/models/dlrm.py`) is one implementation.

A factory that cannot be imported, raises, or returns something else is a
`ModelContractError`: one line, exit 78 (retrying will not change the code).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from airflow_ett.trainer.model_spec import ModelSpec
from airflow_ett.trainer.schema import DataSchema

if TYPE_CHECKING:  # what `module(batch)` gets; torchrec loads where a batch is made
    from torchrec.datasets.utils import Batch as TorchRecBatch


class ModelContractError(ValueError):
    """The owner's factory broke the contract; the message names the model and why."""


@dataclass(frozen=True, slots=True)
class ModelContext:
    """What a factory is given (module docstring)."""

    schema: DataSchema
    device: torch.device
    config: Mapping[str, object]  # the owner's `model_config` table: JSON values
    batch_size: int
    world_size: int = 1


@dataclass(slots=True)
class TrainModel:
    """What a factory returns (module docstring)."""

    module: nn.Module
    compile: tuple[str, ...] = field(default=())


class ModelFactory(Protocol):
    def __call__(self, context: ModelContext) -> TrainModel: ...


def load_factory(spec: ModelSpec) -> ModelFactory:
    """Import the factory: `spec.code_path` is appended to `sys.path` (where the DAG's
    folder is for Airflow's own processes) unless it is there already."""
    where = f"model = {spec.factory!r}"
    if spec.code_path is not None and str(spec.code_path) not in sys.path:
        sys.path.append(str(spec.code_path))
    try:
        module = importlib.import_module(spec.module)
    except Exception as exc:
        raise ModelContractError(f"{where}: importing {spec.module!r} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
    factory = getattr(module, spec.attribute, None)
    if factory is None or not callable(factory):
        raise ModelContractError(f"{where}: {spec.module} has no callable "
                                 f"{spec.attribute!r} (found {type(factory).__name__})")
    return factory  # type: ignore[no-any-return]


def build_model(spec: ModelSpec, schema: DataSchema, *, device: torch.device, seed: int,
                batch_size: int, world_size: int = 1) -> TrainModel:
    """The owner's model, built from `seed` alone and checked against the contract and
    the schema before anything runs it."""
    factory = load_factory(spec)
    context = ModelContext(schema=schema, device=device, config=dict(spec.config),
                           batch_size=batch_size, world_size=world_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            built = factory(context)
        except Exception as exc:
            raise ModelContractError(f"model = {spec.factory!r}: the factory failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
    check_model(spec.factory, built, schema)
    return built


def check_model(factory: str, built: object, schema: DataSchema) -> None:
    """A `TrainModel` with an `nn.Module`, compile names that exist, and tables that read
    the schema's features with room for every id the data can hold."""
    where = f"model = {factory!r}"
    if not isinstance(built, TrainModel):
        raise ModelContractError(f"{where}: the factory returned {type(built).__name__}, not a "
                                 "TrainModel(module=..., compile=(...))")
    if not isinstance(built.module, nn.Module):
        raise ModelContractError(f"{where}: TrainModel.module is {type(built.module).__name__}, "
                                 "not a torch.nn.Module")
    if isinstance(built.compile, str) or not isinstance(built.compile, tuple | list):
        raise ModelContractError(f"{where}: TrainModel.compile = {built.compile!r}: must be a "
                                 "tuple of submodule names")
    for name in built.compile:
        try:
            built.module.get_submodule(name)
        except (AttributeError, TypeError):
            raise ModelContractError(f"{where}: TrainModel.compile names {name!r}, which is "
                                     "not a submodule of the model") from None
    rows = dict(schema.tables)
    for table, features, size in table_features(built.module):
        for feature in features:
            if feature not in rows:
                raise ModelContractError(
                    f"{where}: table {table!r} reads feature {feature!r}, not one of the "
                    f"data's sparse features {sorted(rows)}")
            if size < rows[feature]:
                raise ModelContractError(
                    f"{where}: table {table!r} has {size} rows, but feature {feature!r} has "
                    f"ids up to {rows[feature] - 1} (schema num_embeddings {rows[feature]})")


def _embedding_types() -> tuple[type[nn.Module], ...]:
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    return (EmbeddingBagCollection, EmbeddingCollection)


def embedding_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """(dotted name, module) of every TorchRec table collection, sharded or not."""
    from torchrec.distributed.types import ShardedModule

    kinds = (*_embedding_types(), ShardedModule)
    return [(name, m) for name, m in module.named_modules() if isinstance(m, kinds)]


def table_features(module: nn.Module) -> Iterator[tuple[str, list[str], int]]:
    """(table name, its feature names, its rows) of every unsharded table."""
    for _, collection in embedding_modules(module):
        configs = getattr(collection, "embedding_bag_configs", None) or getattr(
            collection, "embedding_configs", None)
        if callable(configs):
            for config in configs():
                yield config.name, list(config.feature_names), int(config.num_embeddings)


def dense_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Every parameter outside the table collections (the dense optimizer's)."""
    tables = {id(p) for _, m in embedding_modules(model) for p in m.parameters()}
    return {n: p for n, p in model.named_parameters() if id(p) not in tables}


def _detach(output: object) -> object:
    """A table collection's output cut from the tables' autograd graph, still requiring a
    gradient (as in training), so that backward compiles the same graph and stops there."""
    from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedTensor

    wait = getattr(output, "wait", None)
    if callable(wait) and not isinstance(output, torch.Tensor):  # a sharded lookup's awaitable
        output = wait()
    if isinstance(output, KeyedTensor):
        return KeyedTensor(keys=output.keys(), length_per_key=output.length_per_key(),
                           values=output.values().detach().requires_grad_(),
                           key_dim=output.key_dim())
    if isinstance(output, Mapping):
        return {k: JaggedTensor(values=v.values().detach().requires_grad_(),
                                lengths=v.lengths(), weights=v.weights_or_none())
                for k, v in output.items()}
    if isinstance(output, torch.Tensor):
        return output.detach().requires_grad_()
    return output


@contextlib.contextmanager
def detached_embeddings(model: nn.Module) -> Iterator[None]:
    """While inside, the table collections' outputs are detached (`_detach`): a backward
    reaches the dense parameters only, so a fused table optimizer does not step."""
    handles = [m.register_forward_hook(lambda _m, _i, out: _detach(out))
               for _, m in embedding_modules(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def unwrap(model: nn.Module) -> nn.Module:
    """The owner's module inside a DistributedModelParallel (itself otherwise)."""
    inner: nn.Module = getattr(model, "module", model)
    return inner


def compile_parts(model: nn.Module, parts: tuple[str, ...], *, dynamic: bool = False) -> None:
    """Compile the named submodules in place (state-dict keys unchanged). With a compile
    cache activated in this process (`CompileCache.activate`), each is compiled ahead of
    time under its name, or loaded from the entry without a dynamo trace; without one,
    `nn.Module.compile` as torch does it."""
    from airflow_ett.trainer.compile_cache import active_cache

    cache = active_cache()
    inner = unwrap(model)
    for name in parts:
        module = inner.get_submodule(name)
        if cache is not None:
            cache.precompile(module, name, dynamic=dynamic)
        else:
            module.compile(dynamic=dynamic)


def warm_compile(model: nn.Module, parts: tuple[str, ...], batch: TorchRecBatch) -> None:
    """Compile the parts and run them forward and backward once on `batch` (a fast
    batch) with the tables detached: the graphs training runs, and no update."""
    compile_parts(model, parts)
    with detached_embeddings(model):
        loss = model(batch)[0]
        torch.autograd.backward(loss)
    for p in model.parameters():
        p.grad = None
