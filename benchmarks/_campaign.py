"""Shared by the benchmarks: run one real campaign through the CLI and read its figures."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
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


def run_campaign_sampled(out: Path, *args: str, env: dict | None = None,
                         interval: float = 0.2) -> tuple[dict, float, list[dict]]:
    """run_campaign, also reading OUT/stats.json every `interval` seconds while it runs.

    Returns (final stats, the wall-clock time.time() of the launch, every distinct
    stats.json snapshot seen, oldest first). The master rewrites stats.json atomically about
    once a second, and each snapshot carries its own `last_update` timestamp.
    """
    stats_path = out / "stats.json"
    samples: list[dict] = []
    with tempfile.TemporaryFile() as log:
        launched = time.time()
        started = time.monotonic()
        process = subprocess.Popen([*CLI, "explore", "--out", str(out), "--no-live", *args],
                                   stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        while process.poll() is None:
            time.sleep(interval)
            try:
                snapshot = json.loads(stats_path.read_text())
            except (OSError, ValueError):
                continue
            if not samples or snapshot.get("last_update") != samples[-1].get("last_update"):
                samples.append(snapshot)
        if process.returncode != 0:
            log.seek(0)
            sys.exit(f"campaign failed ({process.returncode}):\n"
                     f"{log.read().decode(errors='replace')[-4000:]}")
    stats = json.loads(stats_path.read_text())
    stats["command_seconds"] = time.monotonic() - started
    samples.append(stats)
    return stats, launched, samples


def print_table(columns: list[str], rows: list[list]) -> None:
    widths = [max(len(str(c)), *(len(_cell(r[i])) for r in rows)) for i, c in enumerate(columns)]
    print("  ".join(str(c).rjust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(_cell(v).rjust(w) for v, w in zip(row, widths, strict=True)))


def _cell(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
