"""Executors: what runs one input of the target and collects the inputs it generated."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from symcc_mpi.config import SKIP_BIN_CHECK_ENV, CampaignConfig, UsageError, skip_bin_check
from symcc_mpi.executors.base import ExecutionResult, Executor, ExecutorError, Outcome

__all__ = ["ExecutionResult", "Executor", "ExecutorError", "Outcome", "check_executor",
           "make_executor"]

def check_executor(name: str, target: tuple[str, ...]) -> None:
    """Refuse, before launching anything, an executor this machine cannot run, or a target
    not built for it (SymCC's runs need a SymCC build; Triton's a plain one)."""
    _check_available(name)
    if name in ("symcc", "triton") and not skip_bin_check():
        _check_build(name, Path(target[0]))


def _check_build(executor: str, program: Path) -> None:
    from symcc_mpi.executors.symcc import HOW_TO_GET_SYMCC, SYMCC_RUNTIME_SYMBOL, is_symcc_build

    symbol = SYMCC_RUNTIME_SYMBOL.decode()
    try:
        built = is_symcc_build(program)
    except OSError as error:
        raise UsageError(f"--target: cannot read {program}: {error.strerror}") from None
    if executor == "symcc" and not built:
        why = "not an ELF program" if built is None \
            else f"it names no {symbol}, SymCC's runtime entry"
        raise UsageError(
            f"--executor symcc: {program} is not a SymCC build ({why}): compile it with SymCC "
            f"({HOW_TO_GET_SYMCC}), run it with --executor triton, or, for a wrapper around a "
            f"SymCC build, set {SKIP_BIN_CHECK_ENV}=1")
    if executor == "triton" and built:
        raise UsageError(
            f"--executor triton: {program} is a SymCC build (it names {symbol}, SymCC's "
            f"runtime entry): give Triton the plain build (gcc), or use --executor symcc")


def _check_available(name: str) -> None:
    if name == "triton":
        for module in ("tritondse", "triton"):
            if importlib.util.find_spec(module) is None:
                raise UsageError(
                    f"executor 'triton' needs the Python package {module!r}, which is not "
                    "installed (pip install tritondse triton-library 'bitstring<4')"
                )


def make_executor(config: CampaignConfig, *, scratch: Path,
                  coverage_map: Path | None = None) -> Executor:
    """`scratch`: the worker's node-local directory; `coverage_map`: QSYM's map file there,
    when the campaign prunes."""
    if config.executor == "symcc":
        from symcc_mpi.executors.symcc import SymccExecutor, preload_library

        return SymccExecutor(config.target, timeout=config.timeout,
                             memory_limit_mb=config.memory_limit_mb, coverage_map=coverage_map,
                             linearize=coverage_map is not None,
                             preload=preload_library(), scratch=scratch)
    if config.executor == "triton":
        from symcc_mpi.executors.triton import TritonExecutor

        return TritonExecutor(list(config.target), timeout=config.timeout,
                              memory_limit_mb=config.memory_limit_mb, scratch=scratch)
    if config.executor == "noop":
        from symcc_mpi.executors.noop import NoopExecutor

        return NoopExecutor()
    raise ExecutorError(f"unknown executor {config.executor!r}")
