"""Results over MPI against staging (issue 28): what it costs a campaign that its workers hand
their children to the master in PACK messages instead of files in OUT/.staging.

On one machine, where both paths work, the same campaign twice in a row, one path each,
alternating within each repetition: `explore --executor symcc --workers 2 --afl-target ...
--wall-timeout BUDGET --results-via files|mpi` on bundled examples built with real SymCC
(`make examples`). Figures per campaign: executions per second over the budget, the master's
CPU milliseconds per execution (its loop, stats.json), the packs and bytes that came over MPI;
medians over the repetitions, then mpi / files. Issue 28's bar for the message path to replace
staging: executions per second within 5%, master CPU per execution no higher.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from _campaign import EXAMPLES, keep_stdout, print_table, revision, run_campaign

PATHS = ("files", "mpi")


def campaign(example: str, path: str, budget: float, scratch: Path) -> dict:
    build = EXAMPLES / "build"
    out = scratch / f"{example}-{path}"
    stats = run_campaign(out, "--executor", "symcc", "--target", f"{build / example}.symcc @@",
                         "--afl-target", f"{build / example}.afl @@", "--seeds",
                         str(EXAMPLES / "seeds" / example), "--workers", "2", "--timeout", "10",
                         "--wall-timeout", f"{budget:g}", "--results-via", path)
    extra = stats["extra"]
    executions = stats["executions"]
    return {"executions": executions,
            "executions_per_second": executions / stats["elapsed"],
            "master_ms_per_execution": 1e3 * extra["master_loop_cpu_seconds"] / executions,
            "packs_over_mpi": extra["packs_over_mpi"]["packs"],
            "bytes_over_mpi": extra["packs_over_mpi"]["bytes"],
            "stop": extra["stop_reason"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", nargs="+", default=["toml", "json"])
    parser.add_argument("--budget", type=float, default=30.0, help="seconds per campaign")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    for example in options.examples:
        if not (EXAMPLES / "build" / f"{example}.symcc").exists():
            sys.exit(f"results_path: no examples/build/{example}.symcc: run `make examples`")
    with keep_stdout("results_path") as kept:
        report(options)
        print(f"output kept in {kept}", file=sys.stderr)


def report(options: argparse.Namespace) -> None:
    runs: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-results-path-") as scratch:
        for repeat in range(options.repeats):
            for example in options.examples:
                for path in PATHS:
                    directory = Path(scratch) / f"r{repeat}"
                    directory.mkdir(exist_ok=True)
                    runs.setdefault((example, path), []).append(
                        campaign(example, path, options.budget, directory))
    medians = {key: {figure: statistics.median(run[figure] for run in samples)
                     for figure in ("executions", "executions_per_second",
                                    "master_ms_per_execution", "packs_over_mpi",
                                    "bytes_over_mpi")}
               for key, samples in runs.items()}
    print(f"results_path at {revision()}: {options.repeats} repeats of {options.budget:g} s "
          "campaigns, medians")
    print_table(["example", "results via", "executions", "executions/s",
                 "master CPU ms/execution", "packs over MPI", "bytes over MPI"],
                [[example, path, int(m["executions"]), round(m["executions_per_second"], 2),
                  round(m["master_ms_per_execution"], 3), int(m["packs_over_mpi"]),
                  int(m["bytes_over_mpi"])] for (example, path), m in medians.items()])
    ratios = [{"example": example,
               "executions_per_second": round(medians[(example, "mpi")]["executions_per_second"]
                                              / medians[(example, "files")]
                                              ["executions_per_second"], 3),
               "master_ms_per_execution": round(
                   medians[(example, "mpi")]["master_ms_per_execution"]
                   / medians[(example, "files")]["master_ms_per_execution"], 3)}
              for example in options.examples]
    print("\nmpi / files")
    print_table(["example", "executions/s", "master CPU ms/execution"],
                [[r["example"], r["executions_per_second"], r["master_ms_per_execution"]]
                 for r in ratios])
    print(json.dumps({"benchmark": "results_path", "revision": revision(),
                      "budget": options.budget, "repeats": options.repeats,
                      "runs": [{"example": example, "results_via": path, "samples": samples,
                                **medians[(example, path)]}
                               for (example, path), samples in runs.items()],
                      "mpi_over_files": ratios}))


if __name__ == "__main__":
    main()
