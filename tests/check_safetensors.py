#!/usr/bin/env python3
"""An independent safetensors reader (stdlib only) for agentkv agent files.

usage: check_safetensors.py FILE...
Parses the header, checks every tensor's dtype, shape and byte range against
the safetensors rules (contiguous, non-overlapping, covering the data section,
size = product(shape) * dtype size), checks the agentkv metadata keys and that
the tensors are the per-layer K and V tensors the metadata implies
([n_blocks, n_head_kv, block_tokens, ...] each, n_blocks = ceil((n_tokens -
base_len) / block_tokens), or with "segments" (version 5) the sum over the
file's runs of positions (each "own" segment, then [base_len, n_tokens)) of
ceil(run / block_tokens): format versions 4 to 7, agent or pool files; version
6 agent files carry "corrections", whose records are checked against n_tokens,
n_layer and the head dims; version 7 agent files carry "window_first",
"window" and "local_layers", and each local layer's tensors then hold only the
file blocks from B0 on, B0 being the number of file blocks (in file order,
each ending at its run's start plus block_tokens, or at the run's end) that end
at or before window_first), and prints one line per tensor. Exits 1 with a message naming the file on the first
violation. (The checksums are XXH3, which the standard library lacks: only
their form is checked here.)
"""
import json
import re
import struct
import sys

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
              "I8": 1, "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1}
REQUIRED_META = ["format", "format_version", "agent_id", "model_fingerprint", "n_layer", "n_head_kv",
                 "head_dim_k", "head_dim_v", "kv_format_k", "kv_format_v", "block_tokens", "n_tokens",
                 "tokens", "block_checksums"]
TENSOR_NAME = re.compile(r"^layers\.(\d+)\.([kv])\.(values|q|codes|scale|scale_min|norm)$")


class Bad(Exception):
    pass


def check_corrections(text, n_tokens, n_layer, n_head_kv, head_dim_k, head_dim_v):
    """Version 6's "corrections": ranges separated by ';', each
    start:n:layer0:W:S:M (decimal start, n, layer0; W n floats; S a '0'/'1'
    per layer; M n_layer * n_head_kv * (head_dim_k + head_dim_v) floats;
    floats as 8 lowercase hex digits), ranges inside n_tokens, not
    overlapping."""
    per = n_head_kv * (head_dim_k + head_dim_v)
    ranges = []
    recs = text.split(";")
    if not 1 <= len(recs) <= 8:
        raise Bad("%d correction ranges" % len(recs))
    for r in recs:
        f = r.split(":")
        if len(f) != 6 or not all(re.fullmatch(r"0|[1-9][0-9]*", x) for x in f[:3]):
            raise Bad("correction %.40r" % r)
        start, n, layer0 = int(f[0]), int(f[1]), int(f[2])
        if n < 1 or start + n > n_tokens or layer0 >= n_layer:
            raise Bad("correction [%d, %d) from layer %d (of %d tokens, %d layers)" % (start, start + n, layer0,
                                                                                         n_tokens, n_layer))
        if not re.fullmatch(r"[0-9a-f]{%d}" % (8 * n), f[3]):
            raise Bad("correction at %d: not %d weights" % (start, n))
        if not re.fullmatch(r"[01]{%d}" % n_layer, f[4]) or "1" in f[4][:layer0]:
            raise Bad("correction at %d: layer flags %.40r" % (start, f[4]))
        if len(f[5]) != 8 * n_layer * per or not re.fullmatch(r"[0-9a-f]*", f[5]):
            raise Bad("correction at %d: offsets of %d characters, expected %d" % (start, len(f[5]),
                                                                                8 * n_layer * per))
        ranges.append((start, start + n))
    ranges.sort()
    for (a, b), (c, d) in zip(ranges, ranges[1:]):
        if c < b:
            raise Bad("corrected ranges [%d, %d) and [%d, %d) overlap" % (a, b, c, d))


