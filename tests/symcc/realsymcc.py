"""Paths and availability of the real SymCC builds, for tests/symcc (see conftest.py).

A module of its own, not conftest.py: test modules cannot import "conftest" reliably when
several directories have one.
"""

from __future__ import annotations

import os
from pathlib import Path

from symcc_mpi.executors.symcc import HOW_TO_GET_SYMCC

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "examples" / "build"
SEEDS = ROOT / "examples" / "seeds"
# What these tests run: SymCC builds of the examples and the compiler itself (for small
# targets of their own), all made by `make examples` when SymCC is available.
REQUIRED = ("magic.symcc", "tlv.symcc", "json.symcc", "gate.symcc", "symcc")


def unavailable() -> tuple[str, str] | None:
    """(what to do, why) when the tests cannot run; None when they can. `make test` requires
    them (SYMCC_MPI_REQUIRE_SYMCC=1) when it has a SymCC source: then they fail."""
    missing = [name for name in REQUIRED if not (BUILD / name).exists()]
    if not missing:
        return None
    why = (f"no SymCC builds in examples/build ({', '.join(missing)}): real-SymCC tests "
           f"skipped; SymCC: {HOW_TO_GET_SYMCC}; then `make examples`")
    return ("fail" if os.environ.get("SYMCC_MPI_REQUIRE_SYMCC") == "1" else "skip"), why
