"""A whole job with two injected failures: ETT% with every optimization off vs on.

    python bench/job_ett.py [--steps 1200] [--data-latency 5]

The same job (dlrm_small, checkpoint every 100 steps) fails twice: an application
error after step 500 on attempt 1 and a SIGKILL after step 1000 on attempt 2; the
launcher restarts it in place each time. "off" is the baseline the source work started
from: serial init, compile after the first real batch with no cache, synchronous
checkpoints. "on" prewarms the compile cache and turns everything on. ETT% and its
breakdown come from the events the runs wrote.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from bench._jobs import run_job, write_config
from bench.time_to_start import OFF, ON

COMPONENTS = ("scheduling", "initialization", "compilation", "effective_training",
              "wasted_training", "shutdown")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--data-latency", type=float, default=5.0)
    args = parser.parse_args()
    print(f"# whole job, 2 failures, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{platform.machine()}, dlrm_small, {args.steps} steps of batch 512")
    results = {}
    for name, opts in (("off", OFF), ("on", ON)):
        root = Path(tempfile.mkdtemp(prefix=f"job-{name}-"))
        write_config(root, model="dlrm_small", steps=args.steps, batch_size=512,
                     num_workers=1, data_startup_latency_s=args.data_latency, compile=True,
                     compile_cache_dir=str(root / "cache"), checkpoint_interval=100,
                     optimizations=opts, faults=[
                         {"kind": "raise", "at_step": args.steps * 5 // 12, "attempt": 1},
                         {"kind": "kill", "at_step": args.steps * 10 // 12, "attempt": 2},
                     ])
        result, ett = run_job(root, f"job-{name}", prewarm=name == "on")
        assert result.succeeded, (root / "trainer.log").read_text()[-3000:]
        d = ett.to_dict()
        results[name] = d
        print(f"  {name:<3}: ETT% {d['ett_pct']:5.1f}  E2E {d['e2e_s']:6.1f}s  "
              f"TTS {d['tts_s']:5.1f}s  TTR {', '.join(f'{t:.1f}s' for t in d['ttr_s'])}  "
              f"NoF {d['nof']['total']}  CSBT {d['csbt_s']:.2f}s")
        print("       " + "  ".join(f"{c} {d['components'][c]:.1f}s" for c in COMPONENTS))
    gain = results["on"]["ett_pct"] - results["off"]["ett_pct"]
    print(f"ETT% off {results['off']['ett_pct']:.1f} -> on {results['on']['ett_pct']:.1f} "
          f"({gain:+.1f} points)")


if __name__ == "__main__":
    main()
