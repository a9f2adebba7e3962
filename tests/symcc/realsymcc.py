"""Paths and availability of the real SymCC builds, for tests/symcc (see conftest.py).

A module of its own, not conftest.py: test modules cannot import "conftest" reliably when
several directories have one.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SYMCC_SOURCE = ROOT.parent / "shared" / "symcc"
BUILD = ROOT / "examples" / "build"
SEEDS = ROOT / "examples" / "seeds"
# What these tests run: SymCC builds of the examples and the compiler itself (for small
# targets of their own), all made by `make examples` when SymCC is available.
REQUIRED = ("magic.symcc", "tlv.symcc", "json.symcc", "gate.symcc", "symcc")


def unavailable() -> tuple[str, str] | None:
    """(what to do, why) when the tests cannot run; None when they can."""
    if not (SYMCC_SOURCE / "symcc-src.tar.gz").is_file():
        return "skip", f"no SymCC source in {SYMCC_SOURCE}: real-SymCC tests skipped"
    missing = [name for name in REQUIRED if not (BUILD / name).exists()]
    if missing:
        why = (f"SymCC builds missing in {BUILD} ({', '.join(missing)}): run `make test`, "
               "which builds SymCC and examples/build/*.symcc")
        return ("fail" if os.environ.get("SYMCC_MPI_REQUIRE_SYMCC") == "1" else "skip"), why
    return None
