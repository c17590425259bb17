"""Bounded fuzzing of the model-file loaders: byte flips, truncations and corrupted length fields of
small safetensors and GGUF files, through every way a file reaches ignis (SafetensorsFile,
load_checkpoint, ignis.load of a model directory, the GGUF tensor index, import_gguf, ignis.load of
a .gguf). Every example must end in success or a typed ignis error (IgnisError), within a hard
time limit and an address-space cap, so a hang or a huge allocation from a corrupt length is a
failure too. Derandomized and database-less: CI runs the same examples every time.
"""
from __future__ import annotations

import contextlib
import faulthandler
import json
import math
import os
import re
import shutil
import signal
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import ignis
from ignis.errors import IgnisError
from ignis.loader.gguf_import import import_gguf, open_gguf, read_tensor
from ignis.loader.gguf_tensors import tensor_index, tensor_rows
from ignis.loader.safetensors import NUMPY_DTYPES, SafetensorsFile, load_checkpoint, save_file
from tiny_models import write_tiny_model

# One example may take this long before it counts as a hang (the slowest path, ignis.load of a
# corrupt .gguf, takes ~0.3 s here). A hang in C code, where the alarm cannot interrupt it, ends
# the process after twice this with every thread's traceback (on stderr: run pytest with -s to
# see it): CI fails instead of stalling.
EXAMPLE_TIMEOUT_S = 20
# Address space an example may add: a corrupt length field that makes a loader allocate more is
# a MemoryError (a test failure) instead of a machine brought down.
EXAMPLE_MEMORY_BYTES = 2 << 30


def fuzz_settings(max_examples: int) -> settings:
    """CI: `max_examples`, the same ones every run. IGNIS_FUZZ_SCALE=N (a local bug hunt): N times
    as many, new random ones each run."""
    scale = int(os.environ.get("IGNIS_FUZZ_SCALE", "0") or 0)
    # deadline: generous, as the hard timeout is what catches hangs; a tight deadline would flake on
    # a busy 2-core CI runner. function_scoped_fixture: the fixtures used are module-scoped files
    # and a per-test scratch directory each example overwrites or empties itself.
    return settings(max_examples=max_examples * max(scale, 1), deadline=10_000,
                    derandomize=scale == 0, database=None, print_blob=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


class ExampleTimeout(BaseException):
    """Raised in the main thread when an example runs too long. A BaseException, so no loader's
    `except Exception` can swallow it."""


@contextlib.contextmanager
def bounded(seconds: float = EXAMPLE_TIMEOUT_S, extra_memory: int = EXAMPLE_MEMORY_BYTES
            ) -> Iterator[None]:
    """Hard wall-clock and address-space limits around one example (Linux; elsewhere time only)."""
    def on_alarm(signum: int, frame: object) -> None:
        raise ExampleTimeout(f"example still running after {seconds} s: a hang")

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(2 * seconds, exit=True)
    old_limit = None
    try:
        import resource
        vm = _vm_size()
        if vm is not None:
            old_limit = resource.getrlimit(resource.RLIMIT_AS)
            cap = vm + extra_memory
            if old_limit[1] == resource.RLIM_INFINITY or cap < old_limit[1]:
                resource.setrlimit(resource.RLIMIT_AS, (cap, old_limit[1]))
            else:
                old_limit = None
    except ImportError:             # pragma: no cover - not POSIX
        pass
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        faulthandler.cancel_dump_traceback_later()
        if old_limit is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, old_limit)


def _vm_size() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


OUTCOMES: dict[str, int] = {}     # every example's result, for a look at what the fuzzing reached


