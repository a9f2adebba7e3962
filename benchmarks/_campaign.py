"""Shared by the benchmarks: run one real campaign through the CLI and read its figures."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "symcc_mpi"]


def run_campaign(out: Path, *args: str, env: dict | None = None) -> dict:
    started = time.monotonic()
    process = subprocess.run([*CLI, "explore", "--out", str(out), "--no-live", *args],
                             capture_output=True, text=True, cwd=ROOT, env=env)
    if process.returncode != 0:
        sys.exit(f"campaign failed ({process.returncode}):\n{process.stdout}\n{process.stderr}")
    stats = json.loads((out / "stats.json").read_text())
    stats["command_seconds"] = time.monotonic() - started
    return stats


def print_table(columns: list[str], rows: list[list]) -> None:
    widths = [max(len(str(c)), *(len(_cell(r[i])) for r in rows)) for i, c in enumerate(columns)]
    print("  ".join(str(c).rjust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(_cell(v).rjust(w) for v, w in zip(row, widths, strict=True)))


def _cell(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
