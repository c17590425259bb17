"""The native library's sampler (csrc/native/sampler.c), through ctypes on a shared library
compiled here, against numpy and ignis/generate/sampler.py: PCG64's raw outputs and random() equal
numpy's default_rng for the same seed (SeedSequence included), and for random logits, seeds and
parameter sets the C sampler picks the same token as Sampler.sample over 60 steps (the penalties
follow the history), with logprobs within 1e-6 and the same top_logprobs ids."""
from __future__ import annotations

import ctypes
import math
import subprocess
import zlib

import numpy as np
import pytest
from tools_required import missing_tool, require_tool

from ignis.generate.params import SamplingParams
from ignis.generate.sampler import Sampler
from test_native_json import FLAGS, NATIVE, ROOT, build_native

MAX_TOP = 20


class PCG(ctypes.Structure):
    _fields_ = [("state_hi", ctypes.c_uint64), ("state_lo", ctypes.c_uint64),
                ("inc_hi", ctypes.c_uint64), ("inc_lo", ctypes.c_uint64)]


class Params(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_double), ("top_k", ctypes.c_int64),
                ("top_p", ctypes.c_double), ("min_p", ctypes.c_double),
                ("repetition_penalty", ctypes.c_double), ("presence_penalty", ctypes.c_double),
                ("frequency_penalty", ctypes.c_double),
                ("bias_ids", ctypes.POINTER(ctypes.c_int32)),
                ("bias_values", ctypes.POINTER(ctypes.c_double)), ("n_bias", ctypes.c_size_t),
                ("has_seed", ctypes.c_int), ("seed", ctypes.c_uint64), ("logprobs", ctypes.c_int),
                ("top_logprobs", ctypes.c_int)]


class Top(ctypes.Structure):
    _fields_ = [("token_id", ctypes.c_int32), ("logprob", ctypes.c_double)]


