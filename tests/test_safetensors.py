"""ignis.loader.safetensors against hand-made malformed files and the official `safetensors`
package (the reference: files each side writes must read bit-exactly on the other side)."""
from __future__ import annotations

import json
import math
import mmap
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.numpy as st_np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ignis.errors import ModelNotFoundError, SafetensorsError
from ignis.formats.bf16 import bf16_to_f32, f32_to_bf16
from ignis.loader import safetensors as ist
from ignis.loader.config import ModelConfig
from ignis.loader.safetensors import (
    SafetensorsFile, SafetensorsWriter, TensorNotFoundError, UnsupportedDtypeError, load_checkpoint,
    save_file,
)
from tiny_models import write_tiny_model


# --- helpers -----------------------------------------------------------------------------------

def raw_file(header: dict | bytes | str, data: bytes = b"", n: int | None = None) -> bytes:
    """A safetensors file byte by byte: header given as an object, JSON text or raw bytes."""
    if isinstance(header, dict):
        hb = json.dumps(header).encode()
    elif isinstance(header, str):
        hb = header.encode()
    else:
        hb = header
    return struct.pack("<Q", len(hb) if n is None else n) + hb + data


def entry(dtype: str, shape: list, offsets: list) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


def official_roundtrip_ok(path: Path) -> bool:
    """True when the official reader accepts the file."""
    try:
        safetensors.deserialize(path.read_bytes())
        return True
    except Exception:       # noqa: BLE001 - any refusal counts; its types differ per version
        return False


