"""Compiled models: `ignis compile` turns a model into a directory with a self-contained native
library (the C core, its compiled step as data, the C ABI of ignis_model.h) and its weights, used
from C or any FFI without Python. compile.py is the driver; blob.py, modl.py and weights_file.py
the formats the C runtime (csrc/native/runtime.c) reads; link.py the assembler and linker step."""
from __future__ import annotations

from .compile import ABI_VERSION, CompileResult, compile_model
from .errors import CompilerMissingError, NativeBuildError, NativeCompileError

__all__ = ["ABI_VERSION", "CompileResult", "compile_model", "CompilerMissingError",
           "NativeBuildError", "NativeCompileError"]