def outcome(fn: Callable[[], object]) -> str:
    """Run one example: 'ok' or 'refused: <error class>'. Anything but an IgnisError propagates and
    fails the test (hypothesis then shrinks it to a minimal corruption)."""
    with bounded():
        try:
            fn()
        except ExampleTimeout as e:
            # out of the loader's reach now: an ordinary failure hypothesis can shrink and print
            raise AssertionError(str(e)) from None
        except IgnisError as e:
            assert str(e), f"{type(e).__name__} with an empty message"
            result = f"refused: {type(e).__name__}"
        else:
            result = "ok"
    event(result)
    OUTCOMES[result] = OUTCOMES.get(result, 0) + 1
    return result


# --- corruptions ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Field:
    """A little-endian integer in a file's header: a length, count, type or offset."""
    offset: int
    width: int          # bytes: 4 or 8
    what: str


def _interesting(width: int, original: int) -> list[int]:
    top = 2 ** (8 * width) - 1
    vals = {0, 1, 2, 3, 7, 8, 31, 32, 255, 256, 2**15, 2**16 - 1, 2**16, 2**24, 2**31 - 1, 2**31,
            2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, top, top - 1,
            original - 1, original + 1, original * 2, original + 2**32}
    return sorted(v for v in vals if 0 <= v <= top)


class Blob(bytes):
    """A file's bytes that print as their length (they are part of the strategies' reprs)."""

    def __repr__(self) -> str:
        return f"<{len(self)} bytes>"


class Corrupted:
    """A corrupted file; its repr says what was done, so a failing example prints in one line
    (a plain class: hypothesis would print a dataclass field by field, bytes and all)."""

    def __init__(self, data: bytes, how: str):
        self.data, self.how = data, how

    def __repr__(self) -> str:
        return f"Corrupted({self.how}, {len(self.data)} bytes)"


@st.composite
def corruptions(draw: st.DrawFn, data: bytes, header_end: int, fields: list[Field]) -> Corrupted:
    """1-3 of: flip bytes (anywhere, or in the header), truncate, set a length field."""
    buf = bytearray(data)
    how = []
    flips_anywhere = st.tuples(st.just("flip"), st.integers(0, len(data) - 1), st.integers(1, 255))
    flips_header = st.tuples(st.just("flip"), st.integers(0, header_end - 1), st.integers(1, 255))
    truncation = st.tuples(st.just("truncate"), st.integers(0, len(data) - 1), st.just(0))
    field = st.tuples(st.just("field"), st.integers(0, len(fields) - 1), st.just(0))
    ops = draw(st.lists(st.one_of(field, flips_header, truncation, flips_anywhere),
                        min_size=1, max_size=3))
    for kind, a, b in ops:
        if kind == "flip" and a < len(buf):
            buf[a] ^= b
            how.append(f"byte {a} ^= {b:#04x}")
        elif kind == "truncate":
            del buf[a:]
            how.append(f"cut at {a}")
        elif kind == "field":
            f = fields[a]
            original = int.from_bytes(data[f.offset:f.offset + f.width], "little")
            value = draw(st.sampled_from(_interesting(f.width, original))
                         | st.integers(0, 2 ** (8 * f.width) - 1))
            if f.offset + f.width <= len(buf):
                buf[f.offset:f.offset + f.width] = value.to_bytes(f.width, "little")
                how.append(f"{f.what} at {f.offset}: {original} -> {value}")
                event(f"field {f.what}")
    return Corrupted(bytes(buf), "; ".join(how) or "unchanged")


# --- safetensors --------------------------------------------------------------------------------

def small_safetensors(path: Path) -> Path:
    """A small file with every kind of entry the reader distinguishes: several dtypes (BF16 stored
    as uint16 bits), a 0-d scalar, an empty tensor, metadata."""
    rng = np.random.default_rng(0)
    tensors = {
        "w.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "w.f16": rng.standard_normal((4,)).astype(np.float16),
        "w.bf16": rng.integers(0, 2**16, (2, 3), dtype=np.uint16),
        "ids.i64": rng.integers(-9, 9, (3,), dtype=np.int64),
        "mask": rng.integers(0, 2, (5,), dtype=np.uint8).astype(bool),
        "scalar": np.array(1.5, np.float64),
        "empty": np.zeros((0, 4), np.float32),
    }
    save_file(tensors, path, {"format": "pt", "note": "fuzz"}, dtypes={"w.bf16": "BF16"})
    return path


