"""Compile statistics for the log line, the benchmark and tests: torch's own counters
(graphs, recompiles, graph breaks, FX graph and AOTAutograd cache hits, phase seconds)
and ours (`PRECOMPILE_COUNTS`, what `PrecompiledForward` did; `PRECOMPILE_SECONDS`, how
long it serialized). Read-only over torch's state; imports torch only when asked.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Process-wide counts of `PrecompiledForward` outcomes (see `compile_counters`).
PRECOMPILE_COUNTS = {"loaded": 0, "compiled": 0, "fallbacks": 0}
#: Process-wide seconds `PrecompiledForward` spent serializing what it compiled ahead of
#: time (what `CompileCache.save` stores; part of the first call's compile).
PRECOMPILE_SECONDS = {"serialize": 0.0}


def compile_counters() -> dict[str, int]:
    """Process-wide compile statistics, for the log line and for tests.

    Sources in torch 2.13 (cumulative since process start or `torch._dynamo.reset()`):

    * `graphs`: `counters["stats"]["unique_graphs"]`, FX graphs dynamo produced;
    * `recompiles`: compiles of a frame that had been compiled before (dynamo's compile
      ids `<frame>/<n>` with n > 0), from `convert_frame.FRAME_COMPILE_COUNTER`; dynamo
      keeps no counter for it (the `recompiles` log artifact only prints). Note that a
      second instance of a module class compiled on its own counts too (same `forward`
      code, guards on the instance): the DLRM stand-in's two MLPs give 1;
    * `graph_breaks`: total of `counters["graph_break"]` (one count per break, by reason);
    * `fx_graph_cache_hits` / `_misses` / `_bypasses`: `counters["inductor"]
      ["fxgraph_cache_hit" | "fxgraph_cache_miss" | "fxgraph_cache_bypass"]`, one per
      compiled forward or backward graph;
    * `aot_autograd_cache_hits` / `_misses`: `counters["aot_autograd"]
      ["autograd_cache_hit" | "autograd_cache_miss"]`, one per joint graph;
    * `precompiled_loaded` / `_compiled` / `_fallbacks`: forwards installed by
      `CompileCache.precompile` that were loaded from an entry (no dynamo trace), compiled
      ahead of time here, or called just in time (guards failed, or no ahead-of-time
      compile possible); ours, counted in `PRECOMPILE_COUNTS`.
    """
    from torch._dynamo import convert_frame
    from torch._dynamo.utils import counters

    def get(group: str, name: str) -> int:
        bucket = counters.get(group)
        return int(bucket.get(name, 0)) if bucket is not None else 0

    breaks = counters.get("graph_break")
    return {
        "graphs": get("stats", "unique_graphs"),
        "recompiles": sum(max(0, n - 1) for n in convert_frame.FRAME_COMPILE_COUNTER.values()),
        "graph_breaks": int(sum(breaks.values())) if breaks is not None else 0,
        "fx_graph_cache_hits": get("inductor", "fxgraph_cache_hit"),
        "fx_graph_cache_misses": get("inductor", "fxgraph_cache_miss"),
        "fx_graph_cache_bypasses": get("inductor", "fxgraph_cache_bypass"),
        "aot_autograd_cache_hits": get("aot_autograd", "autograd_cache_hit"),
        "aot_autograd_cache_misses": get("aot_autograd", "autograd_cache_miss"),
        **{f"precompiled_{name}": n for name, n in PRECOMPILE_COUNTS.items()},
    }



def compile_phase_seconds() -> dict[str, float]:
    """Where dynamo and inductor spent this process's compile time, from torch's own
    `compilation_time_metrics` (cumulative; only the phases the benchmark's breakdown
    names): dynamo's bytecode trace, guard build, the backend call (AOTAutograd plus
    inductor, cache lookups included) and inductor's load of compiled output; and ours,
    `serialize` (`PRECOMPILE_SECONDS`)."""
    from torch._dynamo.utils import compilation_time_metrics

    phases = {
        "dynamo_trace": "bytecode_tracing",
        "guard_build": "build_guards",
        "aot_autograd_inductor": "OutputGraph.call_user_compiler",
        "inductor_load": "PyCodeCache.load_by_key_path",
    }
    return {**{ours: float(sum(compilation_time_metrics.get(theirs, ())))
               for ours, theirs in phases.items()},
            "serialize": PRECOMPILE_SECONDS["serialize"]}


def format_counters(c: Mapping[str, int]) -> str:
    """One log line: "graphs 1, recompiles 0, graph breaks 0, cache hits 2/2 (aot 1/1)"."""
    fx_hits, fx_total = (
        c["fx_graph_cache_hits"],
        c["fx_graph_cache_hits"] + c["fx_graph_cache_misses"],
    )
    aot_hits, aot_total = (
        c["aot_autograd_cache_hits"],
        c["aot_autograd_cache_hits"] + c["aot_autograd_cache_misses"],
    )
    line = (
        f"graphs {c['graphs']}, recompiles {c['recompiles']}, graph breaks "
        f"{c['graph_breaks']}, cache hits {fx_hits}/{fx_total} (aot {aot_hits}/{aot_total})"
    )
    pre = [c.get(f"precompiled_{k}", 0) for k in ("loaded", "compiled", "fallbacks")]
    if any(pre):
        line += f", precompiled loaded {pre[0]}, compiled {pre[1]}, just in time {pre[2]}"
    return line
