"""The C kernel driver (tests/c/kernel_check.c), built from the C core's sources with setup.py's own
sources and flags, without Python: natively for this machine's tables, and cross-built for aarch64
and run under qemu-aarch64 with three CPU models, so each NEON table (neon, neon_dotprod,
neon_i8mm) is picked by the dispatcher and checked against the portable twin, kernel by kernel and
over whole tiny-model steps written here (tests/c/make_steps.py).

Needs gcc-aarch64-linux-gnu and qemu-user (apt-get install); without them the ARM cases skip, and
fail instead under IGNIS_REQUIRE_TOOLS=1 (CI, .ci/run installs both)."""
from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest
from tools_required import require_tool

ROOT = Path(__file__).resolve().parent.parent
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
# qemu CPU model -> the table the dispatcher must pick there, and the features behind it
ARM_CPUS = {
    "max": ("neon_i8mm", {"neon", "neon_dotprod", "neon_i8mm"}),          # dotprod + i8mm
    "cortex-a76": ("neon_dotprod", {"neon", "neon_dotprod"}),             # dotprod, no i8mm
    "cortex-a72": ("neon", {"neon"}),                                     # plain armv8-a NEON
}


def _need(tool: str, install: str) -> str:
    return require_tool(tool, install, "the C driver's aarch64 run")