# (id, file bytes, words the message must contain, tensor the error must name, official refuses)
# The last column records where the official reader is more lenient than ignis; every other
# case is checked to be refused by it too, so the table cannot drift into inventing rules.
MALFORMED = [
    ("empty-file", b"", "too short", None, True),
    ("truncated-length", b"\x10\x00\x00", "too short", None, True),
    ("header-too-large", raw_file(b"{}", n=100_000_001), "exceeds the 100000000-byte limit",
     None, True),
    ("header-length-u64-max", raw_file(b"{}", n=2**64 - 1), "exceeds", None, True),
    ("header-past-eof", raw_file(b'{"a": 1}', n=64), "past the end of the file", None, True),
    ("header-truncated", raw_file(entry("F32", [2], [0, 8]))[:-5], "past the end of the file",
     None, True),
    ("header-empty", raw_file(b""), "not valid JSON", None, True),
    ("header-not-utf8", raw_file(b'{"\xff\xfe": 1}   '), "not valid UTF-8", None, True),
    ("header-not-json", raw_file(b'{"a": [0, '), "not valid JSON", None, True),
    ("header-nan", raw_file(b'{"__metadata__": {"x": NaN}}'), "not valid JSON", None, True),
    ("header-nested-deeply", raw_file(b"[" * 100_000 + b"]" * 100_000), "nested too deeply",
     None, True),
    ("header-array", raw_file(b"[1, 2, 3]"), "must be an object", None, True),
    ("header-string", raw_file(b'"abc"'), "must be an object", None, True),
    ("entry-not-object", raw_file({"t": [1, 2]}), "entry must be an object", "t", True),
    ("missing-dtype", raw_file({"t": {"shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
     "no 'dtype' field", "t", True),
    ("missing-shape", raw_file({"t": {"dtype": "F32", "data_offsets": [0, 4]}}, b"\0" * 4),
     "no 'shape' field", "t", True),
    ("missing-offsets", raw_file({"t": {"dtype": "F32", "shape": [1]}}, b"\0" * 4),
     "no 'data_offsets' field", "t", True),
    ("unknown-field", raw_file({"t": {**entry("F32", [1], [0, 4]), "offset": 0}}, b"\0" * 4),
     "unknown field", "t", False),
    ("unknown-dtype", raw_file({"t": entry("F17", [1], [0, 4])}, b"\0" * 4), "unknown dtype",
     "t", True),
    ("dtype-lowercase", raw_file({"t": entry("f32", [1], [0, 4])}, b"\0" * 4), "unknown dtype",
     "t", True),
    ("dtype-not-string", raw_file({"t": entry(4, [1], [0, 4])}, b"\0" * 4), "unknown dtype",
     "t", True),
    ("sub-byte-dtype", raw_file({"t": entry("F4", [2], [0, 1])}, b"\0"), "F4", "t", False),
    ("shape-not-list", raw_file({"t": entry("F32", 4, [0, 16])}, b"\0" * 16), "shape must be",
     "t", True),
    ("negative-dim", raw_file({"t": entry("F32", [-1, 4], [0, 16])}, b"\0" * 16),
     "negative dimension", "t", True),
    ("float-dim", raw_file({"t": entry("F32", [2.0], [0, 8])}, b"\0" * 8),
     "non-integer dimension", "t", True),
    ("string-dim", raw_file({"t": entry("F32", ["2"], [0, 8])}, b"\0" * 8),
     "non-integer dimension", "t", True),
    ("bool-dim", raw_file({"t": entry("F32", [True], [0, 4])}, b"\0" * 4),
     "non-integer dimension", "t", True),
    ("numel-overflows-u64", raw_file({"t": entry("U8", [2**32, 2**32, 2], [0, 8])}, b"\0" * 8),
     "overflows 64 bits", "t", True),
    # Like the official checked product, overflow is checked left to right: a later 0 dim
    # does not rescue a product that already overflowed.
    ("overflow-before-zero-dim", raw_file({"t": entry("U8", [2**40, 2**40, 0], [0, 0])}),
     "element count overflows", "t", True),
    ("nbytes-overflows-u64", raw_file({"t": entry("F32", [2**62], [0, 8])}, b"\0" * 8),
     "overflows 64 bits", "t", True),
    ("dim-beyond-u64", raw_file({"t": entry("U8", [2**64], [0, 8])}, b"\0" * 8),
     "overflows 64 bits", "t", True),
    ("wrong-byte-count", raw_file({"t": entry("F32", [2, 2], [0, 12])}, b"\0" * 12),
     "span 12 bytes but dtype F32 with shape [2, 2] needs 16", "t", True),
    ("byte-count-too-large", raw_file({"t": entry("F32", [1], [0, 8])}, b"\0" * 8),
     "span 8 bytes but dtype F32 with shape [1] needs 4", "t", True),
    ("offsets-reversed", raw_file({"t": entry("F32", [1], [8, 4])}, b"\0" * 8),
     "begin after they end", "t", True),
    ("offsets-past-eof", raw_file({"t": entry("F32", [4], [0, 16])}, b"\0" * 8),
     "past the end of the data region", "t", True),
    ("offsets-one-number", raw_file({"t": entry("F32", [1], [4])}, b"\0" * 4),
     "must be [begin, end]", "t", True),
    ("offsets-three-numbers", raw_file({"t": entry("F32", [1], [0, 4, 8])}, b"\0" * 4),
     "must be [begin, end]", "t", True),
    ("offsets-negative", raw_file({"t": entry("F32", [1], [-4, 0])}, b"\0" * 4),
     "two integers", "t", True),
    ("offsets-beyond-u64", raw_file({"t": entry("F32", [1], [2**64, 2**64 + 4])}, b"\0" * 4),
     "two integers", "t", True),
    ("offsets-strings", raw_file({"t": entry("F32", [1], ["0", "4"])}, b"\0" * 4),
     "two integers", "t", True),
    ("overlap", raw_file({"a": entry("F32", [2], [0, 8]), "b": entry("F32", [2], [4, 12])},
                         b"\0" * 12), "overlaps tensor 'a'", "b", True),
    ("overlap-by-one-byte", raw_file({"a": entry("U8", [2], [0, 2]), "b": entry("U8", [2], [1, 3])},
                                     b"\0" * 3), "overlaps tensor 'a'", "b", True),
    ("same-offsets", raw_file({"a": entry("F32", [2], [0, 8]), "b": entry("F32", [2], [0, 8])},
                              b"\0" * 8), "overlaps", "b", True),
    ("empty-tensor-inside-another", raw_file({"a": entry("F32", [2], [0, 8]),
                                              "b": entry("F32", [0], [4, 4])}, b"\0" * 8),
     "overlaps tensor 'a'", "b", True),
    ("gap", raw_file({"a": entry("F32", [1], [0, 4]), "b": entry("F32", [1], [8, 12])},
                     b"\0" * 12), "4 byte gap", "b", True),
    ("gap-of-one-byte", raw_file({"a": entry("U8", [1], [0, 1]), "b": entry("U8", [1], [2, 3])},
                                 b"\0" * 3), "1 byte gap", "b", True),
    ("gap-at-start", raw_file({"a": entry("F32", [1], [4, 8])}, b"\0" * 8), "4 byte gap", "a",
     True),
    ("trailing-bytes", raw_file({"a": entry("F32", [1], [0, 4])}, b"\0" * 8),
     "4 trailing bytes", None, True),
    ("data-without-tensors", raw_file({}, b"\0" * 4), "4 trailing bytes", None, True),
    ("duplicate-tensor", raw_file('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                                  '"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
                                  b"\0" * 8), "'a' appears twice", "a", True),
    ("duplicate-field", raw_file('{"a": {"dtype": "F32", "dtype": "F16", "shape": [1], '
                                 '"data_offsets": [0, 4]}}', b"\0" * 4), "'dtype' twice", "a",
     True),
    ("duplicate-metadata-key", raw_file('{"__metadata__": {"k": "1", "k": "2"}}'),
     "'k' twice in __metadata__", None, False),
    ("metadata-int-value", raw_file({"__metadata__": {"format": 1}}), "must be a string",
     None, True),
    ("metadata-nested", raw_file({"__metadata__": {"format": {"a": "b"}}}), "must be a string",
     None, True),
    ("metadata-not-object", raw_file({"__metadata__": "pt"}), "__metadata__ must be an object",
     None, True),
    ("name-lone-surrogate", raw_file('{"\\ud800": {"dtype": "F32", "shape": [1], '
                                     '"data_offsets": [0, 4]}}', b"\0" * 4), "not valid Unicode",
     None, True),
]


@pytest.mark.parametrize("case_id,data,words,tensor,official_refuses", MALFORMED,
                         ids=[c[0] for c in MALFORMED])
def test_malformed_file_refused(tmp_path: Path, case_id: str, data: bytes, words: str,
                                tensor: str | None, official_refuses: bool) -> None:
    path = tmp_path / f"{case_id}.safetensors"
    path.write_bytes(data)
    with pytest.raises(SafetensorsError) as ei:
        SafetensorsFile(path)
    err = ei.value
    assert words in str(err)
    assert str(path) in str(err) and err.path == str(path)
    assert err.tensor == tensor
    if tensor is not None:
        assert repr(tensor) in str(err)
    # The reference agrees that the file is bad (except where the table records it is lenient).
    assert official_roundtrip_ok(path) is (not official_refuses)


def test_malformed_kinds_count() -> None:
    # The issue asks for at least 15 kinds; this table must not shrink below that silently.
    assert len(MALFORMED) >= 15


def test_sub_byte_dtype_has_its_own_type(tmp_path: Path) -> None:
    path = tmp_path / "f4.safetensors"
    path.write_bytes(raw_file({"t": entry("F4", [2], [0, 1])}, b"\0"))
    with pytest.raises(UnsupportedDtypeError):
        SafetensorsFile(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not found"):
        SafetensorsFile(tmp_path / "nope.safetensors")
    with pytest.raises(SafetensorsError, match="is a directory"):
        SafetensorsFile(tmp_path)


def test_minimal_files_accepted(tmp_path: Path) -> None:
    # Edge cases the format allows: no tensors; an empty tensor at the very end; header padding.
    p = tmp_path / "empty.safetensors"
    p.write_bytes(raw_file(b"{}      "))
    with SafetensorsFile(p) as f:
        assert len(f) == 0 and f.keys() == [] and f.metadata == {}
    p2 = tmp_path / "tail.safetensors"
    p2.write_bytes(raw_file({"a": entry("I32", [1], [0, 4]), "z": entry("F32", [0, 3], [4, 4]),
                             "__metadata__": None}, struct.pack("<i", -7)))
    with SafetensorsFile(p2) as f:
        assert f.keys() == ["a", "z"]
        assert f.tensor("a").tolist() == [-7]
        assert f.tensor("z").shape == (0, 3)
    assert official_roundtrip_ok(p2)


def test_empty_tensor_too_large_for_numpy_is_a_typed_error(tmp_path: Path) -> None:
    # Found by tests/test_fuzz_loaders.py: the format (and the official reader) allows any
    # dimension next to a 0, but NumPy cannot make a [0, 2**61] F64 array (a bare ValueError).
    p = tmp_path / "huge-empty.safetensors"
    p.write_bytes(raw_file({"a": entry("I32", [1], [0, 4]), "z": entry("F64", [0, 2**61], [4, 4])},
                           struct.pack("<i", 3)))
    assert official_roundtrip_ok(p)
    with SafetensorsFile(p) as f:
        assert f.tensor("a").tolist() == [3]
        assert f.raw("z").nbytes == 0
        with pytest.raises(SafetensorsError, match=r"empty tensor of shape \[0, 2305843009213693952\]"):
            f.tensor("z")


# --- reading and writing against the official package ----------------------------------------

def _sample_arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((7,)).astype(np.float16),
        "f64": rng.standard_normal((2, 2, 2)),
        "i8": rng.integers(-128, 128, (4, 3), dtype=np.int8),
        "u8": rng.integers(0, 256, (9,), dtype=np.uint8),
        "i16": rng.integers(-2**15, 2**15, (3,), dtype=np.int16),
        "i32": rng.integers(-2**31, 2**31, (2, 3), dtype=np.int32),
        "i64": rng.integers(-2**63, 2**63 - 1, (5,), dtype=np.int64),
        "u32": rng.integers(0, 2**32, (2,), dtype=np.uint32),
        "bool": rng.integers(0, 2, (6,)).astype(bool),
        "scalar": np.array(3.25, dtype=np.float32),
        "scalar_i64": np.array(-9, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "empty_mid": np.zeros((3, 0, 2), dtype=np.int8),
        "specials": np.array([np.inf, -np.inf, np.nan, -0.0, 1e-45], dtype=np.float32),
    }


def _assert_bits_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def test_ours_written_official_reads(tmp_path: Path) -> None:
    arrays = _sample_arrays(np.random.default_rng(1))
    path = tmp_path / "ours.safetensors"
    save_file(arrays, path, {"format": "np", "note": "ünïcode"})
    got = st_np.load_file(path)
    assert set(got) == set(arrays)
    for k, a in arrays.items():
        _assert_bits_equal(got[k], a)
    with safetensors.safe_open(path, framework="np") as f:
        assert f.metadata() == {"format": "np", "note": "ünïcode"}


def test_official_written_ours_reads(tmp_path: Path) -> None:
    arrays = _sample_arrays(np.random.default_rng(2))
    path = tmp_path / "official.safetensors"
    st_np.save_file(arrays, path, metadata={"format": "np"})
    with SafetensorsFile(path) as f:
        assert f.metadata == {"format": "np"}
        assert sorted(f.keys()) == sorted(arrays)
        for k, a in arrays.items():
            _assert_bits_equal(f.tensor(k), a)


def test_bf16_both_directions(tmp_path: Path) -> None:
    # No torch: the official package's raw serialize/deserialize carry BF16 as bytes.
    bits = np.random.default_rng(3).integers(0, 2**16, (4, 6), dtype=np.uint16)
    ours = tmp_path / "ours.safetensors"
    save_file({"w": bits}, ours, dtypes={"w": "BF16"})
    (name, view), = safetensors.deserialize(ours.read_bytes())
    assert (name, view["dtype"], view["shape"]) == ("w", "BF16", [4, 6])
    assert bytes(view["data"]) == bits.tobytes()

    theirs = tmp_path / "theirs.safetensors"
    spec = safetensors.TensorSpec(dtype="bfloat16", shape=[4, 6], data_ptr=bits.ctypes.data,
                                  data_len=bits.nbytes)
    safetensors.serialize_file({"w": spec}, str(theirs))
    with SafetensorsFile(theirs) as f:
        assert f.info("w").dtype == "BF16"
        _assert_bits_equal(f.tensor("w"), bits)
        np.testing.assert_array_equal(bf16_to_f32(f.tensor("w")).view(np.uint32),
                                      bits.astype(np.uint32) << 16)


def test_same_bytes_as_official_writer(tmp_path: Path) -> None:
    # With tensors of one element size given in name order, the official writer's layout
    # (sorted by dtype, then name) and ours coincide, so the files must be byte-identical.
    rng = np.random.default_rng(4)
    arrays = {f"layer.{i}.w": rng.standard_normal((i + 1, 3)).astype(np.float32) for i in range(5)}
    arrays["layer.9.b"] = np.array([1, 2], dtype=np.int32)
    arrays = dict(sorted(arrays.items()))
    ours = tmp_path / "ours.safetensors"
    save_file(arrays, ours, {"format": "pt"})
    assert ours.read_bytes() == st_np.save(arrays, metadata={"format": "pt"})


def test_fp8_tensors_are_readable_as_bytes_only(tmp_path: Path) -> None:
    raw = bytes(range(6))
    p = tmp_path / "fp8.safetensors"
    p.write_bytes(raw_file({"q": entry("F8_E4M3", [2, 3], [0, 6])}, raw))
    with SafetensorsFile(p) as f:
        assert f.raw("q").tobytes() == raw
        with pytest.raises(UnsupportedDtypeError, match="raw"):
            f.tensor("q")


# --- zero copy and lifetime ---------------------------------------------------------------------

def test_tensors_are_zero_copy_read_only_views(tmp_path: Path) -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    p = tmp_path / "a.safetensors"
    save_file({"a": a, "b": np.ones(3, np.float16)}, p)
    f = SafetensorsFile(p)
    t = f.tensor("a")
    assert not t.flags.writeable and t.flags.c_contiguous and t.flags.aligned
    with pytest.raises(ValueError):
        t[0, 0] = 1.0
    base = t
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    assert isinstance(base, mmap.mmap)              # the view's memory is the file mapping
    whole = np.frombuffer(base, dtype=np.uint8)
    assert t.ctypes.data - whole.ctypes.data == f.info("a").offset
    assert np.shares_memory(t, f.tensor("a"))
    np.testing.assert_array_equal(t, a)
    f.close()
    np.testing.assert_array_equal(t, a)             # views outlive close()
    with pytest.raises(SafetensorsError, match="closed"):
        f.tensor("a")


def test_unknown_name_is_keyerror_with_suggestions(tiny_qwen2_dir: Path) -> None:
    with SafetensorsFile(tiny_qwen2_dir / "model.safetensors") as f:
        with pytest.raises(KeyError) as ei:
            f.tensor("model.layers.0.self_attn.q_proj.weigth")
    err = ei.value
    assert isinstance(err, TensorNotFoundError)
    assert "model.layers.0.self_attn.q_proj.weight" in err.close_matches
    assert "model.safetensors" in str(err) and "q_proj.weigth" in str(err)


# --- writer -------------------------------------------------------------------------------------

def test_writer_aligns_every_tensor(tmp_path: Path) -> None:
    specs = [("b", "BOOL", (3,)), ("h", "F16", (5,)), ("d", "F64", (2,)), ("f", "F32", (3,)),
             ("u", "U8", (1,))]
    p = tmp_path / "mix.safetensors"
    with SafetensorsWriter(p, specs) as w:
        # any write order is accepted
        for name, dt, shape in reversed(specs):
            w.write(name, np.zeros(shape, dtype=ist.NUMPY_DTYPES[dt]))
    with SafetensorsFile(p) as f:
        assert (8 + f.header_size) % 8 == 0
        for name in f:
            info = f.info(name)
            assert info.offset % ist.DTYPE_SIZES[info.dtype] == 0, name
    assert official_roundtrip_ok(p)


def _dir_listing(d: Path) -> list[str]:
    return sorted(os.listdir(d))


def test_writer_exception_mid_write_leaves_nothing(tmp_path: Path) -> None:
    p = tmp_path / "model.safetensors"
    specs = [("a", "F32", (1000,)), ("b", "F32", (1000,))]
    with pytest.raises(RuntimeError, match="boom"):
        with SafetensorsWriter(p, specs) as w:
            w.write("a", np.ones(1000, np.float32))
            raise RuntimeError("boom")
    assert _dir_listing(tmp_path) == []


def test_writer_failure_keeps_existing_file(tmp_path: Path) -> None:
    p = tmp_path / "model.safetensors"
    save_file({"old": np.ones(2, np.float32)}, p)
    before = p.read_bytes()
    with pytest.raises(SafetensorsError, match="never written"):
        with SafetensorsWriter(p, [("a", "F32", (2,)), ("b", "I8", (1,))]) as w:
            w.write("a", np.zeros(2, np.float32))
    assert p.read_bytes() == before
    assert _dir_listing(tmp_path) == ["model.safetensors"]


@pytest.mark.parametrize("array,words", [
    (np.zeros(4, np.float64), "dtype float64 does not match F32"),
    (np.zeros(5, np.float32), "shape (5,) does not match"),
    (np.zeros((4, 2), np.float32)[:, 0], "not C-contiguous"),
    (np.zeros(4, ">f4"), "does not match F32"),
    ([0.0, 0.0, 0.0, 0.0], "expected a numpy array"),
])
def test_writer_checks_each_array(tmp_path: Path, array, words: str | None) -> None:
    p = tmp_path / "w.safetensors"
    with SafetensorsWriter(p, [("a", "F32", (4,))]) as w:
        if words is None:
            w.write("a", array)
        else:
            with pytest.raises(SafetensorsError, match=words.replace("(", r"\(").replace(")", r"\)")):
                w.write("a", array)
            w.write("a", np.zeros(4, np.float32))
    assert official_roundtrip_ok(p)


def test_writer_refuses_bad_specs_and_misuse(tmp_path: Path) -> None:
    p = tmp_path / "w.safetensors"
    with pytest.raises(SafetensorsError, match="twice"):
        SafetensorsWriter(p, [("a", "F32", (1,)), ("a", "F32", (1,))])
    with pytest.raises(SafetensorsError, match="cannot write dtype"):
        SafetensorsWriter(p, [("a", "F17", (1,))])
    with pytest.raises(SafetensorsError, match="non-negative"):
        SafetensorsWriter(p, [("a", "F32", (-1,))])
    with pytest.raises(SafetensorsError, match="invalid tensor name"):
        SafetensorsWriter(p, [("__metadata__", "F32", (1,))])
    with pytest.raises(SafetensorsError, match="strings"):
        SafetensorsWriter(p, [("a", "F32", (1,))], {"n": 1})
    with SafetensorsWriter(p, [("a", "F32", (1,))]) as w:
        w.write("a", np.zeros(1, np.float32))
        with pytest.raises(SafetensorsError, match="written twice"):
            w.write("a", np.zeros(1, np.float32))
        with pytest.raises(KeyError):
            w.write("b", np.zeros(1, np.float32))
    with pytest.raises(SafetensorsError, match="closed"):
        w.write("a", np.zeros(1, np.float32))
    assert _dir_listing(tmp_path) == ["w.safetensors"]


def test_writer_failed_write_is_not_reported_as_success(tmp_path: Path) -> None:
    p = tmp_path / "w.safetensors"
    w = SafetensorsWriter(p, [("a", "F32", (2,))])

    class DiskFull:
        def __init__(self, f):
            self._f = f

        def seek(self, *a):
            return self._f.seek(*a)

        def write(self, b):
            raise OSError(28, "No space left on device")

        def close(self):
            self._f.close()

    w._file = DiskFull(w._file)
    with pytest.raises(OSError, match="No space"):
        w.write("a", np.zeros(2, np.float32))
    with pytest.raises(SafetensorsError, match="aborted"):
        w.close()
    assert _dir_listing(tmp_path) == []


def test_writer_refuses_header_over_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ist, "MAX_HEADER_SIZE", 64)
    with pytest.raises(SafetensorsError, match="above the 64-byte limit"):
        SafetensorsWriter(tmp_path / "w.safetensors", [(f"t{i}", "F32", (1,)) for i in range(5)])
    assert _dir_listing(tmp_path) == []


def test_abandoned_writer_removes_temp_file(tmp_path: Path) -> None:
    w = SafetensorsWriter(tmp_path / "w.safetensors", [("a", "F32", (1,))])
    assert len(_dir_listing(tmp_path)) == 1       # the temporary file
    del w
    assert _dir_listing(tmp_path) == []


# --- hypothesis round trip ----------------------------------------------------------------------

_HYP_DTYPES = ["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8",
               "BOOL"]
# the names the official package's TensorSpec takes
_TORCH_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64",
                "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool"}
_tensor = st.tuples(st.sampled_from(_HYP_DTYPES),
                    st.lists(st.integers(0, 5), min_size=0, max_size=4), st.integers(0, 2**32 - 1))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tensors=st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda s: s != "__metadata__"),
                               _tensor, max_size=6),
       metadata=st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3))
