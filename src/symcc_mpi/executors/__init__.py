"""Executors: what runs one input of the target and collects the inputs it generated."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..config import CampaignConfig, UsageError
from .base import ExecutionResult, Executor, ExecutorError, Outcome

__all__ = ["ExecutionResult", "Executor", "ExecutorError", "Outcome", "check_available",
           "make_executor"]


def check_available(name: str) -> None:
    """Refuse, before launching anything, an executor this machine cannot run."""
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
        from .symcc import SymccExecutor, preload_library

        return SymccExecutor(config.target, timeout=config.timeout,
                             memory_limit_mb=config.memory_limit_mb, coverage_map=coverage_map,
                             linearize=coverage_map is not None,
                             preload=preload_library(), scratch=scratch)
    if config.executor == "triton":
        from .triton import TritonExecutor

        return TritonExecutor(list(config.target), timeout=config.timeout,
                              memory_limit_mb=config.memory_limit_mb, scratch=scratch)
    if config.executor == "noop":
        from .noop import NoopExecutor

        return NoopExecutor()
    raise ExecutorError(f"unknown executor {config.executor!r}")
