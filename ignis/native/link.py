"""Assemble the blob into an object (.incbin: megabytes in milliseconds) and link it with the C
core archive (libignis_core.a, built by setup.py without OpenMP) into the model's library.

The archive holds the executor, the kernel tables with run-time dispatch and csrc/native; a
compile only assembles one data object and links, so it takes seconds and needs a C compiler
(`cc`, or $CC) but none of ignis's sources. The library links libc, libm and libpthread only
(libgcc statically)."""
from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from .errors import CompilerMissingError, NativeBuildError

HERE = Path(__file__).resolve().parent
ARCHIVE = "libignis_core.a"
HEADER = "ignis_model.h"


def library_name(model_name: str) -> str:
    """libignis_<name>.so (.dylib on macOS), the name reduced to [A-Za-z0-9._-]."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in model_name).strip("._") or "model"
    return f"libignis_{safe}{'.dylib' if sys.platform == 'darwin' else '.so'}"


def find_cc() -> list[str]:
    """The C compiler command: $CC (may carry flags), else cc, gcc or clang on PATH."""
    env = os.environ.get("CC", "").strip()
    if env:
        cmd = shlex.split(env)
        if shutil.which(cmd[0]):
            return cmd
        raise CompilerMissingError(f"CC={env!r} is not a program on PATH; set CC to a C compiler "
                                   f"or unset it to use cc")
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    raise CompilerMissingError(
        "ignis compile needs a C compiler to assemble and link the library, and none was found "
        "(cc, gcc, clang or $CC). Install one: apt-get install gcc (Debian/Ubuntu), dnf install gcc "
        "(Fedora), xcode-select --install (macOS)")


def core_file(name: str) -> Path:
    """A file setup.py builds beside this module (the archive, the header)."""
    p = HERE / name
    if not p.is_file():
        raise NativeBuildError(
            f"{p} is missing: this ignis was built without its native core. Rebuild it "
            f"(pip install --force-reinstall --no-binary ignis ignis, or python setup.py build_ext "
            f"--inplace in a checkout)")
    return p


def _asm(weights: bool) -> str:
    """An assembler file that embeds blob.bin (the model data) as read-only data between two hidden
    symbols, and weights.bin (--embed-weights; page-aligned) between two more, whose addresses a
    pointer pair, ignis_weights_range, hands to C: an empty range without weights, which the
    runtime reads as "the weights are in DIR/weights.bin". The files are named relative to the
    assembler's working directory (no user path is ever written into the source). On x86-64 the
    weights go to a large-data section (flag "l": placed after .bss, beyond the 2 GB that code
    reaches with 32-bit offsets), read only through the pointers, so a library may hold weights
    of any size."""
    w = '\t.incbin "weights.bin"\n' if weights else ""
    if sys.platform == "darwin":
        def sym(name: str) -> str:
            return f"\t.globl _{name}\n\t.private_extern _{name}\n_{name}:\n"
        return ('\t.const_data\n\t.p2align 6\n' + sym("ignis_blob_start") + '\t.incbin "blob.bin"\n'
                + sym("ignis_blob_end") + "\t.p2align 14\nL_weights_start:\n" + w + "L_weights_end:\n"
                + "\t.section __DATA,__const\n\t.p2align 3\n" + sym("ignis_weights_range")
                + "\t.quad L_weights_start\n\t.quad L_weights_end\n")

    def sym(name: str) -> str:
        return f"\t.globl {name}\n\t.hidden {name}\n{name}:\n"
    large = platform.machine().lower() in ("x86_64", "amd64")
    return ('\t.section .rodata.ignis_blob,"a"\n\t.balign 64\n' + sym("ignis_blob_start")
            + '\t.incbin "blob.bin"\n' + sym("ignis_blob_end")
            + ('\t.section .lrodata.ignis_weights,"al",@progbits\n' if large
               else '\t.section .rodata.ignis_weights,"a",@progbits\n')
            + "\t.balign 4096\n.Lweights_start:\n" + w + ".Lweights_end:\n"
            + '\t.section .data.rel.ro.ignis_weights,"aw",@progbits\n\t.balign 8\n'
            + sym("ignis_weights_range") + "\t.quad .Lweights_start\n\t.quad .Lweights_end\n"
            + '\t.section .note.GNU-stack,"",@progbits\n')


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        raise NativeBuildError(f"{what} failed (exit {r.returncode}): {shlex.join(cmd)}\n"
                               f"{(r.stderr or r.stdout).strip()[-2000:]}")


def link_library(blob: Path, out: Path, work: Path, weights: Path | None = None) -> None:
    """Link the library `out` from the blob file and the core archive, with the weights file inside
    it when `weights` is given; `work` holds the temporaries."""
    cc = find_cc()
    archive = core_file(ARCHIVE)
    for name, src in (("blob.bin", blob), ("weights.bin", weights)):
        if src is not None and (work / name).resolve() != src.resolve():
            (work / name).symlink_to(src.resolve())
    asm = work / "blob.S"
    asm.write_text(_asm(weights is not None))
    obj = work / "blob.o"
    _run([*cc, "-c", asm.name, "-o", obj.name], "assembling the model data", cwd=work)
    if sys.platform == "darwin":
        whole = ["-Wl,-force_load," + str(archive)]
        tail = ["-lm", "-lpthread", "-dynamiclib", "-Wl,-install_name,@rpath/" + out.name]
    else:
        whole = ["-Wl,--whole-archive", str(archive), "-Wl,--no-whole-archive"]
        tail = ["-Wl,--as-needed", "-lm", "-lpthread", "-static-libgcc", "-s", "-Wl,-z,noexecstack",
                "-Wl,-soname," + out.name]
    tmp = out.with_name(out.name + ".tmp")
    _run([*cc, "-shared", "-o", str(tmp), str(obj), *whole, *tail], "linking the library")
    os.replace(tmp, out)