class Info(ctypes.Structure):
    _fields_ = [("token_id", ctypes.c_int32), ("logprob", ctypes.c_double), ("n_top", ctypes.c_int),
                ("top", Top * MAX_TOP)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> ctypes.CDLL:
    return load_sampler(tmp_path_factory.mktemp("native_sampler"))


def load_sampler(tmp_dir) -> ctypes.CDLL:
    lib = build_native(tmp_dir, ["sampler.c"], "sampler")
    lib.ig_pcg64_seed.argtypes = [ctypes.POINTER(PCG), ctypes.c_uint64]
    lib.ig_pcg64_seed_words.argtypes = [ctypes.POINTER(PCG), ctypes.POINTER(ctypes.c_uint32),
                                        ctypes.c_size_t]
    lib.ig_pcg64_seed_entropy.argtypes = [ctypes.POINTER(PCG)]
    lib.ig_pcg64_next.restype = ctypes.c_uint64
    lib.ig_pcg64_next.argtypes = [ctypes.POINTER(PCG)]
    lib.ig_pcg64_random.restype = ctypes.c_double
    lib.ig_pcg64_random.argtypes = [ctypes.POINTER(PCG)]
    lib.ig_pairwise_sum.restype = ctypes.c_double
    lib.ig_pairwise_sum.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.ig_sampler_new.restype = ctypes.c_void_p
    lib.ig_sampler_new.argtypes = [ctypes.POINTER(Params), ctypes.c_int32, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    lib.ig_sampler_sample.restype = ctypes.c_int32
    lib.ig_sampler_sample.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.POINTER(Info)]
    lib.ig_sampler_accept.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.ig_sampler_free.argtypes = [ctypes.c_void_p]
    return lib


def raw_draws(lib, seed: int, n: int) -> list[int]:
    g = PCG()
    lib.ig_pcg64_seed(ctypes.byref(g), seed)
    return [lib.ig_pcg64_next(ctypes.byref(g)) for _ in range(n)]


SEEDS = [0, 1, 42, 2**31 - 1, 2**32 - 1, 2**32, 2**32 + 1, 2**53 + 7, 2**63, 2**64 - 1,
         1234567890123456789]


@pytest.mark.parametrize("seed", SEEDS)
def test_pcg64_raw_outputs_equal_numpy(lib, seed):
    want = np.random.default_rng(seed).bit_generator.random_raw(1000)
    assert raw_draws(lib, seed, 1000) == [int(x) for x in want]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_doubles_equal_numpy(lib, seed):
    g = PCG()
    lib.ig_pcg64_seed(ctypes.byref(g), seed)
    got = [lib.ig_pcg64_random(ctypes.byref(g)) for _ in range(1000)]
    assert got == np.random.default_rng(seed).random(1000).tolist()


def test_seed_sequence_of_long_entropy_equals_numpy(lib):
    """Entropy of more words than SeedSequence's pool of four (numpy mixes the rest in)."""
    rng = np.random.default_rng(0)
    for n_words in (1, 3, 4, 5, 8, 13):
        words = rng.integers(0, 2**32, n_words, dtype=np.uint64)
        if words[-1] == 0:
            words[-1] = 1                    # an int's most significant word is not zero
        entropy = sum(int(w) << (32 * i) for i, w in enumerate(words))
        g = PCG()
        arr = (ctypes.c_uint32 * n_words)(*[int(w) for w in words])
        lib.ig_pcg64_seed_words(ctypes.byref(g), arr, n_words)
        want = np.random.PCG64(np.random.SeedSequence(entropy)).random_raw(50)
        assert [lib.ig_pcg64_next(ctypes.byref(g)) for _ in range(50)] == [int(x) for x in want]


def test_unseeded_generators_differ(lib):
    """seed=None: fresh entropy each time, as numpy's default_rng(None)."""
    streams = set()
    for _ in range(4):
        g = PCG()
        assert lib.ig_pcg64_seed_entropy(ctypes.byref(g)) == 0
        streams.add(tuple(lib.ig_pcg64_next(ctypes.byref(g)) for _ in range(4)))
    assert len(streams) == 4


def test_pairwise_sum_equals_numpy(lib):
    rng = np.random.default_rng(4)
    for n in (0, 1, 7, 8, 9, 100, 128, 129, 1000, 4097, 151936):
        x = np.exp(rng.standard_normal(n) * 5)
        assert lib.ig_pairwise_sum(x.ctypes.data, n) == np.sum(x), n


class CSampler:
    def __init__(self, lib, p: SamplingParams, vocab: int, valid=None, prompt=None):
        self.lib = lib
        bias_ids = np.array(list(p.logit_bias.keys()), np.int32)
        bias_vals = np.array(list(p.logit_bias.values()), np.float64)
        self._keep = (bias_ids, bias_vals)
        seed = p.seed
        self.params = Params(
            p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty,
            p.frequency_penalty, bias_ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            bias_vals.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), len(bias_ids),
            seed is not None, 0 if seed is None else seed % 2**64, p.logprobs, p.top_logprobs)
        err = ctypes.create_string_buffer(200)
        v = None if valid is None else np.ascontiguousarray(valid, np.uint8)
        pr = None if prompt is None else np.asarray(prompt, np.int32)
        self._hold = (v, pr)
        self.s = lib.ig_sampler_new(ctypes.byref(self.params), vocab,
                                    None if v is None else v.ctypes.data,
                                    None if pr is None else pr.ctypes.data,
                                    0 if pr is None else len(pr), err, 200)
        assert self.s, err.value.decode()

    def sample(self, logits: np.ndarray, allowed=None):
        info = Info()
        a = None if allowed is None else np.ascontiguousarray(allowed, np.uint8)
        tok = self.lib.ig_sampler_sample(self.s, np.ascontiguousarray(logits, np.float32).ctypes.data,
                                         None if a is None else a.ctypes.data, ctypes.byref(info))
        return tok, info

    def __del__(self):
        if getattr(self, "s", None):
            self.lib.ig_sampler_free(self.s)


class MaskConstraint:
    """A stand-in grammar for sampler.py: the allowed ids of each step, given in advance."""

    def __init__(self, masks):
        self.masks = masks
        self.step = 0

    def mask(self, x):
        x[~self.masks[self.step]] = -np.inf

    def accept(self, token_id):
        self.step += 1