def safetensors_fields(data: bytes) -> tuple[int, list[Field]]:
    """(end of the header, the header-length field)."""
    n = int.from_bytes(data[:8], "little")
    return 8 + n, [Field(0, 8, "header length")]


@st.composite
def header_edits(draw: st.DrawFn, data: bytes) -> Corrupted:
    """A well-formed JSON header with one entry's field replaced by another JSON value (a huge,
    negative, fractional or non-numeric dimension or offset, a wrong dtype, a missing field), the
    header length kept right: reaches the checks behind the JSON parser."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    names = sorted(k for k in header if k != "__metadata__")
    name = draw(st.sampled_from(names))
    entry = dict(header[name])
    key = draw(st.sampled_from(["dtype", "shape", "data_offsets", "shape[i]", "data_offsets[i]",
                                "drop", "extra", "__metadata__"]))
    number = (st.integers(-2**70, 2**70)
              | st.sampled_from([0, 1, -1, 2**31, 2**32, 2**63, 2**64 - 1, 2**64, 10**30])
              | st.floats(allow_nan=False, allow_infinity=False))
    value = draw(st.one_of(number, st.none(), st.booleans(), st.text(max_size=6),
                           st.lists(number, max_size=4), st.sampled_from(list(NUMPY_DTYPES) + ["F4"])))
    if key in ("shape[i]", "data_offsets[i]"):
        lst = list(entry[key[:-3]])
        if lst:
            lst[draw(st.integers(0, len(lst) - 1))] = value
        else:
            lst = [value]
        entry[key[:-3]] = lst
    elif key == "drop":
        del entry[draw(st.sampled_from(sorted(entry)))]
    elif key == "extra":
        entry["extra"] = value
    elif key == "__metadata__":
        header["__metadata__"] = value if draw(st.booleans()) else {"k": value}
    else:
        entry[key] = value
    header[name] = entry
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    return Corrupted(struct.pack("<Q", len(hb)) + hb + data[8 + n:],
                     f"header entry {name!r} edited: {key} <- {value!r}")


def read_every_tensor(path: Path) -> None:
    with SafetensorsFile(path) as f:
        for name in f:
            info = f.info(name)
            raw = f.raw(name)
            assert raw.nbytes == info.nbytes
            if info.dtype in NUMPY_DTYPES:
                a = f.tensor(name)
                assert a.shape == info.shape
                a.tobytes()             # touch every byte of the mapping


@pytest.fixture(scope="module")
def small_st(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return Blob(small_safetensors(tmp_path_factory.mktemp("fuzz-st") / "small.safetensors").read_bytes())


@pytest.fixture(scope="module")
def small_st_strategy(small_st: bytes) -> st.SearchStrategy[bytes]:
    end, fields = safetensors_fields(small_st)
    return corruptions(small_st, end, fields) | header_edits(small_st)


@pytest.mark.slow
def test_fuzz_safetensors_file(small_st_strategy, tmp_path: Path) -> None:
    path = tmp_path / "f.safetensors"

    @fuzz_settings(3000)
    @given(data=small_st_strategy)
    def run(data: Corrupted) -> None:
        path.write_bytes(data.data)
        outcome(lambda: read_every_tensor(path))

    run()


# --- a model directory through ignis.load -------------------------------------------------------

@pytest.fixture(scope="module")
def model_copy(tiny_chat_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the complete tiny chat model; tests restore what they corrupt."""
    return Path(shutil.copytree(tiny_chat_dir, tmp_path_factory.mktemp("fuzz-model") / "m"))


