"""The GGUF reader (llama_np.io.gguf._reader): the `gguf` package's GGUFReader with its
metadata arrays parsed a slice a part. Its fields must be the package's own, part for part,
on every value type the format has (the real vocabularies: test_smollm2.py)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from llama_np.errors import LlamaNpError
from llama_np.io.gguf import _open, _reader

NUMBERS = {
    GGUFValueType.UINT8: [0, 7, 255],
    GGUFValueType.INT8: [-128, 5, 127],
    GGUFValueType.UINT16: [1, 65535],
    GGUFValueType.INT16: [-32768, 3],
    GGUFValueType.UINT32: [2**32 - 1, 9, 10, 11],
    GGUFValueType.INT32: [-1, 2**31 - 1],
    GGUFValueType.FLOAT32: [0.5, -3.25, 1e-30],
    GGUFValueType.UINT64: [2**64 - 1],
    GGUFValueType.INT64: [-(2**63), 4],
    GGUFValueType.FLOAT64: [1.0 / 3.0, -0.0],
    GGUFValueType.BOOL: [True, False, True],
}


def assert_same_fields(ours, theirs) -> None:
    """Every field and tensor as GGUFReader parses it: names, offsets, indices, types, and
    each part's dtype, shape and values."""
    assert list(ours.fields) == list(theirs.fields)
    for name, a in ours.fields.items():
        b = theirs.fields[name]
        assert (a.offset, a.name, a.data, a.types) == (b.offset, b.name, b.data, b.types), name
        assert len(a.parts) == len(b.parts), name
        for x, y in zip(a.parts, b.parts, strict=True):
            assert (x.dtype, x.shape) == (y.dtype, y.shape) and np.array_equal(x, y), name
        assert a.contents() == b.contents(), name
    assert [(t.name, t.data_offset, t.n_bytes) for t in ours.tensors] == [
        (t.name, t.data_offset, t.n_bytes) for t in theirs.tensors
    ]


def write_every_kind(path) -> None:
    w = GGUFWriter(path, "llama")
    for kind, values in NUMBERS.items():
        w.add_key_value(f"numbers.{kind.name}", values, GGUFValueType.ARRAY, kind)
        w.add_key_value(f"scalar.{kind.name}", values[0], kind)
    w.add_array("strings", ["", "a", "Ünïcödé 日本語 🦙", "x" * 1000, "<|im_end|>"])
    w.add_array("nested", [[1, 2], [3]])  # the package's parse (the writer has no empty array)
    w.add_string("one string", "hello")
    w.add_tensor("t", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_every_value_type_parses_as_the_gguf_package_does(tmp_path):
    path = tmp_path / "kinds.gguf"
    write_every_kind(path)
    assert_same_fields(_reader(path), GGUFReader(path))


def test_a_file_cut_inside_an_array_is_one_line(tmp_path):
    """Cut within the strings' array, or within the numbers', the file is refused as not
    valid GGUF (LlamaNpError, one line), never a hang or a traceback."""
    path = tmp_path / "kinds.gguf"
    write_every_kind(path)
    whole = path.read_bytes()
    for marker in (b"x" * 1000, b"numbers.FLOAT64"):
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(whole[: whole.index(marker) + 20])
        with pytest.raises(LlamaNpError, match="not a valid GGUF file"):
            _open(cut)