PARAMS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=40),
    dict(temperature=1.3, top_p=0.9),
    dict(temperature=0.8, top_p=0.5, top_k=100, min_p=0.05),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=0.9, repetition_penalty=1.3, top_p=0.95),
    dict(temperature=1.0, repetition_penalty=0.7),
    dict(temperature=1.1, presence_penalty=1.5, frequency_penalty=0.8),
    dict(temperature=1.0, presence_penalty=-2.0, frequency_penalty=-1.0, top_k=7),
    dict(temperature=0.6, logit_bias={3: 100.0, 5: -100.0, 11: 2.5}, top_p=0.99),
    dict(temperature=0.0),
    dict(temperature=1.5, top_k=1),
    dict(temperature=0.0, repetition_penalty=1.2, presence_penalty=0.5, logit_bias={2: 5.0}),
    dict(temperature=2.0, top_p=0.3, logprobs=True, top_logprobs=5),
    dict(temperature=1.0, logprobs=True, top_logprobs=20, repetition_penalty=1.1),
    dict(temperature=0.0, logprobs=True, top_logprobs=3),
]
SAMPLER_SEEDS = [0, 7, 2**32 + 3, 2**64 - 1, -5]


def run_both(lib, params: dict, seed, vocab: int, steps: int, rng, *, ties=False, holes=False,
             masks=False, prompt=True):
    p = SamplingParams(seed=seed, **params)
    valid = rng.random(vocab) > 0.1 if holes else None
    if valid is not None:
        valid[:16] = True                    # the biased ids stay drawable
    prompt_ids = rng.integers(0, vocab, 12).tolist() if prompt else None
    allowed = [rng.random(vocab) > 0.3 for _ in range(steps)] if masks else None
    if allowed:
        for a in allowed:
            a[rng.integers(0, vocab)] = True
    py = Sampler(p, vocab, valid=valid, prompt_ids=prompt_ids,
                 constraint=MaskConstraint(allowed) if allowed else None)
    c = CSampler(lib, p, vocab, valid, prompt_ids)
    for step in range(steps):
        if ties:
            logits = np.round(rng.standard_normal(vocab) * 3).astype(np.float32)
        else:
            logits = (rng.standard_normal(vocab) * rng.uniform(0.5, 6)).astype(np.float32)
        want, want_info = py.sample(logits)
        got, info = c.sample(logits, None if allowed is None else allowed[step])
        where = f"step {step} params {params} seed {seed} vocab {vocab}"
        assert got == want, where
        if p.logprobs:
            assert info.token_id == want_info.token_id
            assert abs(info.logprob - want_info.logprob) <= 1e-6, where
            assert info.n_top == len(want_info.top), where
            got_top = [(info.top[k].token_id, info.top[k].logprob) for k in range(info.n_top)]
            if not ties:
                assert [t for t, _ in got_top] == [t.token_id for t in want_info.top], where
            for (_, lp), t in zip(got_top, want_info.top):
                assert abs(lp - t.logprob) <= 1e-6, where


