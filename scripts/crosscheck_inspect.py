#!/usr/bin/env python3
"""Cross-check `onebit inspect --json` against the `gguf` Python package (pip install gguf).

For each GGUF file given: the same metadata keys, value types and values (floats compared as
f32), and the same tensor names, types, shapes (ne0 first), byte sizes and offsets.
Usage: crosscheck_inspect.py ONEBIT_BINARY FILE.gguf...
"""
import json, subprocess, sys
import numpy as np
import gguf

SCALAR = {gguf.GGUFValueType.UINT8: "u8", gguf.GGUFValueType.INT8: "i8", gguf.GGUFValueType.UINT16: "u16",
          gguf.GGUFValueType.INT16: "i16", gguf.GGUFValueType.UINT32: "u32", gguf.GGUFValueType.INT32: "i32",
          gguf.GGUFValueType.FLOAT32: "f32", gguf.GGUFValueType.BOOL: "bool", gguf.GGUFValueType.STRING: "string",
          gguf.GGUFValueType.UINT64: "u64", gguf.GGUFValueType.INT64: "i64", gguf.GGUFValueType.FLOAT64: "f64"}


def teach_q2_0():
    """gguf-py releases before Q2_0 (type 42: 64 weights in 18 bytes) refuse files that hold it.
    Register the type so that the reader can size those tensors; the check stays the same."""
    qt = gguf.GGMLQuantizationType
    if 42 in qt._value2member_map_:
        return
    m = int.__new__(qt, 42)
    m._name_, m._value_ = "Q2_0", 42
    qt._value2member_map_[42] = m
    gguf.GGML_QUANT_SIZES[m] = (64, 18)
    gguf.constants.GGML_QUANT_SIZES[m] = (64, 18)


teach_q2_0()


def py_type(field):
    t = [SCALAR.get(x, "array") for x in field.types]
    return "".join("array<" if x == "array" else x for x in t) + ">" * t.count("array")


def same(a, b, ty):
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y, ty) for x, y in zip(a, b))
    if "f32" in ty:
        return np.float32(a) == np.float32(b) or (a != a and b is None)
    return a == b


def check(binary, path):
    ours = json.loads(subprocess.run([binary, "inspect", "--json", path], check=True, capture_output=True).stdout)
    r = gguf.GGUFReader(path)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    md = {m["key"]: m for m in ours["metadata"]}
    assert list(md) == list(fields), f"{path}: keys differ"
    for k, f in fields.items():
        ty = py_type(f)
        assert md[k]["type"] == ty or (ty.startswith("array") and md[k]["value"] == []), f"{path}: {k} type {md[k]['type']} vs {ty}"
        assert same(md[k]["value"], f.contents(), ty), f"{path}: {k} value differs"
    assert len(ours["tensors"]) == len(r.tensors), f"{path}: tensor count"
    for t, p in zip(ours["tensors"], r.tensors):
        assert t["name"] == p.name, (t["name"], p.name)
        assert t["type"].lower() == p.tensor_type.name.lower(), (t["name"], t["type"], p.tensor_type.name)
        assert t["shape"] == [int(x) for x in p.shape], (t["name"], t["shape"], list(p.shape))
        assert t["bytes"] == int(p.n_bytes), (t["name"], t["bytes"], p.n_bytes)
        assert ours["file_bytes"] >= p.data_offset + p.n_bytes
    return len(fields), len(r.tensors)


if __name__ == "__main__":
    binary = sys.argv[1]
    for path in sys.argv[2:]:
        n_kv, n_t = check(binary, path)
        print(f"ok  {path}: {n_kv} metadata values, {n_t} tensors agree with gguf-py {gguf.__version__ if hasattr(gguf, '__version__') else ''}")