def test_roundtrip_random(tmp_path: Path, tensors: dict, metadata: dict | None) -> None:
    arrays, dtypes = {}, {}
    for name, (dt, shape, seed) in tensors.items():
        raw = np.random.default_rng(seed).integers(0, 256, math.prod(shape) * ist.DTYPE_SIZES[dt],
                                                   dtype=np.uint8)
        npdt = ist.NUMPY_DTYPES[dt]
        if dt == "BOOL":
            raw = raw & 1
        arrays[name] = raw.view(npdt).reshape(shape)
        dtypes[name] = dt
    path = tmp_path / "h.safetensors"
    save_file(arrays, path, metadata, dtypes=dtypes)
    official = dict(safetensors.deserialize(path.read_bytes()))
    with SafetensorsFile(path) as f:
        assert f.metadata == (metadata or {})
        assert set(f.keys()) == set(arrays) == set(official)
        for name, a in arrays.items():
            assert official[name]["dtype"] == dtypes[name]
            assert official[name]["shape"] == list(a.shape)
            assert bytes(official[name]["data"]) == a.tobytes()
            _assert_bits_equal(f.tensor(name), a)
    path.unlink()

    # and the other way: the official writer's file, read by ours
    specs = {name: safetensors.TensorSpec(dtype=_TORCH_NAMES[dtypes[name]], shape=list(a.shape),
                                          data_ptr=a.ctypes.data, data_len=a.nbytes)
             for name, a in arrays.items()}
    # `or None`: safetensors 0.8.0 writes `{},"__metadata__":{}}` (invalid JSON, its own reader
    # refuses it too) for no tensors plus an empty metadata map.
    safetensors.serialize_file(specs, str(path), metadata or None)
    with SafetensorsFile(path) as f:
        assert f.metadata == (metadata or {})
        assert set(f.keys()) == set(arrays)
        for name, a in arrays.items():
            assert f.info(name).dtype == dtypes[name]
            _assert_bits_equal(f.tensor(name), a)
    path.unlink()