def window_blocks(meta, runs, base_len, n_tokens, n_layer, block_tokens):
    """Version 7: the local layers and the file blocks their tensors leave
    out (those ending at or before window_first). Returns (B0, local)."""
    loc, wf, w = meta.get("local_layers", ""), meta.get("window_first", ""), meta.get("window", "")
    if not re.fullmatch(r"[01]{%d}" % n_layer, loc) or "1" not in loc:
        raise Bad("local_layers %.40r" % loc)
    if not re.fullmatch(r"[1-9][0-9]*", wf) or not re.fullmatch(r"[1-9][0-9]*", w):
        raise Bad("window_first %.20r, window %.20r" % (wf, w))
    wf = int(wf)
    if wf > n_tokens or (base_len == 0 and wf % block_tokens):
        raise Bad("window_first %d (of %d tokens, blocks of %d, base %d)" % (wf, n_tokens, block_tokens, base_len))
    # the runs' starts: each own segment where it lies, the last at base_len
    starts, at = [], 0
    if "segments" in meta:
        for r in meta["segments"].split(","):
            f = r.split(":")
            if f[0] == "own":
                starts.append(at)
            at += int(f[1])
    starts.append(base_len)
    b0 = 0
    for start, length in zip(starts, runs):
        for q in range(0, length, block_tokens):
            if start + min(q + block_tokens, length) > wf:
                return b0, [c == "1" for c in loc]
            b0 += 1
    return b0, [c == "1" for c in loc]


