"""The native library's JSON (csrc/native/json.c), through ctypes on a shared library compiled here,
against Python's json module as `ignis serve` uses it: the same documents accepted with equal
values, the same refused with the same message and position (json.h lists the documented
differences: UTF-8 only, NaN/Infinity refused, Python 3.13's trailing-comma wording), the same
bytes written as json.dumps(..., ensure_ascii=False), floats as repr(), limits as typed errors; and
a C fuzz driver (tests/c/json_fuzz.c) under AddressSanitizer and UBSan."""
from __future__ import annotations

import base64
import ctypes
import json
import math
import random
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from tools_required import missing_tool, require_tool

from ignis.generate.errors import InvalidParameterError
from ignis.generate.params import MAX_NESTING, check_request_value

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "csrc" / "native"
FLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off"]

OK, E_SYNTAX, E_UTF8, E_CONSTANT, E_NUMBER, E_DEPTH, E_SIZE, E_ELEMENTS, E_MEMORY, E_TYPE, \
    E_MISSING = range(11)


def build_native(tmp_dir: Path, sources: list[str], name: str) -> ctypes.CDLL:
    """A shared library of csrc/native/`sources`, compiled with the system's cc (the tests of the
    other native files use it too)."""
    cc = require_tool("cc", "install a C compiler, e.g. apt-get install gcc",
                      f"the native library's {name}")
    out = tmp_dir / f"lib{name}.so"
    cmd = [cc, *FLAGS, "-fPIC", "-shared", *[str(NATIVE / s) for s in sources], "-o", str(out),
           "-lm", "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stderr}"
    return ctypes.CDLL(str(out))


class Error(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int), ("offset", ctypes.c_size_t), ("pos", ctypes.c_size_t),
                ("line", ctypes.c_size_t), ("column", ctypes.c_size_t),
                ("message", ctypes.c_char * 256), ("path", ctypes.c_char * 128)]


class Limits(ctypes.Structure):
    _fields_ = [("max_depth", ctypes.c_int), ("max_bytes", ctypes.c_size_t),
                ("max_elements", ctypes.c_size_t)]


