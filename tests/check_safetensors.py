#!/usr/bin/env python3
"""An independent safetensors reader (stdlib only) for agentkv agent files.

usage: check_safetensors.py FILE
Parses the header, checks every tensor's dtype, shape and byte range against
the safetensors rules (contiguous, non-overlapping, covering the data section,
size = product(shape) * dtype size), checks the agentkv metadata keys, and
prints one line per tensor. Exits 1 with a message on any violation.
"""
import json
import struct
import sys

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
              "I8": 1, "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1}
REQUIRED_META = ["format", "format_version", "agent_id", "model_fingerprint", "n_layer", "n_head_kv",
                 "head_dim_k", "head_dim_v", "kv_format_k", "kv_format_v", "block_tokens", "n_tokens",
                 "tokens", "checksums"]


def fail(msg):
    print("check_safetensors: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) != 2:
        fail("usage: check_safetensors.py FILE")
    data = open(sys.argv[1], "rb").read()
    if len(data) < 8:
        fail("file shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        fail("header length %d runs past the end of the file" % n)
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        fail("__metadata__ missing or not a map of strings")
    for k in REQUIRED_META:
        if k not in meta:
            fail("metadata key %s missing" % k)
    body = len(data) - 8 - n
    spans = []
    for name, t in header.items():
        dt, shape, offs = t["dtype"], t["shape"], t["data_offsets"]
        if dt not in DTYPE_SIZE:
            fail("%s: unknown dtype %s" % (name, dt))
        count = 1
        for s in shape:
            count *= s
        if offs[1] - offs[0] != count * DTYPE_SIZE[dt]:
            fail("%s: %d bytes for shape %s of %s" % (name, offs[1] - offs[0], shape, dt))
        if not 0 <= offs[0] <= offs[1] <= body:
            fail("%s: offsets %s outside the data section of %d bytes" % (name, offs, body))
        spans.append((offs[0], offs[1], name))
        print("%-24s %-5s %s" % (name, dt, shape))
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            fail("%s starts at %d, expected %d (gap or overlap)" % (name, b, pos))
        pos = e
    if pos != body:
        fail("tensors cover %d of %d data bytes" % (pos, body))
    n_tokens = int(meta["n_tokens"])
    toks = meta["tokens"].split(",") if meta["tokens"] else []
    if len(toks) != n_tokens:
        fail("%d token ids for n_tokens %d" % (len(toks), n_tokens))
    sums = json.loads(meta["checksums"])
    if set(sums) != set(header):
        fail("checksums do not name exactly the tensors")
    print("ok: %d tensors, %d tokens, K %s / V %s" % (len(header), n_tokens, meta["kv_format_k"],
                                                      meta["kv_format_v"]))


main()
