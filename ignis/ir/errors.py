"""Typed errors of the IR layer: build-time type errors, malformed graphs, interpreter input errors."""
from __future__ import annotations

from ..errors import IgnisError


class IRTypeError(IgnisError, TypeError):
    """An op was given inputs whose shapes/dtypes its type rule rejects (raised at build time)."""


class IRVerifyError(IgnisError, ValueError):
    """A graph breaks an IR invariant (SSA, order, types, users, ...). Names the node at fault."""


class InterpreterInputError(IgnisError, ValueError):
    """The interpreter was given inputs, weights or a cache that do not match the graph."""


class IRBuildError(IgnisError, ValueError):
    """A graph was built wrongly (foreign value, duplicate name, weight declared with two types)."""