class Native:
    """ctypes over json.h: parse, then write the document back with the writer."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.ig_json_parse.restype = ctypes.c_void_p
        lib.ig_json_parse.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(Limits),
                                      ctypes.POINTER(Error)]
        lib.ig_json_root.restype = ctypes.c_void_p
        lib.ig_json_root.argtypes = [ctypes.c_void_p]
        lib.ig_json_free.argtypes = [ctypes.c_void_p]
        lib.ig_jw_take.restype = ctypes.c_void_p
        for f in ("ig_jw_init",):
            getattr(lib, f).argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.ig_jw_value.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.ig_jw_take.argtypes = [ctypes.c_void_p]
        lib.ig_jw_free.argtypes = [ctypes.c_void_p]
        lib.ig_json_format_double.argtypes = [ctypes.c_char_p, ctypes.c_double]
        lib.ig_json_get.restype = ctypes.c_void_p
        lib.ig_json_get.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.ig_json_at.restype = ctypes.c_void_p
        lib.ig_json_at.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.ig_json_len.restype = ctypes.c_size_t
        lib.ig_json_len.argtypes = [ctypes.c_void_p]
        self.libc = ctypes.CDLL(None)
        self.libc.free.argtypes = [ctypes.c_void_p]

    def writer(self, style: int = 0) -> ctypes.Array:
        w = ctypes.create_string_buffer(1024)          # > sizeof(ig_jw)
        self.lib.ig_jw_init(w, style)
        return w

    def take(self, w) -> bytes | None:
        p = self.lib.ig_jw_take(w)
        if not p:
            return None
        out = ctypes.string_at(p)
        self.libc.free(p)
        return out

    def parse(self, text: bytes, limits: Limits | None = None, style: int = 0):
        """(None, written bytes) or (Error, None)."""
        err = Error()
        doc = self.lib.ig_json_parse(text, len(text), ctypes.byref(limits) if limits else None,
                                     ctypes.byref(err))
        if not doc:
            assert err.status != OK
            return err, None
        try:
            w = self.writer(style)
            self.lib.ig_jw_value(w, self.lib.ig_json_root(doc))
            out = self.take(w)
            assert out is not None
            return None, out
        finally:
            self.lib.ig_json_free(doc)

    def repr(self, v: float) -> str:
        b = ctypes.create_string_buffer(48)
        n = self.lib.ig_json_format_double(b, v)
        return b.raw[:n].decode()


@pytest.fixture(scope="module")
def nj(tmp_path_factory) -> Native:
    return Native(build_native(tmp_path_factory.mktemp("native_json"), ["json.c"], "json"))


def python_loads(text: bytes):
    """(True, value) or (False, message) as the server reads a body."""
    def no_constants(name):
        raise ValueError(f"{name} is not valid JSON")
    try:
        return True, json.loads(text, parse_constant=no_constants)
    except RecursionError:
        return False, "too deep for Python"
    except ValueError as e:
        return False, str(e)


def has_surrogate(v) -> bool:
    if isinstance(v, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in v)
    if isinstance(v, list):
        return any(has_surrogate(x) for x in v)
    if isinstance(v, dict):
        return any(has_surrogate(k) or has_surrogate(x) for k, x in v.items())
    return False


def dumps(v, style: int = 0) -> bytes:
    seps = (", ", ": ") if style else (",", ":")
    return json.dumps(v, ensure_ascii=False, separators=seps).encode("utf-8", "surrogatepass")


DEEP = Limits(max_depth=400)


def check_like_python(nj: Native, text: bytes, style: int = 0) -> None:
    """The native parser agrees with json.loads on `text` (json.h's documented exceptions aside)."""
    if json.detect_encoding(text) not in ("utf-8", "utf-8-sig"):
        return                     # Python would read it as UTF-16/32: documented difference
    ok, value = python_loads(text)
    err, out = nj.parse(text, DEEP, style)
    if ok:
        assert err is None, f"{text!r}: Python reads it, native says {err.message.decode()!r}"
        if has_surrogate(value):
            # a lone surrogate is written as its \udXXX escape, as ensure_ascii=True writes it
            # (adjacent high + low surrogates then read back as one character, in Python too)
            assert json.loads(out) == json.loads(json.dumps(value)), text
        else:
            assert out == dumps(value, style), text
        return
    assert err is not None, f"{text!r}: Python refuses it ({value}), native read {out!r}"
    msg = err.message.decode("utf-8", "replace")
    if value.startswith("Illegal trailing comma") or value == "too deep for Python":
        return                     # Python 3.13's wording of the same refusal; its own recursion cap
    if text.startswith(b"\xef\xbb\xbf") and err.status == E_UTF8:
        return                     # Python's utf-8-sig positions skip the BOM: not matched
    if err.status == E_NUMBER:     # without Python's advice to call sys.set_int_max_str_digits()
        assert value.startswith(msg + "; use sys.set_int_max_str_digits()"), text
        return
    assert msg == value, f"{text!r}"


VALID = [b'{}', b'[]', b'0', b'-0', b'-0.0', b'1.5e3', b'1E-7', b'1e+2', b'123456789012345678901234567890',
         b'18446744073709551615', b'-9223372036854775808', b'1e400', b'-1e400', b'5e-324', b'1e-400',
         b'"\\u00e9\\ud83d\\ude00"', b'"\\ud800"', b'"\\udc00\\ud800"', b'"\\ud800\\u0041"',
         b'"\xed\xa0\x80"', b'"\xf0\x9f\x98\x80 \xc3\xa9"', b'"\\/\\b\\f\\n\\r\\t\\"\\\\"',
         b' \t\r\n[1 , 2\n]\t', b'{"a":1,"b":2,"a":3}', b'{"":{"":[]}}', b'"\x7f"',
         b'\xef\xbb\xbf{"bom": true}', b'[null,true,false]', b'"\\u0000"', b'{"a":{"a":1},"a":2}',
         b'[0.1, 0.2, 0.30000000000000004, 1e16, 1e15, 0.0001, 0.00001, 123.456e-300]',
         ('{' + ','.join(f'"k{i % 7}":{i}' for i in range(40)) + '}').encode()]

INVALID = [b'', b' ', b'[', b'{', b']', b'[1,]', b'{"a":1,}', b'{"a" 1}', b'{"a":}', b'[1 2]',
           b'"abc', b'"a\\x"', b'"\\u12g4"', b'"\\ud800\\u12"', b'"a\x01"', b'1.', b'01', b'-',
           b'nul', b'NaN', b'-Infinity', b'Infinity', b'[NaN]', b'1 2', b'{"a":1 "b":2}', b'{1:2}',
           b'["a",', b'[1,', b'"\\', b'"\\u12', b'[\n1,\n  x]', b'1e', b'-01', b'"\xc3\xa9\x02"',
           b'[-]', b"{'a':1}", b'/* c */1', b'[1]//', b'tru', b'True', b'.5', b'+1', b'0x10',
           b'"\\u123"', b'"\\ud800\\', b'\xff', b'"\xe4\xb8"', b'\xe4A', b'\xf0\x90A', b'\xc0\x80',
           b'"\xe0\x80"', b'"a\xf4\x90\x80\x80"', b'"ab\xe4\xb8', b'"\xed\xa0"', b'[1]\x00',
           b'\xef\xbb\xbf\xef\xbb\xbf1', b'{"a":1}}', b'[[]]]', b'{"a"', b'{"a":', b'"\t"',
           b'1' * 4301, b'-' + b'1' * 4301]


@pytest.mark.parametrize("text", VALID + INVALID, ids=lambda t: repr(t[:30]))
def test_corpus_like_python(nj, text):
    check_like_python(nj, text)


def test_spaced_separators_like_json_dumps(nj):
    for text in VALID:
        check_like_python(nj, text, style=1)


def test_big_int_limit_like_python(nj):
    """Python refuses integers of more than 4300 digits; a float of any length is a float."""
    err, _ = nj.parse(b'1' * 4301)
    assert err.status == E_NUMBER and "4300 digits" in err.message.decode()
    assert nj.parse(b'1' * 4300)[0] is None
    assert nj.parse(b'1' * 5000 + b'.5')[0] is None


def test_typed_errors(nj):
    """NaN/Infinity, bad UTF-8 and syntax are told apart, with the byte offset."""
    err, _ = nj.parse(b'{"temperature": NaN}')
    assert (err.status, err.offset, err.message) == (E_CONSTANT, 16, b"NaN is not valid JSON")
    err, _ = nj.parse(b'{"a": "\xff"}')
    assert (err.status, err.offset) == (E_UTF8, 7)
    err, _ = nj.parse('{"é": [1,, 2]}'.encode())
    # byte 10, character 9: positions in characters, as Python counts them
    assert (err.status, err.offset, err.pos, err.line, err.column) == (E_SYNTAX, 10, 9, 1, 10)


def python_depth_param(value) -> str:
    with pytest.raises(InvalidParameterError) as e:
        check_request_value(value, None, texts=False)
    return e.value.param


@pytest.mark.parametrize("shape", ["list", "dict", "mixed"])
def test_depth_limit_names_the_place_like_the_server(nj, shape):
    """One level more than MAX_NESTING is a depth error naming the place as the server's check
    does; MAX_NESTING levels are fine."""
    def nest(levels: int):
        v: object = 1
        for i in range(levels - 1):
            if shape == "list" or (shape == "mixed" and i % 2):
                v = [0, v] if i % 3 == 0 else [v]
            else:
                v = {"k" + str(i): v} if i % 5 else {"": v}
        return {"messages": v}
    assert nj.parse(json.dumps(nest(MAX_NESTING)).encode())[0] is None
    deep = nest(MAX_NESTING + 1)
    err, _ = nj.parse(json.dumps(deep).encode())
    assert err.status == E_DEPTH
    assert err.path.decode() == python_depth_param(deep)[:127]


def test_hostile_depth_is_an_error_not_a_crash(nj):
    for text in (b'[' * 1_000_000, b'{"a":' * 300_000, b'[' * 100_000 + b']' * 100_000):
        err, _ = nj.parse(text, Limits(max_bytes=1 << 24))
        assert err.status == E_DEPTH and err.message.decode().startswith("the JSON text nests")
    err, _ = nj.parse(b'[' * 200 + b']' * 200, Limits(max_depth=200))
    assert err is None


def test_size_and_element_limits(nj):
    err, _ = nj.parse(b'[1,2,3]', Limits(max_bytes=6))
    assert err.status == E_SIZE and "larger than 6 bytes" in err.message.decode()
    assert nj.parse(b'[1,2,3]', Limits(max_bytes=7))[0] is None
    err, _ = nj.parse(b'[1,2,3]', Limits(max_elements=3))       # the list and three numbers
    assert err.status == E_ELEMENTS
    assert nj.parse(b'[1,2,3]', Limits(max_elements=4))[0] is None
    err, _ = nj.parse(b'x' * (5 << 20))                            # the default: the server's 4 MiB
    assert err.status == E_SIZE


def test_lookup_and_typed_getters(nj):
    lib = nj.lib
    text = (b'{"seed": 18446744073709551615, "neg": -5, "t": 0.5, "b": true, "s": "h\\u00e9",'
            b' "big": 123456789012345678901234567890, "l": [1, "x"], "seed": 7}')
    err = Error()
    doc = lib.ig_json_parse(text, len(text), None, ctypes.byref(err))
    assert doc, err.message
    try:
        root = lib.ig_json_root(doc)
        get = lambda k: lib.ig_json_get(root, k)                       # noqa: E731
        assert lib.ig_json_len(root) == 7                               # "seed" once: the last wins
        u = ctypes.c_uint64()
        i = ctypes.c_int64()
        d = ctypes.c_double()
        b = ctypes.c_int()
        s = ctypes.c_char_p()
        n = ctypes.c_size_t()
        e = ctypes.byref(err)
        assert lib.ig_json_get_u64(ctypes.c_void_p(get(b"seed")), b"seed", ctypes.byref(u), e) == 0
        assert u.value == 7
        assert lib.ig_json_get_u64(ctypes.c_void_p(get(b"neg")), b"seed", ctypes.byref(u), e) == 0
        assert u.value == (-5) % 2**64                                   # sampler.py's seed % 2**64
        assert lib.ig_json_get_int(ctypes.c_void_p(get(b"neg")), b"n", ctypes.byref(i), e) == 0
        assert i.value == -5
        assert lib.ig_json_get_number(ctypes.c_void_p(get(b"t")), b"t", ctypes.byref(d), e) == 0
        assert d.value == 0.5
        assert lib.ig_json_get_string(ctypes.c_void_p(get(b"s")), b"s", ctypes.byref(s),
                                      ctypes.byref(n), e) == 0
        assert s.value.decode() == "hé" and n.value == 3
        assert lib.ig_json_get_bool(ctypes.c_void_p(get(b"b")), b"b", ctypes.byref(b), e) == 0
        assert b.value == 1
        # a boolean is not a number, a float not an integer, a big int not 64 bits
        assert lib.ig_json_get_number(ctypes.c_void_p(get(b"b")), b"temperature",
                                      ctypes.byref(d), e) == -1
        assert err.status == E_TYPE and err.message == b"temperature must be a number, got bool"
        assert lib.ig_json_get_int(ctypes.c_void_p(get(b"t")), b"max_tokens", ctypes.byref(i), e) == -1
        assert err.message == b"max_tokens must be an integer, got float"
        assert lib.ig_json_get_int(ctypes.c_void_p(get(b"big")), b"n", ctypes.byref(i), e) == -1
        assert err.status == E_TYPE and b"64 bits" in err.message
        assert lib.ig_json_get_string(None, b"model", ctypes.byref(s), None, e) == -1
        assert err.status == E_MISSING and err.message == b"model is missing"
        lst = get(b"l")
        assert lib.ig_json_len(lst) == 2 and lib.ig_json_at(lst, 2) is None
        assert lib.ig_json_get_string(ctypes.c_void_p(lib.ig_json_at(lst, 1)), b"x",
                                      ctypes.byref(s), None, e) == 0 and s.value == b"x"
        assert get(b"absent") is None
    finally:
        lib.ig_json_free(doc)


def test_writer_builds_what_json_dumps_writes(nj):
    lib = nj.lib
    text = "a\"b\\c\n\r\t\b\f\x00\x1f\x7f é 😀 \u2028"
    for style in (0, 1):
        w = nj.writer(style)
        lib.ig_jw_begin_object(w)
        k = "key\n".encode()
        lib.ig_jw_key(w, k, len(k))
        lib.ig_jw_begin_array(w)
        raw = text.encode()
        lib.ig_jw_string(w, raw, len(raw))
        lib.ig_jw_int.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        lib.ig_jw_uint.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        lib.ig_jw_double.argtypes = [ctypes.c_void_p, ctypes.c_double]
        lib.ig_jw_int(w, -2**63)
        lib.ig_jw_uint(w, 2**64 - 1)
        lib.ig_jw_double(w, 0.1)
        lib.ig_jw_double(w, float("-inf"))
        lib.ig_jw_bool(w, 1)
        lib.ig_jw_null(w)
        lib.ig_jw_begin_object(w)
        lib.ig_jw_end_object(w)
        lib.ig_jw_end_array(w)
        lib.ig_jw_key(w, b"", 0)
        lib.ig_jw_raw(w, b"[1]", 3)
        lib.ig_jw_end_object(w)
        want = {"key\n": [text, -2**63, 2**64 - 1, 0.1, float("-inf"), True, None, {}], "": [1]}
        assert nj.take(w) == dumps(want, style)


def test_writer_refuses_misuse(nj):
    lib = nj.lib
    w = nj.writer()
    lib.ig_jw_key(w, b"k", 1)                    # a key outside an object
    assert nj.take(w) is None
    w = nj.writer()
    lib.ig_jw_begin_array(w)                     # never closed
    assert nj.take(w) is None
    w = nj.writer()
    lib.ig_jw_null(w)
    lib.ig_jw_null(w)                            # two values in one text
    assert nj.take(w) is None
    w = nj.writer()
    lib.ig_jw_begin_object(w)
    lib.ig_jw_key(w, b"k", 1)
    lib.ig_jw_end_object(w)                      # a key without its value
    assert nj.take(w) is None
    w = nj.writer()
    lib.ig_jw_begin_array(w)
    lib.ig_jw_key(w, b"k", 1)                    # a key in an array
    assert nj.take(w) is None
    w = nj.writer()
    lib.ig_jw_begin_object(w)
    lib.ig_jw_null(w)                            # a value without a key
    lib.ig_jw_end_object(w)
    assert nj.take(w) is None
    w = nj.writer()
    lib.ig_jw_begin_object(w)
    lib.ig_jw_end_array(w)                       # the wrong bracket
    assert nj.take(w) is None


def test_writer_invalid_utf8_and_surrogates(nj):
    """A lone surrogate's WTF-8 bytes become the escape json.loads reads back as the same str;
    other invalid bytes become U+FFFD."""
    w = nj.writer()
    raw = b"a\xed\xa0\x80b\xffc\xe4\xb8"
    nj.lib.ig_jw_string(w, raw, len(raw))
    out = nj.take(w)
    assert out == b'"a\\ud800b\xef\xbf\xbdc\xef\xbf\xbd\xef\xbf\xbd"'
    assert json.loads(out) == "a\ud800b\ufffdc\ufffd\ufffd"


def test_base64_embeddings_like_the_client(nj):
    """encoding_format="base64": the base64 of the little-endian float32 bytes (client.py)."""
    rng = np.random.default_rng(3)
    for n in (0, 1, 2, 3, 7, 896):
        v = rng.standard_normal(n).astype(np.float32)
        w = nj.writer()
        nj.lib.ig_jw_base64_f32(w, v.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(n))
        want = base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
        assert nj.take(w) == json.dumps(want).encode()


def test_floats_are_written_as_python_repr(nj):
    """Shortest round-trip digits in repr's layout, for special values and random bit patterns."""
    special = [0.0, -0.0, 0.1, 1 / 3, 1e16, 1e15, 9999999999999998.0, 1e-4, 1e-5, 5e-324,
               2.2250738585072014e-308, 1.7976931348623157e308, 123456789.0, 1e22, 1e23, 0.5,
               -2.5e-10, 100.0, 1.0, float(2**53), float(np.float32(0.1)), float("inf"),
               float("-inf"),
               # 16 digits one unit from the correctly rounded ones (that does not read back)
               2.0 ** -24, -(2.0 ** -24)]
    rng = random.Random(7)
    bits = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(20000)]
    scaled = [rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30) for _ in range(20000)]
    f32 = [float(x) for x in np.random.default_rng(1).standard_normal(5000).astype(np.float32)]
    f32 += [float(np.float32(2.0) ** e) for e in range(-149, 128)]   # every float32 power of two
    for v in special + bits + scaled + f32:
        if math.isnan(v):
            continue
        assert nj.repr(v) == json.dumps(v), v


