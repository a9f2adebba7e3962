"""The conventions the layers' contract cannot check: environment variables are read in
config.py alone, and every statistics() is a frozen snapshot."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import typing
from pathlib import Path

import msgspec

import symcc_mpi

PACKAGE = Path(symcc_mpi.__file__).parent


def _environment_reads(tree: ast.AST) -> list[int]:
    """Lines that read a variable: os.environ[...] or os.environ.get(...), os.getenv(...).
    dict(os.environ, ...) copies the environment for a child, which is not a read."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ" \
                and isinstance(node.ctx, ast.Load):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "os.environ.get", "os.getenv", "os.environ.__getitem__"):
            lines.append(node.lineno)
    return lines


def test_environment_variables_are_read_in_config_alone():
    readers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "config.py":
            continue
        lines = _environment_reads(ast.parse(path.read_text(), str(path)))
        if lines:
            readers[str(path.relative_to(PACKAGE))] = lines
    assert readers == {}


def test_the_check_sees_a_read():
    reads = ast.parse("import os\nos.environ.get('X')\nos.environ['Y']\nos.getenv('Z')")
    assert sorted(_environment_reads(reads)) == [2, 3, 4]
    assert _environment_reads(ast.parse("import os\nenv = dict(os.environ, X='1')")) == []


def _frozen(kind: object) -> bool:
    if dataclasses.is_dataclass(kind):
        return kind.__dataclass_params__.frozen
    return isinstance(kind, type) and issubclass(kind, msgspec.Struct) \
        and kind.__struct_config__.frozen


def test_every_statistics_is_a_frozen_snapshot():
    found, mutable = [], []
    for module in pkgutil.walk_packages(symcc_mpi.__path__, "symcc_mpi."):
        if module.name.endswith("__main__"):
            continue
        loaded = importlib.import_module(module.name)
        for name, kind in inspect.getmembers(loaded, inspect.isclass):
            method = kind.__dict__.get("statistics")
            if kind.__module__ != loaded.__name__ or method is None:
                continue
            returned = typing.get_type_hints(method).get("return")
            found.append(f"{module.name}.{name}")
            if not _frozen(returned):
                mutable.append(f"{module.name}.{name} -> {returned}")
    assert len(found) >= 20  # the walk saw the package
    assert mutable == []