def _setup_module():
    spec = importlib.util.spec_from_file_location("ignis_setup", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_driver(cc: str, arch: str, out: Path, extra_link: list[str]) -> Path:
    """kernel_check for `arch`, compiled as setup.py compiles the extension: the portable sources
    with its common flags (and the target's), each csrc/arch/ source with its own flags, the
    target's macro; OpenMP on."""
    setup = _setup_module()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        portable = setup.portable_sources()
        arch_src = setup.arch_sources(arch)
    finally:
        os.chdir(cwd)
    flags = list(setup.COMMON_FLAGS) + setup.ARCH_COMMON_FLAGS.get(arch, []) + ["-fopenmp", "-Icsrc"]
    flags = [f for f in flags if f != "-fvisibility=hidden"]
    macro = [f"-D{setup.ARCH[arch][0]}=1"] if arch in setup.ARCH else []
    out.mkdir(parents=True, exist_ok=True)
    objs = []
    for src, isa in arch_src.items():
        obj = out / (Path(src).stem + ".o")
        r = subprocess.run([cc, *flags, *isa, "-c", src, "-o", str(obj)], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{src} does not compile for {arch}:\n{r.stderr}"
        assert not r.stderr.strip(), f"{src} compiles for {arch} with warnings:\n{r.stderr}"
        objs.append(str(obj))
    exe = out / "kernel_check"
    r = subprocess.run([cc, *flags, *macro, "tests/c/kernel_check.c", *portable, *objs, "-lm",
                        *extra_link, "-o", str(exe)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"kernel_check does not build for {arch}:\n{r.stderr}"
    assert not r.stderr.strip(), f"kernel_check builds for {arch} with warnings:\n{r.stderr}"
    return exe


@pytest.fixture(scope="module")
def step_files(tmp_path_factory) -> list[str]:
    """Tiny-model steps of every weight format (the gguf one mixing every x16 layout), with the
    logits this machine's generic table gives."""
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "c"))
    try:
        import warnings

        from make_steps import write_steps
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)     # gguf on the generic table: slow, known
            return [str(p) for p in write_steps(tmp_path_factory.mktemp("steps"))]
    finally:
        sys.path.remove(str(ROOT / "tests" / "c"))


def _check_output(r: subprocess.CompletedProcess, best: str, eligible: set[str], n_steps: int) -> None:
    """kernel_check passed, its dispatcher picked `best`, exactly `eligible` tables ran, each
    through every check."""
    out = r.stdout
    assert r.returncode == 0, f"kernel_check failed:\n{out[-4000:]}\n{r.stderr[-4000:]}"
    assert f"\nbest: {best}\n" in out, out[:600]
    tables = next(line for line in out.splitlines() if line.startswith("tables:")).split()[1:]
    assert {t for t in tables if "(not-eligible)" not in t} == eligible, tables
    assert ", 0 failures" in out.splitlines()[-1]
    assert "\nthread scratch: ok " in out
    # every eligible table went through every check: quantizers, 13 packings/layouts, attention,
    # and each step file at 1 and 2 threads
    for t in eligible:
        lines = [line for line in out.splitlines() if line.split()[:1] == [t]]
        assert sum(" matmul " in line for line in lines) == 13, lines
        assert sum(" step " in line for line in lines) == 2 * n_steps, lines
        # the quantizers at the floats' corners, attention run from a thread with a small stack
        assert sum(" quantizer extremes " in line for line in lines) == 1, lines
        assert sum(" attention small-stack " in line for line in lines) == 1, lines
        assert all(" FAIL" not in line for line in lines)
        ints = [line for line in lines if " matmul " in line and line.split()[2] not in ("f32", "bf16")]
        if t in ("avx2", "avx512"):
            # the AVX2 integer matmuls (both tables run them) are the twin's bits too
            assert ints and all("bit-identical to generic" in line for line in ints), ints
        if t.startswith("neon"):
            # the integer paths of the NEON tables are the twin's bits, model steps included
            assert ints and all("bit-identical to generic" in line for line in ints), ints
            assert all("(the generic function)" not in line for line in ints), ints
            for line in lines:
                if " step " in line and any(k in line for k in ("q8.step", "q4.step", "gguf")):
                    assert "bit-identical to this target's generic" in line, line


@pytest.mark.parametrize("cpu", sorted(ARM_CPUS))
def test_neon_tables_under_qemu(cpu, step_files, tmp_path_factory):
    cc = _need(CROSS_CC, "apt-get install gcc-aarch64-linux-gnu")
    qemu = _need(QEMU, "apt-get install qemu-user")
    exe = _arm_driver(cc, tmp_path_factory)
    best, features = ARM_CPUS[cpu]
    # the target's C library and libgomp, as Debian's cross toolchain installs them
    libc = subprocess.run([cc, "-print-file-name=libc.so.6"], capture_output=True, text=True).stdout
    sysroot = Path(libc.strip()).resolve().parent.parent
    r = subprocess.run([qemu, "-L", str(sysroot), "-cpu", cpu, str(exe), *step_files],
                       capture_output=True, text=True, timeout=900)
    _check_output(r, best, {"generic"} | features, len(step_files))
    feats = next(line for line in r.stdout.splitlines() if line.startswith("features:")).split()[1:]
    assert set(feats) == features, feats


_ARM_EXE: dict[str, Path] = {}


def _arm_driver(cc: str, tmp_path_factory) -> Path:
    """One cross build for the three CPU models."""
    if "exe" not in _ARM_EXE:
        _ARM_EXE["exe"] = build_driver(cc, "aarch64", tmp_path_factory.mktemp("arm64"), [])
    return _ARM_EXE["exe"]


def test_x86_tables_natively(step_files, tmp_path):
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"this machine is {platform.machine()}: the x86 tables run on x86-64 only")
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "no C compiler (the extension itself needs one)"
    exe = build_driver(cc, "x86_64", tmp_path / "x86", [])
    r = subprocess.run([str(exe), *step_files], capture_output=True, text=True, timeout=900)
    from ignis import _core
    eligible = [t for t in _core.kernel_tables() if t["eligible"]]
    best = max(eligible, key=lambda t: t["priority"])["name"]       # what the extension picks here
    _check_output(r, best, {t["name"] for t in eligible}, len(step_files))


def test_driver_fails_on_a_cut_step_file(step_files, tmp_path):
    """The driver is not a test that cannot fail: a truncated step file is an error, and a step
    file whose recorded logits are wrong fails the comparison."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if platform.machine().lower() not in ("x86_64", "amd64") or not cc:
        pytest.skip("runs the native x86 build")
    exe = build_driver(cc, "x86_64", tmp_path / "x86", [])
    data = Path(step_files[0]).read_bytes()
    cut = tmp_path / "cut.step"
    cut.write_bytes(data[: len(data) // 2])
    r = subprocess.run([str(exe), str(cut)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 2 and "cut short" in r.stderr
    bad = tmp_path / "bad.step"
    bad.write_bytes(data[:-4] + b"\x00\x00\x80\x7f")       # the last logit becomes +inf
    r = subprocess.run([str(exe), str(bad)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 1 and "FAIL" in r.stderr and "writer's generic logits" in r.stderr