def build_fuzz_driver(tmp_path: Path, sanitize: bool) -> Path:
    cc = require_tool("cc", "install a C compiler, e.g. apt-get install gcc", "the JSON fuzz driver")
    exe = tmp_path / "json_fuzz"
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
    cmd = [cc, *FLAGS, "-g", *(san if sanitize else []), "-I", str(NATIVE),
           str(ROOT / "tests" / "c" / "json_fuzz.c"), str(NATIVE / "json.c"), "-o", str(exe),
           "-lm", "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    said = done.stderr.lower()
    if sanitize and done.returncode != 0 and ("asan" in said or "sanitize" in said):
        missing_tool(f"the compiler cannot build with -fsanitize=address,undefined "
                     f"({done.stderr.strip()[-200:]}): the sanitized JSON fuzz run is not checked")
    assert done.returncode == 0, done.stderr
    return exe


def test_numbers_under_a_decimal_comma_locale(tmp_path):
    """A host program whose locale writes decimal commas (de_DE) still gets "0.25" written and
    "2.5e1" read: the library formats and parses numbers in the C locale. The locale is the
    system's, else compiled here with localedef into a private LOCPATH."""
    exe = build_fuzz_driver(tmp_path, sanitize=False)
    run = subprocess.run([str(exe), "locale", "de_DE.UTF-8"], capture_output=True, text=True)
    if run.returncode == 2:
        localedef = require_tool("localedef", "glibc's locales package", "numbers under a locale "
                                 "with a decimal comma")
        made = subprocess.run([localedef, "-i", "de_DE", "-f", "UTF-8", str(tmp_path / "de_DE.UTF-8")],
                              capture_output=True, text=True)
        if not (tmp_path / "de_DE.UTF-8").exists():
            missing_tool(f"localedef could not build de_DE.UTF-8 ({made.stderr.strip()[-200:]}): "
                         f"numbers under a locale with a decimal comma are not checked")
        run = subprocess.run([str(exe), "locale", "de_DE.UTF-8"], capture_output=True, text=True,
                             env={"LOCPATH": str(tmp_path)})
    assert run.returncode == 0, run.stdout + run.stderr


# ---- generated documents ----

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
texts = st.text() | st.text(alphabet=st.characters(max_codepoint=0x20)) | \
    st.lists(st.one_of(st.characters(), surrogates)).map("".join)
scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-2**70, max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | texts)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(texts, inner, max_size=5), max_leaves=30)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=values, indent=st.sampled_from([None, 0, 2, "\t"]), ascii_=st.booleans(),
       style=st.sampled_from([0, 1]))