def check(path):
    data = open(path, "rb").read()
    if len(data) < 8:
        raise Bad("file shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise Bad("header length %d runs past the end of the file" % n)
    if n % 8:
        raise Bad("header length %d is not a multiple of 8" % n)
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise Bad("__metadata__ missing or not a map of strings")
    for k in REQUIRED_META:
        if k not in meta:
            raise Bad("metadata key %s missing" % k)
    if meta["format"] not in ("agentkv.agent", "agentkv.pool"):
        raise Bad("format is %r" % meta["format"])
    version = meta["format_version"]
    if version not in ("4", "5", "6", "7"):
        raise Bad("format_version %r (this checker reads versions 4 to 7)" % version)
    if version in ("6", "7") and meta["format"] != "agentkv.agent":
        raise Bad("a version %s %s file" % (version, meta["format"]))
    for k in ("key_center", "value_center"):  # the centering of K and V (docs/kv-formats.md)
        if not re.fullmatch(r"[0-9a-z.-]{1,32}", meta.get(k, "")):
            raise Bad("%s missing or not an id" % k)
    body = len(data) - 8 - n
    spans = []
    for name, t in header.items():
        dt, shape, offs = t["dtype"], t["shape"], t["data_offsets"]
        if dt not in DTYPE_SIZE:
            raise Bad("%s: unknown dtype %s" % (name, dt))
        count = 1
        for s in shape:
            count *= s
        if offs[1] - offs[0] != count * DTYPE_SIZE[dt]:
            raise Bad("%s: %d bytes for shape %s of %s" % (name, offs[1] - offs[0], shape, dt))
        if not 0 <= offs[0] <= offs[1] <= body:
            raise Bad("%s: offsets %s outside the data section of %d bytes" % (name, offs, body))
        spans.append((offs[0], offs[1], name))
        print("%-24s %-5s %s" % (name, dt, shape))
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            raise Bad("%s starts at %d, expected %d (gap or overlap)" % (name, b, pos))
        pos = e
    if pos != body:
        raise Bad("tensors cover %d of %d data bytes" % (pos, body))
    n_tokens = int(meta["n_tokens"])
    toks = meta["tokens"].split(",") if meta["tokens"] else []
    if len(toks) != n_tokens or not all(re.fullmatch(r"0|[1-9][0-9]*", x) for x in toks):
        raise Bad("%d token ids for n_tokens %d" % (len(toks), n_tokens))
    # the tensors: per layer, K and V, each [n_blocks, n_head_kv, block_tokens, ...]
    n_layer, n_head_kv, block_tokens = int(meta["n_layer"]), int(meta["n_head_kv"]), int(meta["block_tokens"])
    if not 1 <= block_tokens <= 4096:
        raise Bad("block_tokens %d outside [1, 4096]" % block_tokens)
    # a base: the pool's first base_len positions are not in the file
    base_len = int(meta.get("base_len", "0") or "0")
    runs = None  # lengths of the runs of positions the file holds, with segments
    if "segments" in meta:
        if version == "4" or meta["format"] != "agentkv.agent":
            raise Bad("segments in a version %s %s file" % (version, meta["format"]))
        if any(k in meta for k in ("pool_id", "pool_hash", "base_kind")):
            raise Bad("segments beside a single base")
        recs = meta["segments"].split(",")
        if not 1 <= len(recs) <= 8:
            raise Bad("%d segments" % len(recs))
        total, runs = 0, []
        for i, r in enumerate(recs):
            f = r.split(":")
            ok = (len(f) == 2 and f[0] == "own") or (len(f) == 4 and f[0] in ("pool", "card")
                                                     and re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}", f[2])
                                                     and re.fullmatch(r"[0-9a-f]{16}", f[3]))
            if not ok or not re.fullmatch(r"[1-9][0-9]*", f[1]) or (f[0] == "pool" and i > 0):
                raise Bad("segment %r" % r)
            total += int(f[1])
            if f[0] == "own":
                runs.append(int(f[1]))
        if total != base_len or not 0 < base_len <= n_tokens:
            raise Bad("segments of %d positions, base_len %d (of %d tokens)" % (total, base_len, n_tokens))
        runs.append(n_tokens - base_len)
    elif base_len:
        if meta["format"] != "agentkv.agent" or not 0 < base_len <= n_tokens:
            raise Bad("base_len %d (of %d tokens)" % (base_len, n_tokens))
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", meta.get("pool_id", "")) or meta["pool_id"][0] == ".":
            raise Bad("pool_id %r" % meta.get("pool_id"))
        if not re.fullmatch(r"[0-9a-f]{16}", meta.get("pool_hash", "")):
            raise Bad("pool_hash %r" % meta.get("pool_hash"))
    if meta["format"] == "agentkv.pool":
        if not re.fullmatch(r"[0-9a-f]{16}", meta.get("pool_hash", "")) or "source" not in meta:
            raise Bad("a pool file needs pool_hash and source")
    if runs is None:
        runs = [n_tokens - base_len]
    n_blocks = sum((r + block_tokens - 1) // block_tokens for r in runs)
    head_dim_k, head_dim_v = int(meta["head_dim_k"]), int(meta["head_dim_v"])
    if "corrections" in meta:
        if version not in ("6", "7"):
            raise Bad("corrections in a version %s file" % version)
        check_corrections(meta["corrections"], n_tokens, n_layer, n_head_kv, head_dim_k, head_dim_v)
    elif version == "6":
        raise Bad("a version 6 file without corrections")
    local = [False] * n_layer
    b0 = 0
    if version == "7":
        b0, local = window_blocks(meta, runs, base_len, n_tokens, n_layer, block_tokens)
    elif any(k in meta for k in ("window_first", "window", "local_layers")):
        raise Bad("window metadata in a version %s file" % version)
    seen = set()
    for name, t in header.items():
        m = TENSOR_NAME.match(name)
        if not m or int(m.group(1)) >= n_layer:
            raise Bad("unexpected tensor %s" % name)
        want = n_blocks - (b0 if local[int(m.group(1))] else 0)
        if t["shape"][:3] != [want, n_head_kv, block_tokens]:
            raise Bad("%s: shape %s does not start with [blocks held, n_head_kv, block_tokens] = %s"
                      % (name, t["shape"], [want, n_head_kv, block_tokens]))
        seen.add((int(m.group(1)), m.group(2)))
    if seen != {(l, kv) for l in range(n_layer) for kv in "kv"}:
        raise Bad("not every layer has K and V tensors")
    sums = meta["block_checksums"].split(",") if meta["block_checksums"] else []
    if len(sums) != n_blocks:
        raise Bad("%d block checksums for %d blocks" % (len(sums), n_blocks))
    if not all(re.fullmatch(r"[0-9a-f]{16}", v) for v in sums):
        raise Bad("a block checksum is not 16 lowercase hex digits")
    print("ok: %d tensors, %d tokens, K %s / V %s" % (len(header), n_tokens, meta["kv_format_k"],
                                                      meta["kv_format_v"]))


def main():
    if len(sys.argv) < 2:
        print("usage: check_safetensors.py FILE...", file=sys.stderr)
        sys.exit(1)
    for path in sys.argv[1:]:
        try:
            check(path)
        except (Bad, ValueError, KeyError, TypeError, IndexError, OSError) as e:
            print("check_safetensors: %s: %s" % (path, e), file=sys.stderr)
            sys.exit(1)


main()