def _load_and_run(model_dir: Path) -> None:
    m = ignis.load(str(model_dir), n_ctx=32, threads=1, progress=False)
    try:
        m.generate("hi", max_tokens=2, temperature=0)
    finally:
        m.weights.close()


@pytest.mark.slow
def test_fuzz_model_directory_weights(model_copy: Path) -> None:
    weights = model_copy / "model.safetensors"
    good = Blob(weights.read_bytes())
    end, fields = safetensors_fields(good)

    @fuzz_settings(500)
    @given(data=corruptions(good, end, fields) | header_edits(good))
    def run(data: Corrupted) -> None:
        weights.write_bytes(data.data)
        outcome(lambda: load_checkpoint(model_copy).close())
        outcome(lambda: _load_and_run(model_copy))

    try:
        run()
    finally:
        weights.write_bytes(good)


@st.composite
def json_text_edits(draw: st.DrawFn, good: bytes) -> bytes:
    """A JSON file with one number (its sizes, ids, limits) replaced by another value, or 1-3 byte
    flips and truncations."""
    buf = bytearray(good)
    numbers = list(re.finditer(rb"-?\d+(\.\d+)?(e-?\d+)?", good))
    if numbers and draw(st.booleans()):
        m = draw(st.sampled_from(numbers))
        buf[m.start():m.end()] = draw(st.sampled_from(
            [b"0", b"-1", b"1e999", b"2.5", b"4611686018427387904", b"99999999999999999999999",
             b"null", b"true", b'"x"', b"[]", b"{}"]))
        return bytes(buf)
    for _ in range(draw(st.integers(1, 3))):
        if not buf:
            break
        i = draw(st.integers(0, len(buf) - 1))
        if draw(st.booleans()):
            buf[i] ^= draw(st.integers(1, 255))
        else:
            del buf[i:]
    return bytes(buf)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer_config.json",
                                  "tokenizer.json"])
@pytest.mark.slow
def test_fuzz_model_directory_json(model_copy: Path, name: str) -> None:
    target = model_copy / name
    good = target.read_bytes()

    @fuzz_settings(200)
    @given(data=json_text_edits(good))
    def run(data: bytes) -> None:
        target.write_bytes(data)
        outcome(lambda: _load_and_run(model_copy))

    try:
        run()
    finally:
        target.write_bytes(good)


@pytest.mark.slow
def test_fuzz_sharded_checkpoint(tiny_chat_dir: Path, tmp_path: Path) -> None:
    """A checkpoint in two shards: its index JSON edited, or a shard corrupted."""
    model = Path(shutil.copytree(tiny_chat_dir, tmp_path / "m"))
    (model / "model.safetensors").unlink()
    write_tiny_model(tmp_path / "sharded", sharded=True)
    for f in (tmp_path / "sharded").glob("model*"):
        shutil.copy(f, model / f.name)
    index = model / "model.safetensors.index.json"
    shard = model / "model-00002-of-00002.safetensors"
    good_index, good_shard = index.read_bytes(), Blob(shard.read_bytes())
    end, fields = safetensors_fields(good_shard)
    _load_and_run(model)        # the uncorrupted copy loads

    @fuzz_settings(300)
    @given(index_data=st.none() | json_text_edits(good_index),
           shard_data=st.none() | corruptions(good_shard, end, fields) | header_edits(good_shard))
    def run(index_data: bytes | None, shard_data: Corrupted | None) -> None:
        index.write_bytes(good_index if index_data is None else index_data)
        shard.write_bytes(good_shard if shard_data is None else shard_data.data)
        outcome(lambda: load_checkpoint(model).close())
        outcome(lambda: _load_and_run(model))

    run()


# --- GGUF ---------------------------------------------------------------------------------------

