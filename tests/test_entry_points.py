"""The C entry points' ctypes signatures are read from ``kernels/cpu/torch_entry.h``
(``entry_points.py``): every declaration parsed with its parameters in order, pointer and scalar
types mapped, a type ctypes is not given here refused naming the entry point and parameter, and
the kernel library typed from them."""

from __future__ import annotations

import ctypes

import pytest

from ssmcc.kernels.cpu import entry_points, native


def test_every_declared_entry_point_is_typed_from_the_header():
    found = entry_points.signatures()
    declared = entry_points.HEADER.read_text().count("SSMCC_EXPORT int ")
    assert len(found) == declared and set(native._SIGNATURES) == set(found)
    names = [name for name, _ in found["ssmcc_rmsnorm_gated_f32"]]
    assert names == ["x", "z", "weight", "out", "rows", "dim", "group_size", "eps",
                     "norm_before_gate", "threads"]
    kinds = [kind for _, kind in found["ssmcc_rmsnorm_gated_f32"]]
    P, I64, I32, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float
    assert kinds == [P] * 4 + [I64] * 3 + [F32, I32, I32]
    assert native.KINDS["ssmcc_rmsnorm_gated_f32"] == "ppppiiifii"


def test_a_header_is_parsed_across_lines_and_comments():
    text = """
    // not this: SSMCC_EXPORT int ssmcc_commented(float x);
    SSMCC_EXPORT const char* ssmcc_last_error();
    SSMCC_EXPORT int ssmcc_two(const float* a,   // the input
                               int64_t n,
                               const void* w, int32_t storage, float eps);
    """
    parsed = entry_points.parse(text)
    assert list(parsed) == ["ssmcc_two"]
    assert parsed["ssmcc_two"] == [
        ("a", ctypes.c_void_p), ("n", ctypes.c_int64), ("w", ctypes.c_void_p),
        ("storage", ctypes.c_int32), ("eps", ctypes.c_float),
    ]


def test_a_type_without_a_ctypes_mapping_is_refused_naming_it():
    with pytest.raises(ImportError, match=r"ssmcc_bad's parameter 'scale' has type 'double'"):
        entry_points.parse("SSMCC_EXPORT int ssmcc_bad(const float* x, double scale);")
