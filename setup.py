"""Build of ignis: one Cython extension, ignis._core, from ignis/_core.pyx and csrc/**/*.c.

Sources are chosen by target architecture: every target builds the portable C (csrc/*.c,
csrc/ops/*.c, the "generic" kernel table); a target listed in ARCH adds its ISA-specific sources from
csrc/arch/, each compiled with its own -m flags so that the extension runs on any CPU of that
architecture, and defines the macro that puts their tables in dispatch.c. Which table runs is
decided at import time from the CPU's features (dispatch.c). Other targets build the portable
table alone.

aarch64 (Linux, and macOS arm64 with Apple clang) builds the NEON tables of csrc/arch/neon/: the base
file for armv8-a (Advanced SIMD is in every AArch64 CPU), the dotprod and i8mm variants each with
its own -march extension, chosen at run time. Every aarch64 source, the portable twins included,
is compiled with -ffp-contract=off: the NEON integer matmuls reproduce the twins' float operations
one for one, and a compiler free to fuse a multiply and an add in one of them (clang's default)
would break that. x86_64 sources get the same flag: the avx2 table's attention reproduces the
portable tile's separate products and sums (GCC's -std=c11 already keeps them apart; clang would
fuse them under -mfma).

Beside the extension, build_ext makes ignis/native/libignis_core.a: the same C core (portable and
ISA sources, each with its flags) plus csrc/native/, position-independent, without OpenMP (every
kernel runs on the persistent pool, csrc/threads.c), and copies csrc/native/ignis_model.h next to
it. `ignis compile` links a model's library from that archive and the model's data, so a compile
needs a C compiler for one assembler file and the link, not ignis's sources.

Environment switches:
  IGNIS_NO_OPENMP=1   build without OpenMP (single-threaded kernels) when no OpenMP runtime exists
  IGNIS_NATIVE=1      add -march=native for a local build (never for a distributable wheel)
"""
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Per target: the macro that enables its tables in dispatch.c, and its csrc/arch/ sources with
# their flags. Adding an ISA: its sources and flags here, its table rows in dispatch.c.
ARCH = {
    "x86_64": ("IGNIS_ARCH_X86", {
        "csrc/arch/avx2.c": ["-mavx", "-mavx2", "-mfma", "-mf16c"],
        "csrc/arch/avx512.c": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512dq",
                               "-mavx512vl", "-mavx512vnni"],
        "csrc/arch/eltwise_avx512.c": ["-mavx512f"],
    }),
    "aarch64": ("IGNIS_ARCH_NEON", {
        "csrc/arch/neon/neon.c": ["-march=armv8-a"],
        "csrc/arch/neon/neon_dotprod.c": ["-march=armv8.2-a+dotprod"],
        "csrc/arch/neon/neon_i8mm.c": ["-march=armv8.2-a+dotprod+i8mm"],
    }),
}
# Flags a target gives every source it compiles (the portable ones too); see the docstring.
ARCH_COMMON_FLAGS = {"aarch64": ["-ffp-contract=off"], "x86_64": ["-ffp-contract=off"]}
PORTABLE_SOURCES = ["csrc/dispatch.c", "csrc/executor.c", "csrc/threads.c", "csrc/ops/*.c"]
NATIVE_SOURCES = ["csrc/native/*.c"]      # the compiled-model runtime (ignis compile)
NATIVE_HEADER = "csrc/native/ignis_model.h"
COMMON_FLAGS = ["-O3", "-std=c11", "-fno-math-errno", "-fvisibility=hidden", "-Wall",
                "-Wno-unused-function", "-Wno-unreachable-code", "-Wno-unused-but-set-variable"]
OMP_PROBE = r"""
#include <omp.h>
#include <stdio.h>
int main(void) {
    int n = 0;
    #pragma omp parallel reduction(+:n)
    n += 1;
    return (n >= 1 && omp_get_max_threads() >= 1) ? 0 : 1;
}
"""