# --- bfloat16 helpers ---------------------------------------------------------------------------

def test_bf16_to_f32_known_values() -> None:
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0xFF80, 0x0001, 0x8000, 0x4049], dtype=np.uint16)
    got = bf16_to_f32(bits)
    assert got.dtype == np.float32
    assert got[:6].tolist() == [1.0, -2.0, np.inf, -np.inf, 2.0**-133, -0.0]
    assert got[6] == np.float32(3.140625)
    with pytest.raises(TypeError):
        bf16_to_f32(np.zeros(2, np.float32))


def test_f32_to_bf16_rounds_to_nearest_even() -> None:
    one = 1.0
    vals = np.array([one, one + 2**-8, one + 3 * 2**-8, one + 2**-8 + 2**-20,
                     np.finfo(np.float32).max, -0.0], dtype=np.float32)
    assert f32_to_bf16(vals).tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x8000]
    assert np.isnan(bf16_to_f32(f32_to_bf16(np.array([np.nan], np.float32))))
    # every non-NaN bf16 value survives f32 and back unchanged
    allbits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    wide = bf16_to_f32(allbits)
    keep = ~np.isnan(wide)
    np.testing.assert_array_equal(f32_to_bf16(wide[keep]), allbits[keep])


# --- checkpoints: single file, shards, tiny models ----------------------------------------------