# The smallest sizes that still hold every block kind: Q4_K/Q6_K rows are 256 weights, so the FFN
# is 256 wide and ffn_down (rows of length HIDDEN) carries them; Q8_0 rows are 32 weights.
G_DIM, G_HIDDEN, G_HEADS, G_KV_HEADS, G_VOCAB = 32, 256, 2, 1, 264
G_HEAD_DIM = G_DIM // G_HEADS


def _kquant_rows(rng: np.random.Generator, qtype: QT, rows: int, cols: int) -> np.ndarray:
    """Random Q4_K / Q6_K blocks (gguf cannot quantize to them) with small finite f16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    scale = lambda n: rng.uniform(1e-3, 2e-2, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    if qtype == QT.Q4_K:        # d, dmin, scales[12], qs[128]
        b[:, 0:2], b[:, 2:4] = scale(len(b)), scale(len(b))
    else:                       # Q6_K: ql[128], qh[64], scales[16], d
        b[:, -2:] = scale(len(b))
    return b.reshape(rows, cols // block * size)


def small_gguf_metadata(arch: str = "qwen2") -> dict[str, tuple[VT, object, VT | None]]:
    """key -> (value type, value, array item type) of the small model's metadata, in file order."""
    u32 = lambda v: (VT.UINT32, v, None)
    # GPT-2's byte alphabet (printable Latin-1 bytes are themselves, the rest 256 + n), two merges,
    # the chat markers, unused padding rows up to the embedding size
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = iter(range(256, 512))
    tokens = [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]
    tokens += ["AB", "CD", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * len(tokens)
    types[-3:] = [3, 3, 3]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), G_VOCAB)]
    types += [5] * (G_VOCAB - len(types))
    return {
        f"{arch}.block_count": u32(1), f"{arch}.context_length": u32(128),
        f"{arch}.embedding_length": u32(G_DIM), f"{arch}.feed_forward_length": u32(G_HIDDEN),
        f"{arch}.attention.head_count": u32(G_HEADS),
        f"{arch}.attention.head_count_kv": u32(G_KV_HEADS),
        f"{arch}.rope.freq_base": (VT.FLOAT32, 10000.0, None),
        f"{arch}.attention.layer_norm_rms_epsilon": (VT.FLOAT32, 1e-6, None),
        "tokenizer.ggml.model": (VT.STRING, "gpt2", None),
        "tokenizer.ggml.pre": (VT.STRING, "qwen2", None),
        "tokenizer.ggml.tokens": (VT.ARRAY, tokens, VT.STRING),
        "tokenizer.ggml.token_type": (VT.ARRAY, types, VT.INT32),
        "tokenizer.ggml.merges": (VT.ARRAY, ["A B", "C D"], VT.STRING),
        "tokenizer.ggml.bos_token_id": u32(258), "tokenizer.ggml.eos_token_id": u32(260),
        "tokenizer.ggml.add_bos_token": (VT.BOOL, False, None),
        "tokenizer.chat_template": (VT.STRING, "{% for m in messages %}<|im_start|>"
                                    "{{ m['content'] }}<|im_end|>{% endfor %}", None),
    }