def target_arch() -> str:
    """The architecture the extension is built for: "x86_64", "aarch64", or another name (built
    portable). Cross builds say so in _PYTHON_HOST_PLATFORM; a macOS universal2 build is one
    compile for two architectures, so it gets the portable sources only."""
    plat = os.environ.get("_PYTHON_HOST_PLATFORM") or sysconfig.get_platform()
    if "universal2" in plat:
        return "universal2"
    if "arm64" in plat or "aarch64" in plat:
        return "aarch64"
    if "x86_64" in plat or platform.machine().lower() in ("x86_64", "amd64"):
        return "x86_64"
    return platform.machine().lower() or plat


def portable_sources() -> list:
    """The C sources every target compiles (the generic kernel table and the executor)."""
    return [f for pattern in PORTABLE_SOURCES for f in sorted(glob(pattern))]


def arch_sources(arch: str) -> dict:
    """csrc/arch/ sources of this target with their extra flags ({} for a portable-only target)."""
    return ARCH[arch][1] if arch in ARCH else {}


def native_sources() -> list:
    """The C sources only a compiled model's library has (csrc/native/)."""
    return [f for pattern in NATIVE_SOURCES for f in sorted(glob(pattern))]


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


class BuildExt(build_ext):
    def _try_openmp(self, compile_flags, link_flags) -> bool:
        tmp = tempfile.mkdtemp(prefix="ignis-omp-")
        try:
            src = os.path.join(tmp, "probe.c")
            with open(src, "w") as f:
                f.write(OMP_PROBE)
            objs = self.compiler.compile([src], output_dir=tmp, extra_postargs=compile_flags)
            exe = os.path.join(tmp, "probe")
            self.compiler.link_executable(objs, "probe", output_dir=tmp, extra_postargs=link_flags)
            return subprocess.run([exe], capture_output=True, timeout=60).returncode == 0
        except Exception:
            return False
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _openmp_flags(self):
        if _truthy("IGNIS_NO_OPENMP"):
            print("ignis: IGNIS_NO_OPENMP is set: building without OpenMP (kernels run on one thread)")
            return [], []
        candidates = [(["-fopenmp"], ["-fopenmp"])]
        if sys.platform == "darwin":
            prefixes = [p for p in ("/opt/homebrew/opt/libomp", "/usr/local/opt/libomp") if os.path.isdir(p)]
            for p in prefixes:
                candidates.append(([f"-Xpreprocessor", "-fopenmp", f"-I{p}/include"],
                                   [f"-L{p}/lib", "-lomp", f"-Wl,-rpath,{p}/lib"]))
            candidates.append((["-Xpreprocessor", "-fopenmp"], ["-lomp"]))
        for cflags, lflags in candidates:
            if self._try_openmp(cflags, lflags):
                return cflags, lflags
        raise SystemExit(
            "error: ignis needs OpenMP to run its kernels on several cores, and this compiler could not "
            "build and run an OpenMP test program.\n"
            "  Debian/Ubuntu: apt-get install libgomp1 (gcc) or libomp-dev (clang)\n"
            "  macOS:         brew install libomp\n"
            "Or build single-threaded on purpose: IGNIS_NO_OPENMP=1 pip install .")

    def build_extension(self, ext):
        omp_c, omp_l = self._openmp_flags()
        msvc = self.compiler.compiler_type == "msvc"
        flags = [] if msvc else list(COMMON_FLAGS)
        if _truthy("IGNIS_NATIVE") and not msvc:
            print("ignis: IGNIS_NATIVE is set: building with -march=native (not portable)")
            flags.append("-march=native")
        arch = target_arch()
        if not msvc:
            flags += ARCH_COMMON_FLAGS.get(arch, [])
        ext.extra_compile_args = flags + omp_c
        ext.extra_link_args = list(ext.extra_link_args) + omp_l
        if arch in ARCH and not msvc:      # the -m flags are gcc/clang's
            macro, sources = ARCH[arch]
            objects = []
            for src, isa in sources.items():
                objects += self.compiler.compile(
                    [src], output_dir=self.build_temp, include_dirs=ext.include_dirs,
                    extra_postargs=flags + isa + omp_c,
                    depends=["csrc/ignis.h", "csrc/threads.h", "csrc/ops.def"] + sorted(glob("csrc/arch/**/*.h", recursive=True))
                    + sorted(glob("csrc/ops/*.h")))
            ext.extra_objects = list(ext.extra_objects) + objects
            ext.define_macros = list(ext.define_macros) + [(macro, "1")]
        else:
            print(f"ignis: building for {arch}: the portable kernel table only")
        super().build_extension(ext)
        if not msvc:
            self._build_native_core(ext, flags, arch)

    def _build_native_core(self, ext, flags, arch):
        """ignis/native/libignis_core.a (beside the extension in build_lib; run() copies it back
        for --inplace) and the ABI header: what `ignis compile` links a model's library from.
        Compiled without OpenMP; skipped when newer than every source and header."""
        out_dir = os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)), "native")
        os.makedirs(out_dir, exist_ok=True)
        self._native_dir = out_dir
        lib = os.path.join(out_dir, "libignis_core.a")
        depends = (["csrc/ignis.h", "csrc/threads.h", "csrc/ops.def", NATIVE_HEADER]
                   + sorted(glob("csrc/native/*.h")) + sorted(glob("csrc/arch/**/*.h", recursive=True))
                   + sorted(glob("csrc/ops/*.h")))
        inputs = portable_sources() + native_sources() + list(arch_sources(arch)) + depends + ["setup.py"]
        if (not self.force and os.path.exists(lib) and os.path.exists(os.path.join(out_dir, "ignis_model.h"))
                and max(os.path.getmtime(f) for f in inputs) < os.path.getmtime(lib)):
            return
        temp = os.path.join(self.build_temp, "native-core")
        # initial-exec TLS: the pool's few thread-local words need no __tls_get_addr, so the
        # library needs no ld-linux entry (readelf -d: libc, libm, libpthread only)
        # (-g0: Python's CFLAGS carry -g, and the archive ships in the wheel; libraries are stripped)
        common = flags + ["-fPIC", "-ftls-model=initial-exec", "-g0"]
        macros, objects = [], []
        if arch in ARCH:
            macro, sources = ARCH[arch]
            macros = [(macro, "1")]
            for src, isa in sources.items():
                objects += self.compiler.compile([src], output_dir=temp, include_dirs=["csrc"],
                                                 extra_postargs=common + isa, depends=depends)
        objects += self.compiler.compile(portable_sources() + native_sources(), output_dir=temp,
                                         include_dirs=["csrc"], macros=macros,
                                         extra_postargs=common, depends=depends)
        if os.path.exists(lib):
            os.remove(lib)         # ar appends to an existing archive
        self.compiler.create_static_lib(objects, "ignis_core", output_dir=out_dir)
        shutil.copyfile(NATIVE_HEADER, os.path.join(out_dir, "ignis_model.h"))

    def run(self):
        super().run()
        # setuptools builds in build_lib and copies only the extension itself back for --inplace
        if self.inplace and getattr(self, "_native_dir", None):
            src_dir = os.path.join(self.get_finalized_command("build_py").get_package_dir("ignis"), "native")
            for name in ("libignis_core.a", "ignis_model.h"):
                shutil.copyfile(os.path.join(self._native_dir, name), os.path.join(src_dir, name))


def extensions():
    from Cython.Build import cythonize

    ext = Extension(
        "ignis._core",
        sources=["ignis/_core.pyx"] + portable_sources(),
        include_dirs=["csrc"],
        depends=["csrc/ignis.h", "csrc/threads.h", "csrc/ops.def"] + sorted(glob("csrc/arch/**/*.[ch]", recursive=True))
        + sorted(glob("csrc/ops/*.h")) + sorted(glob("ignis/*.pxi")),
    )
    return cythonize([ext], compiler_directives={"language_level": "3"}, quiet=True)


if __name__ == "__main__":     # as setuptools and pip run it; tests import the functions above
    setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