@pytest.mark.parametrize("params", PARAMS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_same_tokens_as_sampler_py(lib, params):
    rng = np.random.default_rng(zlib.crc32(repr(sorted(params.items())).encode()))
    for seed in SAMPLER_SEEDS:
        run_both(lib, params, seed, vocab=int(rng.integers(20, 400)), steps=60, rng=rng)


@pytest.mark.parametrize("params", PARAMS[:10], ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_same_tokens_with_ties_holes_and_masks(lib, params):
    """Tied logits (top_k keeps ties, top_p orders ties by id), ids with no token, and a grammar's
    mask after logit_bias."""
    rng = np.random.default_rng(5)
    for seed in SAMPLER_SEEDS[:3]:
        run_both(lib, params, seed, vocab=300, steps=60, rng=rng, ties=True, holes=True, masks=True)


@pytest.mark.slow
@pytest.mark.parametrize("params", PARAMS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_same_tokens_at_vocabulary_scale(lib, params):
    """A real model's vocabulary (151936 ids: the top_p path that orders the best 1024 first)."""
    rng = np.random.default_rng(9)
    run_both(lib, params, 2**40 + 17, vocab=151936, steps=50, rng=rng, holes=True)


def test_nucleus_beyond_the_first_1024(lib):
    """Flat distributions over 5000-6000 ids: top_p's nucleus needs more than the 1024 ordered
    first, and the whole candidate set is sorted."""
    rng = np.random.default_rng(2)
    run_both(lib, dict(temperature=1.0, top_p=0.95), 3, vocab=5000, steps=20, rng=rng)
    run_both(lib, dict(temperature=5e-1, top_p=0.4, logprobs=True, top_logprobs=4), 4,
             vocab=5000, steps=20, rng=rng)
    # tied probabilities over 6000 ids: the long sort (a radix sort) must order ties by id
    run_both(lib, dict(temperature=3.0, top_p=0.9), 5, vocab=6000, steps=20, rng=rng, ties=True)


def test_bad_parameters_are_refused(lib):
    err = ctypes.create_string_buffer(200)
    for kw, vocab, what in [(dict(temperature=-1.0), 10, b"temperature"),
                            (dict(top_p=0.0), 10, b"top_p"),
                            (dict(top_logprobs=21), 10, b"top_logprobs"),
                            (dict(repetition_penalty=0.0), 10, b"repetition_penalty"),
                            (dict(), 0, b"vocabulary")]:
        p = Params(**{"temperature": 1.0, "top_p": 1.0, "repetition_penalty": 1.0, **kw})
        assert not lib.ig_sampler_new(ctypes.byref(p), vocab, None, None, 0, err, 200)
        assert what in err.value, err.value
    ids = np.array([10], np.int32)
    vals = np.array([1.0])
    p = Params(temperature=1.0, top_p=1.0, repetition_penalty=1.0,
               bias_ids=ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
               bias_values=vals.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), n_bias=1)
    assert not lib.ig_sampler_new(ctypes.byref(p), 10, None, None, 0, err, 200)
    assert err.value == b"logit_bias key 10 is not a token id of this model (0..9)"


def test_everything_masked_is_an_error_not_a_token(lib):
    p = SamplingParams(temperature=1.0, seed=1)
    c = CSampler(lib, p, 8)
    tok, _ = c.sample(np.zeros(8, np.float32), np.zeros(8, np.uint8))
    assert tok == -1


def test_hostile_runs_under_sanitizers(tmp_path):
    """tests/c/sampler_check.c: random hostile parameters and logits (infinities, NaN, everything
    masked, top_k past the vocabulary, penalties near 0) under ASan + UBSan: an id of the
    vocabulary or -1 every time, never a memory error, a leak or undefined behaviour."""
    cc = require_tool("cc", "install a C compiler, e.g. apt-get install gcc", "the sampler's checks")
    exe = tmp_path / "sampler_check"
    cmd = [cc, *FLAGS, "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
           "-fno-omit-frame-pointer", "-I", str(NATIVE), str(ROOT / "tests" / "c" / "sampler_check.c"),
           str(NATIVE / "sampler.c"), "-o", str(exe), "-lm"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    said = done.stderr.lower()
    if done.returncode != 0 and ("asan" in said or "sanitize" in said):
        missing_tool(f"the compiler cannot build with -fsanitize=address,undefined "
                     f"({done.stderr.strip()[-200:]}): the sanitized sampler run is not checked")
    assert done.returncode == 0, done.stderr
    run = subprocess.run([str(exe), "300", "3"], capture_output=True, text=True, timeout=600,
                         env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
                              "UBSAN_OPTIONS": "print_stacktrace=1"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "runs: 300" in run.stdout, run.stdout


@pytest.mark.parametrize("top_p,min_p", [(0.25, 0.0), (0.5, 0.0), (0.75, 0.0), (0.5, 1.0),
                                         (1.0, 1.0), (0.3, 0.5)])
def test_exact_boundaries_like_sampler_py(lib, top_p, min_p):
    """Equal logits give exact probabilities (1/4 each), so top_p's "mass before < top_p", its
    ties by id, and min_p's "< min_p * max" meet their boundaries exactly."""
    p = SamplingParams(temperature=1.0, top_p=top_p, min_p=min_p, seed=11)
    logits = np.array([-np.inf, 0, 0, -np.inf, 0, 0, -np.inf, -np.inf], np.float32)
    py = Sampler(p, 8)
    c = CSampler(lib, p, 8)
    seen = set()
    for _ in range(60):
        want, _ = py.sample(logits)
        got, _ = c.sample(logits)
        assert got == want
        seen.add(got)
    assert seen == set([1, 2, 4, 5][:math.ceil(top_p * 4)])     # mass before: 0, .25, .5, .75
