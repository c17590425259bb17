"""What `ignis compile` refuses: typed, each message saying what was wrong and what to do."""
from __future__ import annotations

from ..errors import IgnisError


class NativeCompileError(IgnisError, ValueError):
    """A compile request that cannot be carried out (bad output directory, bad option)."""


class CompilerMissingError(NativeCompileError):
    """No C compiler to assemble and link the library with; the message says what to install."""


class NativeBuildError(NativeCompileError):
    """The C compiler or linker failed, or ignis was installed without its native core archive."""
