"""The worker pool (csrc/threads.c) and the default thread count (ignis/runtime/cpus.py).

Thread-count invariance of every kernel is tests/test_kernels.py's; here: the pool really runs
jobs on several threads, calls from several Python threads at once (one gets the pool, the others
run alone) give the same bits, and the default thread count follows the affinity mask and the
cgroup CPU quota (fake cgroup trees, and a real taskset)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tools_required import missing_tool, require_tool

from ignis import _core
from ignis.runtime import cpus

ROOT = Path(__file__).resolve().parents[1]


def _matmul(threads: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 160), dtype=np.float32)
    w = rng.standard_normal((997, 160), dtype=np.float32)
    out = np.zeros((3, 997), np.float32)
    _core.matmul(out, x, w, fmt="f32", threads=threads)
    return out


def test_pool_runs_jobs_on_several_threads_with_the_same_bits():
    before = _core.pool_stats()["jobs"]
    one = _matmul(1)
    for n in (2, 3, 8):       # more threads than cores too
        assert np.array_equal(_matmul(n), one)
    st = _core.pool_stats()
    assert st["jobs"] > before           # the multi-thread calls went through the pool
    assert st["workers"] >= 1
    assert 1 <= st["threads_now"] <= st["workers"] + 1


def test_concurrent_callers_get_the_same_bits():
    want = {s: _matmul(1, s) for s in range(4)}
    got: dict = {}
    errors: list = []

    def run(s: int) -> None:
        try:
            for _ in range(20):
                r = _matmul(2, s)
                if not np.array_equal(r, want[s]):
                    got[s] = r
        except Exception as e:        # noqa: BLE001 - reported below
            errors.append(e)
    ts = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors and not got


def test_row_kernels_through_the_pool_match_one_thread():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 1031), dtype=np.float32)   # above IG_ROWS_PAR_MIN: shared
    w = rng.standard_normal(1031, dtype=np.float32)
    outs = []
    for n in (1, 2, 5):
        o = np.empty_like(x)
        _core.rmsnorm(o, x, w, eps=1e-6, threads=n)
        outs.append(o)
    assert all(np.array_equal(o, outs[0]) for o in outs)


def test_jobs_after_the_workers_slept_give_the_same_bits():
    """Pauses longer than the workers' spin (200 us): they sleep on the futex, the next job wakes
    them or runs without them; either way the same bits, and the counters say what happened."""
    one = _matmul(1, 7)
    before = _core.pool_stats()
    # A backoff left by earlier work on a loaded machine runs jobs on the caller alone (no job
    # counted, no worker woken) until its time is up (at most ~2.3 s): pause and run until the
    # workers have slept and taken a job again, for up to 20 s.
    deadline = time.monotonic() + 20
    while True:
        for _ in range(6):
            time.sleep(0.003)
            assert np.array_equal(_matmul(2, 7), one)
        st = _core.pool_stats()
        if (st["jobs"] > before["jobs"] and st["sleeps"] > before["sleeps"]) or time.monotonic() > deadline:
            break
    assert st["jobs"] > before["jobs"]
    assert st["sleeps"] > before["sleeps"]                       # the pauses put them to sleep
    assert st["entered"] + st["missed"] >= before["entered"] + before["missed"]
    assert st["traced"] in (0, 1) and st["wait_ns"] >= 0 and st["lag_ns"] >= 0


@pytest.mark.parametrize("wait", ["futex", "condvar"])
def test_pool_alone_in_c(tmp_path, wait):
    """tests/c/pool_check.c: thousands of jobs, some published to sleeping workers, some from
    three callers at once, each index computed exactly once; built with the Linux futex wait and
    with the portable condition-variable one (the only wait other systems have). A worker must
    have entered a job: on a loaded machine the backoff can run every job of the phases on one
    thread, so the check runs more (for up to 20 s) until one has, and fails if none did."""
    cc = require_tool("gcc", "apt-get install gcc", "the pool's C check")
    exe = tmp_path / "pool_check"
    flags = ["-DIG_POOL_NO_FUTEX"] if wait == "condvar" else []
    subprocess.run([cc, "-O2", "-std=c11", "-pthread", *flags, f"-I{ROOT / 'csrc'}",
                    str(ROOT / "tests/c/pool_check.c"), str(ROOT / "csrc/threads.c"), "-o", str(exe)],
                   check=True)
    for threads, jobs in ((2, 150), (5, 40)):
        r = subprocess.run([str(exe), str(threads), str(jobs)], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        fields = dict(kv.split("=") for kv in r.stdout.split()[2:])
        assert r.stdout.startswith("ok ") and int(fields["entered"]) > 0, r.stdout


def test_backoff_policy_alone_in_c(tmp_path):
    """tests/c/backoff_check.c: the backoff's state machine fed made-up joins: three close late
    joins back off for the base length, a probe that fails at once doubles it up to the cap, one
    that holds resets it, the time bound ends it, a worker entering jobs on the caller's CPU backs
    off at once, a probe whose steps are not faster than the steps on fewer threads fails (only
    steps of one model and row count, all of whose jobs ran one way, are compared)."""
    cc = require_tool("gcc", "apt-get install gcc", "the backoff's C check")
    exe = tmp_path / "backoff_check"
    subprocess.run([cc, "-O2", "-std=c11", "-Wall", "-Werror", "-pthread", f"-I{ROOT / 'csrc'}",
                    str(ROOT / "tests/c/backoff_check.c"), "-o", str(exe)], check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_pool_stats_report_the_backoff():
    _matmul(2)
    st = _core.pool_stats()
    for k in ("backoffs", "failed_probes", "slow_probes", "shared_windows", "backoff_jobs"):
        assert isinstance(st[k], int) and st[k] >= 0, k
    assert st["slow_probes"] <= st["failed_probes"] <= st["backoffs"]
    assert st["backoff_jobs"] == 0 if st["backoffs"] == 0 else 512 <= st["backoff_jobs"] <= 32768
    assert st["reduced_jobs"] == 0 or st["backoffs"] > 0     # only a backoff runs jobs reduced


# ---- the default thread count ------------------------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str], own: str) -> tuple[Path, Path]:
    root = tmp_path / "cg"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    root.mkdir(exist_ok=True)
    proc = tmp_path / "proc_cgroup"
    proc.write_text(own)
    return root, proc


def test_cgroup_v2_quota_tightest_along_the_path(tmp_path):
    root, proc = _tree(tmp_path, {"cpu.max": "max 100000\n", "a/cpu.max": "150000 100000\n",
                                  "a/b/cpu.max": "max 100000\n"}, "0::/a/b\n")
    assert cpus.cgroup_cpus(root, proc) == pytest.approx(1.5)
    assert cpus.available_cpus(root, proc) == min(2, cpus.affinity_cpus())
    root, proc = _tree(tmp_path / "2", {"a/cpu.max": "250000 100000", "a/b/cpu.max": "50000 100000"},
                       "0::/a/b\n")
    assert cpus.cgroup_cpus(root, proc) == pytest.approx(0.5)
    assert cpus.available_cpus(root, proc) == 1          # a fraction of a CPU still gets one thread


def test_cgroup_v1_quota(tmp_path):
    root, proc = _tree(tmp_path, {"cpu,cpuacct/docker/x/cpu.cfs_quota_us": "100000",
                                  "cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000"},
                       "4:memory:/docker/x\n3:cpu,cpuacct:/docker/x\n")
    assert cpus.cgroup_cpus(root, proc) == pytest.approx(1.0)
    assert cpus.available_cpus(root, proc) == 1


@pytest.mark.parametrize("text", ["max 100000", "", "garbage", "-1 100000", "100000 0", "1 2 3"])
def test_no_or_bad_quota_means_no_limit(tmp_path, text):
    root, proc = _tree(tmp_path, {"cpu.max": text, "cpu/cpu.cfs_quota_us": "-1",
                                  "cpu/cpu.cfs_period_us": "100000"}, "0::/\n1:cpu:/\n")
    assert cpus.cgroup_cpus(root, proc) is None
    assert cpus.available_cpus(root, proc) == cpus.affinity_cpus()


def test_missing_cgroup_files(tmp_path):
    assert cpus.cgroup_cpus(tmp_path / "none", tmp_path / "none-either") is None
    assert cpus.available_cpus(tmp_path / "none", tmp_path / "none-either") == cpus.affinity_cpus()


def test_default_never_above_the_affinity_mask():
    assert 1 <= cpus.available_cpus() <= cpus.affinity_cpus() <= (os.cpu_count() or 1)
    assert _core.max_threads() == cpus.affinity_cpus()


def test_taskset_one_cpu_gives_one_thread():
    if shutil.which("taskset") is None or not hasattr(os, "sched_getaffinity"):
        missing_tool("no taskset (util-linux) or no affinity masks here: the pinned default is not "
                     "checked")
    code = ("from ignis import _core; from ignis.runtime.cpus import available_cpus; "
            "print(_core.max_threads(), available_cpus())")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cpu = sorted(os.sched_getaffinity(0))[0]
    r = subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", code], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1"]


def test_packed_weights_copied_to_huge_pages_keep_their_bytes():
    from ignis.runtime.engine import to_huge_pages
    rng = np.random.default_rng(2)
    a = rng.integers(0, 255, 1000, dtype=np.uint8)
    b = rng.integers(0, 65535, (7, 33), dtype=np.uint16)
    got = to_huge_pages([(2, 0, a), None, (4, 3, b)])
    assert got[1] is None
    for (c_id, layout, src), (c2, l2, dst) in zip([(2, 0, a), (4, 3, b)], [got[0], got[2]]):
        assert (c2, l2, dst.dtype, dst.shape) == (c_id, layout, src.dtype, src.shape)
        assert np.array_equal(dst, src) and dst.ctypes.data % 64 == 0
        assert not np.shares_memory(dst, src)
    assert to_huge_pages([None]) == [None]
