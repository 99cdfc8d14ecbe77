#!/usr/bin/env python3
"""mkseeds.py - writes the seed corpora of the fuzz targets that start from
the shared models and golden files (run from the repository root):

    python3 fuzz/mkseeds.py SHARED_DIR AGENTKV_BINARY

  fuzz/corpus/tokenizer/      vocabularies of the golden tokenizer files and
                              shared models, cut to their first few hundred
                              tokens (merges and special ids that point past
                              the cut are dropped), each behind a test string
                              (layout in fuzz/fuzz_tokenizer.c)
  fuzz/corpus/chat_template/  the real chat templates, with a few messages
                              (layout in fuzz/fuzz_chat_template.c)
  fuzz/corpus/stop/           stop strings and texts (fuzz/fuzz_stop.c)
  fuzz/corpus/model/          tiny synthetic models (`agentkv synth`): both
                              architectures, tied and untied, six weight types
  fuzz/corpus/sealed/         agent files sealed under fuzz_sealed's key,
                              written by `agentkv run --agent` on stories260K
                              (old seeds there are replaced)
  fuzz/corpus/store/          plain agent files (format 4) written by `agentkv
                              run --agent` on stories260K, named by their
                              formats (f16-f16, ...)
  store and sealed, both:     small synthetic files in format 4 (synth-plain,
                              synth-base: an agent whose sequence starts with
                              a pool's base, synth-pool: a pool file), written
                              by the fuzz targets themselves
                              (AK_FUZZ_STORE_SEEDS=DIR fuzz_store / fuzz_sealed:
                              they need the library's own XXH3 and seal), when
                              FUZZ_BIN_DIR (default build/fuzz) holds them
  fuzz/corpus/rstore/         stored response and conversation records
                              (src/store/rstore.h), written by fuzz_rstore
                              itself (AK_FUZZ_STORE_SEEDS=DIR fuzz_rstore),
                              when FUZZ_BIN_DIR holds it

Files are named by the SHA-1 of their content, as libFuzzer names them.
"""
import hashlib
import os
import struct
import subprocess
import sys
import tempfile

# GGUF metadata value types (src/gguf.h)
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
       U64: "<Q", I64: "<q", F64: "<d"}


def read_gguf_kv(path):
    """Returns the metadata of a GGUF file as a list of (key, type, value);
    arrays are (elem_type, [values])."""
    with open(path, "rb") as f:
        d = f.read()
    magic, version, n_t, n_kv = struct.unpack_from("<IIQQ", d, 0)
    assert magic == 0x46554747, path
    off = 24

    def rstr(off):
        (n,) = struct.unpack_from("<Q", d, off)
        return d[off + 8:off + 8 + n], off + 8 + n

    def rval(t, off):
        if t == STR:
            return rstr(off)
        if t == ARR:
            et, cnt = struct.unpack_from("<IQ", d, off)
            off += 12
            vals = []
            for _ in range(cnt):
                v, off = rval(et, off)
                vals.append(v)
            return (et, vals), off
        (v,) = struct.unpack_from(FMT[t], d, off)
        return v, off + struct.calcsize(FMT[t])

    kvs = []
    for _ in range(n_kv):
        k, off = rstr(off)
        (t,) = struct.unpack_from("<I", d, off)
        v, off = rval(t, off + 4)
        kvs.append((k.decode(), t, v))
    return kvs


def write_gguf_kv(kvs):
    """A GGUF v3 image with this metadata and no tensors."""
    out = bytearray(struct.pack("<IIQQ", 0x46554747, 3, 0, len(kvs)))

    def wval(t, v):
        if t == STR:
            out.extend(struct.pack("<Q", len(v)) + v)
        elif t == ARR:
            et, vals = v
            out.extend(struct.pack("<IQ", et, len(vals)))
            for x in vals:
                wval(et, x)
        else:
            out.extend(struct.pack(FMT[t], v))

    for k, t, v in kvs:
        kb = k.encode()
        out.extend(struct.pack("<Q", len(kb)) + kb + struct.pack("<I", t))
        wval(t, v)
    return bytes(out)