def test_generated_documents_like_python(nj, value, indent, ascii_, style):
    text = json.dumps(value, ensure_ascii=ascii_, indent=indent).encode("utf-8", "surrogatepass")
    check_like_python(nj, text, style)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=64))
def test_arbitrary_bytes_like_python(nj, data):
    check_like_python(nj, data)


def mutations(seed: int, count: int):
    rng = random.Random(seed)
    pool = VALID + [json.dumps(v).encode() for v in (
        {"model": "m", "messages": [{"role": "user", "content": "hé\n"}], "seed": 2**63,
         "temperature": 0.7, "logit_bias": {"12": -100}, "stop": ["\\u0000", "x"]},
        [1.5, -0.0, {"a": [True, False, None]}, "\ud83d\ude00"])]
    alphabet = b'{}[]":,.-+eE0123456789 \\\n\tuntrfalse\xc3\xa9\xed\xa0\x80\xff'
    for _ in range(count):
        b = bytearray(rng.choice(pool))
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(4)
            at = rng.randint(0, len(b))
            if op == 0 and b:
                del b[min(at, len(b) - 1)]
            elif op == 1:
                b.insert(at, rng.choice(alphabet))
            elif op == 2 and b:
                b[min(at, len(b) - 1)] = rng.choice(alphabet)
            else:
                b = b[:at]
        yield bytes(b)


def test_mutated_and_truncated_documents_like_python(nj):
    for text in mutations(11, 3000):
        check_like_python(nj, text)


# ---- the fuzz driver under sanitizers ----

def test_fuzz_driver_under_sanitizers(tmp_path):
    """tests/c/json_fuzz.c: parse, write and re-read a bounded random corpus (valid, mutated,
    truncated, deep) with random limits, under ASan + UBSan (errors abort) and LeakSanitizer."""
    exe = build_fuzz_driver(tmp_path, sanitize=True)
    run = subprocess.run([str(exe), "20000", "5"], capture_output=True, text=True, timeout=600,
                         env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
                              "UBSAN_OPTIONS": "print_stacktrace=1"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "documents: 20000" in run.stdout, run.stdout