def _expected_hf_names(cfg: ModelConfig) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        names |= {p + s for s in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                  "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                  "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                  "mlp.down_proj.weight")}
        if cfg.attention_bias:
            names |= {p + f"self_attn.{x}_proj.bias" for x in "qkv"}
    if not cfg.tie_word_embeddings:
        names.add("lm_head.weight")
    return names


def _expected_shape(name: str, cfg: ModelConfig) -> tuple[int, ...]:
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (cfg.vocab_size, cfg.dim)
    leaf = name.split(".", 3)[-1]
    return {
        "input_layernorm.weight": (cfg.dim,), "post_attention_layernorm.weight": (cfg.dim,),
        "model.norm.weight": (cfg.dim,), "norm.weight": (cfg.dim,),
        "self_attn.q_proj.weight": (cfg.q_dim, cfg.dim), "self_attn.q_proj.bias": (cfg.q_dim,),
        "self_attn.k_proj.weight": (cfg.kv_dim, cfg.dim), "self_attn.k_proj.bias": (cfg.kv_dim,),
        "self_attn.v_proj.weight": (cfg.kv_dim, cfg.dim), "self_attn.v_proj.bias": (cfg.kv_dim,),
        "self_attn.o_proj.weight": (cfg.dim, cfg.q_dim),
        "mlp.gate_proj.weight": (cfg.hidden_dim, cfg.dim), "mlp.up_proj.weight": (cfg.hidden_dim, cfg.dim),
        "mlp.down_proj.weight": (cfg.dim, cfg.hidden_dim),
    }[leaf if name.startswith("model.layers.") else name]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_model_loads_with_config_shapes(arch: str, tiny_qwen2_dir: Path,
                                             tiny_llama_dir: Path) -> None:
    d = tiny_qwen2_dir if arch == "qwen2" else tiny_llama_dir
    cfg = ModelConfig.from_file(d / "config.json")
    assert cfg.arch == arch
    assert (cfg.n_layers, cfg.dim, cfg.hidden_dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == \
        (2, 64, 160, 4, 2, 16)
    assert cfg.attention_bias is (arch == "qwen2")
    assert cfg.tie_word_embeddings is (arch == "qwen2")
    official = st_np.load_file(d / "model.safetensors")
    with load_checkpoint(d) as ws:
        assert set(ws) == _expected_hf_names(cfg) == set(official)
        for name in ws:
            t = ws[name]
            assert t.shape == _expected_shape(name, cfg), name
            assert t.dtype == np.float32
            _assert_bits_equal(t, official[name])
        norms = [ws[n] for n in ws if n.endswith("norm.weight")]
        assert all(abs(float(n.mean()) - 1.0) < 0.1 for n in norms)
        assert ws.metadata == {"format": "pt"}
        assert len(ws.files) == 1


def test_tiny_model_in_half_precisions(tmp_path: Path) -> None:
    f32 = load_checkpoint(write_tiny_model(tmp_path / "f32", seed=5))
    f16 = load_checkpoint(write_tiny_model(tmp_path / "f16", seed=5, dtype="F16"))
    bf16 = load_checkpoint(write_tiny_model(tmp_path / "bf16", seed=5, dtype="BF16"))
    name = "model.layers.1.mlp.down_proj.weight"
    assert f16.info(name).dtype == "F16" and bf16.info(name).dtype == "BF16"
    np.testing.assert_array_equal(f16[name], f32[name].astype(np.float16))
    np.testing.assert_allclose(bf16_to_f32(bf16[name]), f32[name], rtol=2**-8)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_sharded_checkpoint_equals_single_file(tmp_path: Path, tiny_qwen2_dir: Path) -> None:
    d = write_tiny_model(tmp_path / "sharded", seed=0, sharded=True)
    assert not (d / "model.safetensors").exists()
    single = load_checkpoint(tiny_qwen2_dir)
    with load_checkpoint(d) as ws:
        assert len(ws.files) == 2 and set(ws) == set(single)
        for name in ws:
            _assert_bits_equal(ws[name], single[name])
            assert ws.file_of(name).path.name.startswith("model-0000")
        assert ws.get("nope") is None                # Mapping.get works: errors are KeyErrors
        with pytest.raises(TensorNotFoundError, match="close names"):
            ws["model.norm.weights"]
        assert ws.nbytes == sum(single[n].nbytes for n in single)


def _sharded_copy(tmp_path: Path) -> tuple[Path, dict]:
    d = write_tiny_model(tmp_path / "m", seed=1, sharded=True)
    return d, json.loads((d / "model.safetensors.index.json").read_text())


def _write_index(d: Path, index: dict | str) -> None:
    text = index if isinstance(index, str) else json.dumps(index)
    (d / "model.safetensors.index.json").write_text(text)


SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


def _bad_index_missing_shard(d: Path, idx: dict) -> None:
    (d / SHARD2).unlink()


def _bad_index_tensor_not_in_shard(d: Path, idx: dict) -> None:
    idx["weight_map"]["model.extra.weight"] = SHARD1
    _write_index(d, idx)


def _bad_index_wrong_shard(d: Path, idx: dict) -> None:
    idx["weight_map"]["model.norm.weight"] = SHARD1
    _write_index(d, idx)


def _bad_index_unlisted_tensor(d: Path, idx: dict) -> None:
    del idx["weight_map"]["model.norm.weight"]
    _write_index(d, idx)


def _bad_index_tensor_in_two_shards(d: Path, idx: dict) -> None:
    # rewrite shard 2 with a copy of a shard-1 tensor added
    with SafetensorsFile(d / SHARD2) as f:
        arrays = {n: np.array(f.tensor(n)) for n in f}
    with SafetensorsFile(d / SHARD1) as f:
        arrays["model.embed_tokens.weight"] = np.array(f.tensor("model.embed_tokens.weight"))
    save_file(arrays, d / SHARD2)


def _bad_index_traversal(d: Path, idx: dict) -> None:
    shutil.copy(d / SHARD2, d.parent / SHARD2)
    idx["weight_map"] = {k: ("../" + v if v == SHARD2 else v) for k, v in idx["weight_map"].items()}
    _write_index(d, idx)


def _bad_index_absolute(d: Path, idx: dict) -> None:
    idx["weight_map"] = {k: (str(d / v) if v == SHARD2 else v) for k, v in idx["weight_map"].items()}
    _write_index(d, idx)


def _bad_index_subdir(d: Path, idx: dict) -> None:
    (d / "sub").mkdir()
    shutil.copy(d / SHARD2, d / "sub" / SHARD2)
    idx["weight_map"] = {k: ("sub/" + v if v == SHARD2 else v) for k, v in idx["weight_map"].items()}
    _write_index(d, idx)


BAD_INDEXES = [
    ("missing-shard", _bad_index_missing_shard, "does not exist"),
    ("tensor-not-in-shard", _bad_index_tensor_not_in_shard, "not in their shard"),
    ("wrong-shard", _bad_index_wrong_shard, "index says the tensor is in"),
    ("unlisted-tensor", _bad_index_unlisted_tensor, "not in the index's weight_map"),
    ("tensor-in-two-shards", _bad_index_tensor_in_two_shards, "stored in two shards"),
    ("path-traversal", _bad_index_traversal, "not a plain file name"),
    ("absolute-path", _bad_index_absolute, "not a plain file name"),
    ("subdirectory", _bad_index_subdir, "not a plain file name"),
    ("not-json", lambda d, idx: _write_index(d, "{weight_map"), "not valid UTF-8 JSON"),
    ("no-weight-map", lambda d, idx: _write_index(d, {"metadata": {}}), "'weight_map'"),
    ("weight-map-list", lambda d, idx: _write_index(d, {"weight_map": [SHARD1]}), "'weight_map'"),
    ("empty-weight-map", lambda d, idx: _write_index(d, {"weight_map": {}}), "empty"),
    ("shard-not-string", lambda d, idx: _write_index(d, {"weight_map": {"a": 3}}), "file name"),
    ("duplicate-key", lambda d, idx: _write_index(
        d, '{"weight_map": {"model.norm.weight": "%s", "model.norm.weight": "%s"}}'
        % (SHARD2, SHARD2)), "twice"),
]


@pytest.mark.parametrize("case_id,breaker,words", BAD_INDEXES, ids=[c[0] for c in BAD_INDEXES])
def test_bad_shard_index_refused(tmp_path: Path, case_id: str, breaker, words: str) -> None:
    d, idx = _sharded_copy(tmp_path)
    breaker(d, idx)
    with pytest.raises(SafetensorsError, match=words) as ei:
        load_checkpoint(d)
    assert "model.safetensors.index.json" in str(ei.value)


def test_checkpoint_dir_without_weights(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="neither model.safetensors nor"):
        load_checkpoint(tmp_path)
    with pytest.raises(ModelNotFoundError, match="not found"):
        load_checkpoint(tmp_path / "missing")


def test_single_file_wins_over_index(tmp_path: Path) -> None:
    d = write_tiny_model(tmp_path / "m", seed=2, sharded=True)
    save_file({"only": np.zeros(1, np.float32)}, d / "model.safetensors")
    with load_checkpoint(d) as ws:
        assert list(ws) == ["only"]


def test_checkpoint_accepts_a_file_path(tiny_llama_dir: Path) -> None:
    with load_checkpoint(tiny_llama_dir / "model.safetensors") as ws:
        assert "lm_head.weight" in ws and "model.layers.0.self_attn.q_proj.bias" not in ws