def cut_vocab(kvs, n):
    """Keeps the tokenizer.* metadata with the vocabulary cut to n tokens."""
    d = {k: (t, v) for k, t, v in kvs}
    tokens = d["tokenizer.ggml.tokens"][1][1][:n]
    keep = set(tokens)
    out = []
    for k, t, v in kvs:
        if not k.startswith("tokenizer.") or k == "tokenizer.chat_template":
            continue
        if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            v = (v[0], v[1][:n])
        elif k == "tokenizer.ggml.merges":
            merged = []
            for m in v[1]:
                a, _, b = m.partition(b" ")
                if a in keep and b in keep and a + b in keep:
                    merged.append(m)
            v = (v[0], merged)
        elif k.endswith("_token_id") and v >= n:
            continue
        out.append((k, t, v))
    return out


def save(dirname, data):
    os.makedirs(dirname, exist_ok=True)
    with open(os.path.join(dirname, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def tokenizer_seeds(shared):
    g = os.path.join(shared, "golden", "tokenizer")
    sources = [(os.path.join(g, n + ".gguf"), os.path.join(g, n + ".inp"), 400)
               for n in ("llama-spm", "gpt-2", "deepseek-llm", "starcoder", "falcon")]
    sources += [(os.path.join(shared, "models", "stories260K.gguf"), None, 512),
                (os.path.join(shared, "models", "gemma3-tiny.gguf"), None, 400),
                (os.path.join(shared, "models", "qwen3-tiny.gguf"), None, 600)]
    default_texts = [b"Hello world! <s>Once upon a time</s> <|im_start|>user\n\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80",
                     b"   \n\n\t 12345 don't I'm <|endoftext|>\xff\xfe"]
    for path, inp, n in sources:
        if not os.path.exists(path):
            continue
        image = write_gguf_kv(cut_vocab(read_gguf_kv(path), n))
        texts = default_texts
        if inp:
            with open(inp, "rb") as f:
                texts = f.read().split(b"\n__ggml_vocab_test__\n")[:40:8] + default_texts[:1]
        for t in texts:
            t = t[:512]
            save("fuzz/corpus/tokenizer", struct.pack("<H", len(t)) + t + image)


def chat_seeds(shared):
    tdir = os.path.join(shared, "golden", "templates")
    msgs = [b"\x00You are terse.", b"\x01Hi there", b"\x02  Hello! How can I help?  ", b"\x01What is 2+2?"]
    for i, name in enumerate(sorted(os.listdir(tdir))):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(tdir, name), "rb") as f:
            tmpl = f.read()[:4000]
        arch = [b"llama", b"qwen2", b"gemma3", b"phi3"][i % 4]
        m = msgs if i % 2 else msgs[1:]
        save("fuzz/corpus/chat_template",
             struct.pack("<H", len(arch)) + arch + struct.pack("<H", len(tmpl)) + tmpl + bytes([i & 3]) + b"\x1e".join(m))
    save("fuzz/corpus/chat_template", struct.pack("<H", 5) + b"llama" + b"\xff\xff" + b"\x01" + b"\x01hi")


def stop_seeds():
    def seed(flags, stops, text):
        b = bytes([flags | len(stops), 7])
        for s in stops:
            b += bytes([len(s)]) + s
        return b + text
    save("fuzz/corpus/stop", seed(0, [b"\nUser:"], b"Hello there.\nUs\nUser: more"))
    save("fuzz/corpus/stop", seed(0x80, [b"<|im_end|>", b"\xc3\xa9!"], "caf\u00e9 na\u00efve \u20ac <|im_e <|im_end|>".encode()))
    save("fuzz/corpus/stop", seed(0, [b"ab", b"aab", b"b"], b"aaaaaaab"))
    save("fuzz/corpus/stop", seed(0, [b"x" * 70, b"END"], b"\xe2\x82\xac" + b"a" * 100 + b"EN" + b"x" * 70))
    save("fuzz/corpus/stop", seed(0x80, [], "\u00e9\u00e9\U0001F600".encode()))


def run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=120)