def write_small_gguf(path: Path, arch: str = "qwen2", metadata: dict | None = None) -> Path:
    """A one-layer model with F32 (norms, embedding, biases), F16 (v), Q8_0 (q, k, up), Q4_0 (o),
    Q5_0 (gate) and Q4_K (down) tensors, a byte-level BPE vocabulary and a chat template.
    `metadata` replaces small_gguf_metadata() (the fuzz tests pass edited copies)."""
    rng = np.random.default_rng(0)
    r = lambda *s: (rng.standard_normal(s) * 0.05).astype(np.float32)
    w = gguf.GGUFWriter(path, arch)
    for key, (vtype, value, item_type) in (metadata or small_gguf_metadata(arch)).items():
        w.add_key_value(key, value, vtype, sub_type=item_type)

    def add(name: str, a: np.ndarray, qtype: QT = QT.F32) -> None:
        if qtype == QT.F32:
            w.add_tensor(name, a)
        elif qtype == QT.F16:
            w.add_tensor(name, a.astype(np.float16))
        elif qtype in (QT.Q4_K, QT.Q6_K):
            w.add_tensor(name, _kquant_rows(rng, qtype, *a.shape), raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)

    add("token_embd.weight", r(G_VOCAB, G_DIM))
    add("output_norm.weight", 1 + r(G_DIM))
    add("blk.0.attn_norm.weight", 1 + r(G_DIM))
    add("blk.0.ffn_norm.weight", 1 + r(G_DIM))
    add("blk.0.attn_q.weight", r(G_HEADS * G_HEAD_DIM, G_DIM), QT.Q8_0)
    add("blk.0.attn_k.weight", r(G_KV_HEADS * G_HEAD_DIM, G_DIM), QT.Q8_0)
    add("blk.0.attn_v.weight", r(G_KV_HEADS * G_HEAD_DIM, G_DIM), QT.F16)
    add("blk.0.attn_output.weight", r(G_DIM, G_HEADS * G_HEAD_DIM), QT.Q4_0)
    if arch == "qwen2":
        add("blk.0.attn_q.bias", r(G_HEADS * G_HEAD_DIM))
        add("blk.0.attn_k.bias", r(G_KV_HEADS * G_HEAD_DIM))
        add("blk.0.attn_v.bias", r(G_KV_HEADS * G_HEAD_DIM))
    add("blk.0.ffn_gate.weight", r(G_HIDDEN, G_DIM), QT.Q5_0)
    add("blk.0.ffn_up.weight", r(G_HIDDEN, G_DIM), QT.Q8_0)
    add("blk.0.ffn_down.weight", r(G_DIM, G_HIDDEN), QT.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_fields(data: bytes) -> tuple[int, list[Field]]:
    """Walk a well-formed GGUF header (written by the test itself) and list every length, count,
    type, dimension and offset field in it; (end of the tensor table, fields)."""
    fields: list[Field] = [Field(4, 4, "version"), Field(8, 8, "tensor count"),
                           Field(16, 8, "metadata count")]
    at = 24
    u32 = lambda: struct.unpack_from("<I", data, at)[0]
    u64 = lambda: struct.unpack_from("<Q", data, at)[0]
    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def string(what: str) -> None:
        nonlocal at
        fields.append(Field(at, 8, f"{what} length"))
        at += 8 + u64()

    def value(vtype: int, what: str) -> None:
        nonlocal at
        if vtype == 8:
            string(what)
        elif vtype == 9:
            fields.append(Field(at, 4, f"{what} item type"))
            itype = u32()
            at += 4
            fields.append(Field(at, 8, f"{what} count"))
            count = u64()
            at += 8
            for i in range(count):
                value(itype, what if i else f"{what} item")
        else:
            at += scalar[vtype]

    for _ in range(struct.unpack_from("<Q", data, 16)[0]):
        key = data[at + 8:at + 8 + u64()].decode()
        string("key")
        fields.append(Field(at, 4, "value type"))
        vtype = u32()
        at += 4
        if vtype in scalar and scalar[vtype] >= 2:
            fields.append(Field(at, scalar[vtype], f"value of {key}"))
        value(vtype, "value")
    for _ in range(struct.unpack_from("<Q", data, 8)[0]):
        string("tensor name")
        fields.append(Field(at, 4, "dim count"))
        n_dims = u32()
        at += 4
        for _ in range(n_dims):
            fields.append(Field(at, 8, "dim"))
            at += 8
        fields.append(Field(at, 4, "tensor type"))
        fields.append(Field(at + 4, 8, "tensor offset"))
        at += 12
    return at, fields


# Keys the importer reads beyond those the small model has.
_MORE_GGUF_KEYS = ["qwen2.attention.key_length", "qwen2.attention.value_length",
                   "qwen2.rope.dimension_count", "qwen2.rope.scaling.type",
                   "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id",
                   "tokenizer.ggml.add_eos_token", "general.alignment"]
_INT_RANGES = {VT.UINT8: (0, 2**8 - 1), VT.INT8: (-2**7, 2**7 - 1), VT.UINT16: (0, 2**16 - 1),
               VT.INT16: (-2**15, 2**15 - 1), VT.UINT32: (0, 2**32 - 1),
               VT.INT32: (-2**31, 2**31 - 1), VT.UINT64: (0, 2**64 - 1),
               VT.INT64: (-2**63, 2**63 - 1)}


def _gguf_int(vtype: VT) -> st.SearchStrategy[int]:
    lo, hi = _INT_RANGES[vtype]
    edges = [v for v in (lo, hi, -1, 0, 1, 2, 255, 256, 257, 258, 260, 263, 264, 2**31, 2**62)
             if lo <= v <= hi]
    return st.sampled_from(edges) | st.integers(lo, hi)


def _gguf_scalar() -> st.SearchStrategy[tuple[VT, object, VT | None]]:
    ints = st.sampled_from(sorted(_INT_RANGES)).flatmap(
        lambda t: _gguf_int(t).map(lambda v: (t, v, None)))
    floats = st.one_of(st.floats(width=32).map(lambda v: (VT.FLOAT32, v, None)),
                       st.floats().map(lambda v: (VT.FLOAT64, v, None)))
    strings = st.one_of(st.text(max_size=12), st.binary(max_size=12),
                        st.sampled_from(["gpt2", "llama", "qwen2", "smollm", "none", "linear", ""])
                        ).map(lambda v: (VT.STRING, v, None))
    return st.one_of(ints, floats, strings, st.booleans().map(lambda v: (VT.BOOL, v, None)))


def _gguf_value() -> st.SearchStrategy[tuple[VT, object, VT | None]]:
    arrays = st.one_of(
        st.sampled_from(sorted(_INT_RANGES)).flatmap(
            lambda t: st.lists(_gguf_int(t), min_size=1, max_size=6).map(lambda v: (VT.ARRAY, v, t))),
        st.lists(st.text(max_size=6) | st.binary(max_size=6), min_size=1, max_size=6).map(
            lambda v: (VT.ARRAY, v, VT.STRING)))
    return _gguf_scalar() | arrays


@st.composite
def gguf_metadata_edits(draw: st.DrawFn) -> dict[str, tuple | None]:
    """1-3 of the small model's metadata keys (or keys the importer reads that it lacks) dropped
    (None) or set to a value of any type."""
    keys = sorted(small_gguf_metadata()) + _MORE_GGUF_KEYS
    edits = draw(st.dictionaries(st.sampled_from(keys), st.none() | _gguf_value(),
                                 min_size=1, max_size=3))
    for key, value in edits.items():
        event(f"{'dropped' if value is None else 'set'} {key}")
    return edits


def edited_metadata(edits: dict[str, tuple | None]) -> dict:
    meta = small_gguf_metadata()
    for key, value in edits.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    return meta


def read_gguf_tensor_table(path: Path) -> None:
    """The weight_format='gguf' reader: the tensor index, then every tensor's rows."""
    for loc in tensor_index(path).values():
        qt = QT(loc.type_id) if loc.type_id in QT._value2member_map_ else None
        if qt is None or qt not in gguf.GGML_QUANT_SIZES or not loc.dims:
            continue
        block, size = gguf.GGML_QUANT_SIZES[qt]
        rows = math.prod(loc.dims[1:])
        if loc.dims[0] % block or rows > 1 << 20 or loc.dims[0] > 1 << 24:
            continue        # the engine never asks for such rows (it checks the import record)
        tensor_rows(path, loc, rows, loc.dims[0] // block * size)


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return Blob(write_small_gguf(tmp_path_factory.mktemp("fuzz-gguf") / "small.gguf").read_bytes())


@pytest.fixture(scope="module")
def small_gguf_strategy(small_gguf: bytes) -> st.SearchStrategy[bytes]:
    end, fields = gguf_fields(small_gguf)
    return corruptions(small_gguf, end, fields)


def test_small_gguf_imports_and_loads(small_gguf: bytes, tmp_path: Path) -> None:
    """The uncorrupted file is a valid model in every path the fuzz tests drive (so they start from
    success, and a refusal below is caused by the corruption)."""
    src = tmp_path / "small.gguf"
    src.write_bytes(small_gguf)
    model = open_gguf(src)
    assert {p.qtype for p in model.tensors} == {QT.F32, QT.F16, QT.Q8_0, QT.Q4_0, QT.Q5_0,
                                                QT.Q4_K}
    for p in model.tensors:
        assert np.all(np.isfinite(read_tensor(model, p)))
    read_gguf_tensor_table(src)
    out = import_gguf(src, tmp_path / "out", progress=False)
    assert (out / "model.safetensors").is_file()
    for fmt in ("f32", "gguf"):
        m = ignis.load(str(src), weight_format=fmt, n_ctx=32, threads=1, progress=False)
        m.generate("AB", max_tokens=2, temperature=0)
        m.weights.close()


@pytest.mark.slow
def test_fuzz_gguf_tensor_index(small_gguf_strategy, tmp_path: Path) -> None:
    path = tmp_path / "f.gguf"

    @fuzz_settings(3000)
    @given(data=small_gguf_strategy)
    def run(data: Corrupted) -> None:
        path.write_bytes(data.data)
        outcome(lambda: read_gguf_tensor_table(path))

    run()


@pytest.mark.slow
def test_fuzz_gguf_import(small_gguf_strategy, tmp_path: Path) -> None:
    src = tmp_path / "f.gguf"
    out = tmp_path / "out"

    @fuzz_settings(1000)
    @given(data=small_gguf_strategy)
    def run(data: Corrupted) -> None:
        src.write_bytes(data.data)
        shutil.rmtree(out, ignore_errors=True)
        outcome(lambda: import_gguf(src, out, progress=False))
        assert sorted(p.name for p in tmp_path.iterdir() if p.name != "f.gguf") in ([], ["out"])

    run()


@pytest.mark.slow
def test_fuzz_gguf_load(small_gguf_strategy, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """ignis.load of a corrupt .gguf, in both weight formats (the cache import, then the engine
    reading the file's own blocks)."""
    monkeypatch.setenv("IGNIS_HOME", str(tmp_path / "home"))
    src = tmp_path / "f.gguf"

    def load(fmt: str) -> None:
        m = ignis.load(str(src), weight_format=fmt, n_ctx=32, threads=1, progress=False)
        try:
            m.generate("AB", max_tokens=2, temperature=0)
        finally:
            m.weights.close()

    @fuzz_settings(400)
    @given(data=small_gguf_strategy, fmt=st.sampled_from(["f32", "gguf"]))
    def run(data: Corrupted, fmt: str) -> None:
        src.write_bytes(data.data)
        outcome(lambda: load(fmt))

    run()


@pytest.mark.slow
def test_fuzz_gguf_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Well-formed files whose metadata values have any type and value: the importer's checks."""
    monkeypatch.setenv("IGNIS_HOME", str(tmp_path / "home"))
    src = tmp_path / "f.gguf"

    def load() -> None:
        m = ignis.load(str(src), n_ctx=32, threads=1, progress=False)
        try:
            m.generate("AB", max_tokens=2, temperature=0)
        finally:
            m.weights.close()

    @fuzz_settings(800)
    @given(edits=gguf_metadata_edits())
    def run(edits: dict) -> None:
        write_small_gguf(src, metadata=edited_metadata(edits))
        outcome(lambda: read_gguf_tensor_table(src))
        outcome(load)

    run()
