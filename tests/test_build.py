"""The build's choice of C sources by target architecture (setup.py): an aarch64 build takes the
portable sources and the NEON ones (csrc/arch/neon/), and they compile there without a warning
(checked with a cross compiler when one is installed: apt-get install gcc-aarch64-linux-gnu;
tests/test_c_driver.py runs them under qemu)."""
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
from tools_required import require_tool

ROOT = Path(__file__).resolve().parent.parent
CROSS_CC = "aarch64-linux-gnu-gcc"


@pytest.fixture
def setup_py(monkeypatch):
    """setup.py as a module (setup() itself runs only as __main__), in the checkout's directory,
    where pip runs it (its source globs are relative)."""
    monkeypatch.chdir(ROOT)
    spec = importlib.util.spec_from_file_location("ignis_setup", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_intrinsics_live_only_under_csrc_arch():
    """No file outside csrc/arch/ names an ISA's intrinsics, vector types or headers, so the
    portable table is portable C under any flags (IGNIS_NATIVE=1 included)."""
    isa = re.compile(r"_mm\d*_|__m\d{3}|immintrin|arm_neon|__AVX|__ARM_NEON|\bvld1q_")
    found = []
    for path in sorted((ROOT / "csrc").rglob("*")):
        if path.suffix not in (".c", ".h", ".def") or "arch" in path.relative_to(ROOT / "csrc").parts:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if isa.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "ISA-specific code outside csrc/arch/:\n" + "\n".join(found)


def test_aarch64_builds_the_portable_and_neon_sources(setup_py, monkeypatch):
    monkeypatch.setenv("_PYTHON_HOST_PLATFORM", "linux-aarch64")
    assert setup_py.target_arch() == "aarch64"
    neon = setup_py.arch_sources("aarch64")
    assert sorted(neon) == ["csrc/arch/neon/neon.c", "csrc/arch/neon/neon_dotprod.c",
                            "csrc/arch/neon/neon_i8mm.c"]
    # the base file runs on every AArch64 CPU; only the variants ask for their extension
    assert neon["csrc/arch/neon/neon.c"] == ["-march=armv8-a"]
    assert "+dotprod" in neon["csrc/arch/neon/neon_dotprod.c"][0]
    assert "+i8mm" in neon["csrc/arch/neon/neon_i8mm.c"][0]
    assert setup_py.ARCH_COMMON_FLAGS["aarch64"] == ["-ffp-contract=off"]
    assert setup_py.ARCH_COMMON_FLAGS["x86_64"] == ["-ffp-contract=off"]   # attention_avx2.h's bits
    for plat in ("macosx-11.0-arm64", "linux-aarch64"):
        monkeypatch.setenv("_PYTHON_HOST_PLATFORM", plat)
        assert setup_py.target_arch() == "aarch64"
    monkeypatch.setenv("_PYTHON_HOST_PLATFORM", "macosx-11.0-universal2")
    assert setup_py.arch_sources(setup_py.target_arch()) == {}       # one compile, two ISAs
    sources = setup_py.portable_sources()
    assert "csrc/executor.c" in sources and "csrc/dispatch.c" in sources
    assert not [s for s in sources if s.startswith("csrc/arch/")]
    monkeypatch.setenv("_PYTHON_HOST_PLATFORM", "linux-x86_64")
    assert setup_py.target_arch() == "x86_64"
    assert sorted(setup_py.arch_sources("x86_64")) == ["csrc/arch/avx2.c", "csrc/arch/avx512.c",
                                                       "csrc/arch/eltwise_avx512.c"]


def test_portable_sources_cross_compile_for_aarch64_without_warnings(setup_py, tmp_path):
    """Every C source an aarch64 build compiles, with setup.py's own flags plus OpenMP, gives an
    object and not one warning (the Cython-generated _core.c needs the target's Python headers
    and is left to a native build). CI installs the cross compiler and sets IGNIS_REQUIRE_TOOLS=1,
    so there a missing compiler fails instead of skipping."""
    require_tool(CROSS_CC, "apt-get install gcc-aarch64-linux-gnu",
                 "the aarch64 cross-compile of the portable sources")
    flags = [f for f in setup_py.COMMON_FLAGS] + setup_py.ARCH_COMMON_FLAGS["aarch64"] + ["-fopenmp", "-Icsrc"]
    for src in setup_py.portable_sources():
        obj = tmp_path / (Path(src).stem + ".o")
        r = subprocess.run([CROSS_CC, *flags, "-c", src, "-o", str(obj)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and obj.exists(), f"{src} does not compile for aarch64:\n{r.stderr}"
        assert not r.stderr.strip(), f"{src} compiles for aarch64 with warnings:\n{r.stderr}"