def model_seeds(shared, agentkv):
    with tempfile.TemporaryDirectory() as tmp:
        # (K-quants need rows of 256: too big for a seed)
        shapes = [("llama", "q4_0", 32, []), ("llama", "f16", 32, ["--untied"]), ("qwen2", "q8_0", 32, []),
                  ("llama", "f32", 16, []), ("qwen2", "bf16", 16, []), ("llama", "q5_1", 32, [])]
        for arch, wt, dim, extra in shapes:
            ffn = 2 * dim
            out = os.path.join(tmp, "m.gguf")
            run([agentkv, "synth", "--arch", arch, "--dim", str(dim), "--layers", "1", "--heads", "2",
                 "--kv-heads", "1", "--ffn", str(ffn), "--vocab", "260", "--ctx", "64", "--type", wt,
                 "--tied", "--threads", "1", "-o", out] + extra)
            with open(out, "rb") as f:
                save("fuzz/corpus/model", f.read())


SEAL_KEY = bytes(range(1, 33))   # fuzz_sealed.c's key


def clear(dirname):
    """Removes the seeds of a corpus directory (a format change makes them stale)."""
    if os.path.isdir(dirname):
        for n in os.listdir(dirname):
            os.unlink(os.path.join(dirname, n))


def synthetic_store_seeds(target, corpus):
    """The synthetic seeds written by fuzz_<target> in seed mode, if built."""
    fuzz_bin = os.path.join(os.environ.get("FUZZ_BIN_DIR", "build/fuzz"), "fuzz_" + target)
    if not os.path.exists(fuzz_bin):
        print("mkseeds: %s not built: no synthetic seeds for %s" % (fuzz_bin, corpus), file=sys.stderr)
        return
    os.makedirs(corpus, exist_ok=True)
    subprocess.run([fuzz_bin], check=True, stdout=subprocess.DEVNULL, timeout=120,
                   env=dict(os.environ, AK_FUZZ_STORE_SEEDS=corpus))


def store_seeds(shared, agentkv):
    model = os.path.join(shared, "models", "stories260K.gguf")
    clear("fuzz/corpus/store")
    os.makedirs("fuzz/corpus/store", exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (fk, fv) in enumerate([("f16", "f16"), ("q8", "tq3"), ("q4", "q2"), ("tq4", "tq4"), ("bf16", "q8")]):
            mem = os.path.join(tmp, "mem%d" % i)
            run([agentkv, "run", "-m", model, "-p", "Once upon a time", "-n", "4", "--agent", "a",
                 "--memory-dir", mem, "-ctk", fk, "-ctv", fv])
            with open(os.path.join(mem, "a.safetensors"), "rb") as f:
                data = f.read()
            with open(os.path.join("fuzz/corpus/store", "%s-%s" % (fk, fv)), "wb") as f:
                f.write(data)
    synthetic_store_seeds("store", "fuzz/corpus/store")


def sealed_seeds(shared, agentkv):
    model = os.path.join(shared, "models", "stories260K.gguf")
    clear("fuzz/corpus/sealed")
    with tempfile.TemporaryDirectory() as tmp:
        key = os.path.join(tmp, "key")
        with open(key, "wb") as f:
            f.write(SEAL_KEY)
        os.chmod(key, 0o600)
        for i, (fk, fv) in enumerate([("f16", "f16"), ("q8", "tq3"), ("q4", "q2")]):
            mem = os.path.join(tmp, "mem%d" % i)
            run([agentkv, "run", "-m", model, "-p", "Once upon a time", "-n", "4", "--agent", "a",
                 "--memory-dir", mem, "--memory-key-file", key, "-ctk", fk, "-ctv", fv])
            with open(os.path.join(mem, "a.safetensors"), "rb") as f:
                save("fuzz/corpus/sealed", f.read())
    synthetic_store_seeds("sealed", "fuzz/corpus/sealed")


def rstore_seeds():
    clear("fuzz/corpus/rstore")
    synthetic_store_seeds("rstore", "fuzz/corpus/rstore")


def main():
    shared, agentkv = sys.argv[1], sys.argv[2]
    what = sys.argv[3:] or ["tokenizer", "chat", "stop", "model", "store", "sealed", "rstore"]
    if "tokenizer" in what:
        tokenizer_seeds(shared)
    if "chat" in what:
        chat_seeds(shared)
    if "stop" in what:
        stop_seeds()
    if "model" in what:
        model_seeds(shared, agentkv)
    if "store" in what:
        store_seeds(shared, agentkv)
    if "sealed" in what:
        sealed_seeds(shared, agentkv)
    if "rstore" in what:
        rstore_seeds()


if __name__ == "__main__":
    main()
