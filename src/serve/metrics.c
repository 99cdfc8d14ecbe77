/* metrics.c - see metrics.h */
#include "serve/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "agents/agent.h"
#include "kv/blockpool.h"

#define N_LAT 12
static const double lat_bounds[N_LAT] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
#define N_BATCH 8
static const double batch_bounds[N_BATCH] = {1, 2, 4, 8, 16, 32, 64, 128};
#define N_TIERS 3
#define N_ENDPOINTS 16

typedef struct {
    uint64_t count[16];   /* per bucket (not cumulative); the last is +Inf */
    uint64_t n;
    double sum;
} histogram;

typedef struct {
    char endpoint[48];
    int status;
    uint64_t count;
} request_count;

struct ak_metrics {
    pthread_mutex_t mu;
    request_count req[N_ENDPOINTS * 8];
    int n_req;
    uint64_t prompt_tokens, cached_tokens, completion_tokens, prefill_tokens;
    uint64_t hits[N_TIERS];
    histogram ttft[N_TIERS], token_gap[N_TIERS], batch;
    uint64_t evictions, restores, restores_ahead, restore_bytes;
    double restore_s;
};

static void observe(histogram *h, const double *bounds, int nb, double v) {
    int i = 0;
    while (i < nb && v > bounds[i]) i++;
    h->count[i]++;
    h->n++;
    h->sum += v;
}

ak_metrics *ak_metrics_new(ak_error *err) {
    ak_metrics *m = ak_calloc(1, sizeof *m, err);
    if (m) pthread_mutex_init(&m->mu, NULL);
    return m;
}

void ak_metrics_free(ak_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void ak_metrics_request(ak_metrics *m, const char *endpoint, int status) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_req && !(m->req[i].status == status && !strcmp(m->req[i].endpoint, endpoint))) i++;
    if (i == m->n_req && m->n_req < (int)(sizeof m->req / sizeof m->req[0])) {
        snprintf(m->req[i].endpoint, sizeof m->req[i].endpoint, "%s", endpoint);
        m->req[i].status = status;
        m->n_req++;
    }
    if (i < m->n_req) m->req[i].count++;
    pthread_mutex_unlock(&m->mu);
}

void ak_metrics_turn(ak_metrics *m, ak_tier tier, int prompt_tokens, int cached_tokens, double ttft_s,
                     double restore_s, uint64_t restore_bytes, int restored_ahead) {
    if (!m || (unsigned)tier >= N_TIERS) return;
    pthread_mutex_lock(&m->mu);
    m->hits[tier]++;
    m->prompt_tokens += (uint64_t)prompt_tokens;
    m->cached_tokens += (uint64_t)cached_tokens;
    observe(&m->ttft[tier], lat_bounds, N_LAT, ttft_s);
    if (tier == AK_TIER_WARM) {
        m->restores++;
        m->restores_ahead += restored_ahead != 0;
        m->restore_bytes += restore_bytes;
        m->restore_s += restore_s;
    }
    pthread_mutex_unlock(&m->mu);
}

void ak_metrics_token(ak_metrics *m, ak_tier tier, double gap_s) {
    if (!m || (unsigned)tier >= N_TIERS) return;
    pthread_mutex_lock(&m->mu);
    observe(&m->token_gap[tier], lat_bounds, N_LAT, gap_s);
    pthread_mutex_unlock(&m->mu);
}

void ak_metrics_prefill(ak_metrics *m, int tokens) {
    if (!m || tokens <= 0) return;
    pthread_mutex_lock(&m->mu);
    m->prefill_tokens += (uint64_t)tokens;
    pthread_mutex_unlock(&m->mu);
}

void ak_metrics_completion(ak_metrics *m, int completion_tokens) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->completion_tokens += (uint64_t)completion_tokens;
    pthread_mutex_unlock(&m->mu);
}

void ak_metrics_batch(ak_metrics *m, int n_seq) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    observe(&m->batch, batch_bounds, N_BATCH, n_seq);
    pthread_mutex_unlock(&m->mu);
}

void ak_metrics_evictions(ak_metrics *m, int n) {
    if (!m || n <= 0) return;
    pthread_mutex_lock(&m->mu);
    m->evictions += (uint64_t)n;
    pthread_mutex_unlock(&m->mu);
}

/* A growing string; sets failed instead of returning errors on every call. */
typedef struct {
    char *s;
    size_t n, cap;
    int failed;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) { b->failed = 1; return; }
        if ((size_t)k < b->cap - b->n) { b->n += (size_t)k; return; }
        size_t nc = (b->cap + (size_t)k + 1) * 2;
        char *ns = realloc(b->s, nc);
        if (!ns) { b->failed = 1; return; }
        b->s = ns;
        b->cap = nc;
    }
}

/* One metric with its HELP and TYPE lines and a single unlabelled sample. */
static void put_one(sbuf *b, const char *type, const char *name, const char *help, const char *value) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n%s %s\n", name, help, name, type, name, value);
}

static void put_u64(sbuf *b, const char *type, const char *name, const char *help, uint64_t v) {
    char num[32];
    snprintf(num, sizeof num, "%llu", (unsigned long long)v);
    put_one(b, type, name, help, num);
}

static void put_hist(sbuf *b, const char *name, const char *label, const histogram *h, const double *bounds,
                     int nb) {
    uint64_t cum = 0;
    const char *sep = label[0] ? "," : "";
    for (int i = 0; i < nb; i++) {
        cum += h->count[i];
        put(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, label, sep, bounds[i], (unsigned long long)cum);
    }
    cum += h->count[nb];
    put(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, label, sep, (unsigned long long)cum);
    if (label[0]) {
        put(b, "%s_sum{%s} %.6f\n", name, label, h->sum);
        put(b, "%s_count{%s} %llu\n", name, label, (unsigned long long)h->n);
    } else {
        put(b, "%s_sum %.6f\n", name, h->sum);
        put(b, "%s_count %llu\n", name, (unsigned long long)h->n);
    }
}

static void put_tier_hist(sbuf *b, const char *name, const char *help, const histogram *h,
                          const char *const *tiers) {
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int t = 0; t < N_TIERS; t++) {
        char label[32];
        snprintf(label, sizeof label, "tier=\"%s\"", tiers[t]);
        put_hist(b, name, label, &h[t], lat_bounds, N_LAT);
    }
}

char *ak_metrics_render(ak_metrics *m, const ak_metrics_gauges *g) {
    sbuf b = {.s = malloc(4096), .n = 0, .cap = 4096, .failed = 0};
    if (!b.s) return NULL;
    b.s[0] = 0;
    static const char *tiers[N_TIERS] = {"hot", "warm", "cold"};
    pthread_mutex_lock(&m->mu);
    put(&b, "# HELP agentkv_requests_total HTTP requests answered, by endpoint and status.\n"
            "# TYPE agentkv_requests_total counter\n");
    for (int i = 0; i < m->n_req; i++)
        put(&b, "agentkv_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", m->req[i].endpoint,
            m->req[i].status, (unsigned long long)m->req[i].count);
    put_u64(&b, "counter", "agentkv_prompt_tokens_total", "Prompt tokens of completed turns.", m->prompt_tokens);
    put_u64(&b, "counter", "agentkv_cached_tokens_total", "Prompt tokens served from an agent's cache.",
            m->cached_tokens);
    put_u64(&b, "counter", "agentkv_prefill_tokens_total",
            "Prompt tokens computed by the engine's forward pass (requests' and pools').", m->prefill_tokens);
    put_u64(&b, "counter", "agentkv_completion_tokens_total", "Generated tokens.", m->completion_tokens);
    put(&b, "# HELP agentkv_hits_total Turns by the tier that served the agent's memory.\n"
            "# TYPE agentkv_hits_total counter\n");
    for (int t = 0; t < N_TIERS; t++)
        put(&b, "agentkv_hits_total{tier=\"%s\"} %llu\n", tiers[t], (unsigned long long)m->hits[t]);
    put_tier_hist(&b, "agentkv_ttft_seconds", "Time from request to first token, by tier.", m->ttft, tiers);
    put_tier_hist(&b, "agentkv_token_latency_seconds", "Time between generated tokens, by tier of the turn.",
                  m->token_gap, tiers);
    put(&b, "# HELP agentkv_batch_size Sequences per engine step.\n# TYPE agentkv_batch_size histogram\n");
    put_hist(&b, "agentkv_batch_size", "", &m->batch, batch_bounds, N_BATCH);
    put_u64(&b, "counter", "agentkv_evictions_total", "Agents moved out of RAM to make room.", m->evictions);
    put_u64(&b, "counter", "agentkv_restores_total", "Warm restores (from the memory directory).", m->restores);
    put_u64(&b, "counter", "agentkv_restores_ahead_total", "Warm restores done by the I/O thread before the turn.",
            m->restores_ahead);
    put_u64(&b, "counter", "agentkv_restore_bytes_total", "Bytes read by warm restores.", m->restore_bytes);
    char secs[32];
    snprintf(secs, sizeof secs, "%.6f", m->restore_s);
    put_one(&b, "counter", "agentkv_restore_seconds_total", "Time spent in warm restores.", secs);
    pthread_mutex_unlock(&m->mu);
    if (g) {
        put(&b, "# HELP agentkv_agents Agents by tier (hot: KV in RAM; warm: on disk only).\n"
                "# TYPE agentkv_agents gauge\nagentkv_agents{tier=\"hot\"} %d\nagentkv_agents{tier=\"warm\"} %d\n",
            g->agents_hot, g->agents_warm);
        put(&b, "# HELP agentkv_tier_bytes Bytes of agent memory by tier.\n"
                "# TYPE agentkv_tier_bytes gauge\nagentkv_tier_bytes{tier=\"hot\"} %llu\n"
                "agentkv_tier_bytes{tier=\"warm\"} %llu\n",
            (unsigned long long)g->bytes_hot, (unsigned long long)g->bytes_warm);
        put_u64(&b, "gauge", "agentkv_kv_budget_bytes", "RAM budget of the KV pool (0: none).", g->bytes_budget);
        put_u64(&b, "gauge", "agentkv_disk_budget_bytes",
                "Budget of the agent files in the memory directory (the warm tier's bytes; 0: none).", g->disk_budget);
        put_u64(&b, "gauge", "agentkv_responses_stored", "Stored responses and conversations (records).",
                (uint64_t)g->responses);
        put_u64(&b, "gauge", "agentkv_responses_bytes", "Bytes of the stored responses and conversations.",
                g->responses_bytes);
        put_u64(&b, "gauge", "agentkv_responses_budget_bytes", "Budget of the stored responses (0: no store).",
                g->responses_budget);
        put_u64(&b, "counter", "agentkv_responses_expired_total", "Stored records removed at their expiry.",
                g->responses_expired);
        put_u64(&b, "counter", "agentkv_responses_evicted_total", "Stored records removed to keep the budget.",
                g->responses_evicted);
        put_u64(&b, "gauge", "agentkv_requests_active", "Requests prefilling or decoding.", (uint64_t)g->active);
        put_u64(&b, "gauge", "agentkv_requests_queued", "Requests waiting for admission.", (uint64_t)g->queued);
        put_u64(&b, "counter", "agentkv_store_saves_total", "Agent files written to the memory directory.", g->saves);
        put_u64(&b, "counter", "agentkv_store_save_failures_total",
                "Failed agent file writes (each attempt counts; failed saves are retried).", g->save_failures);
        put_u64(&b, "gauge", "agentkv_store_saves_retrying", "Failed saves waiting for their next attempt.",
                (uint64_t)g->saves_retrying);
        put_u64(&b, "gauge", "agentkv_agents_unsaved", "Agents whose memory is not yet confirmed on disk.",
                (uint64_t)g->agents_unsaved);
        put_u64(&b, "gauge", "agentkv_kv_shared_bytes",
                "KV bytes held by more than one agent or pool (a pool's blocks, blocks linked by content).",
                g->shared_bytes);
        /* logical / used: 1 when nothing is shared (and when nothing is held) */
        char ratio[32];
        snprintf(ratio, sizeof ratio, "%.6f", g->used_bytes ? (double)g->logical_bytes / (double)g->used_bytes : 1.0);
        put_one(&b, "gauge", "agentkv_kv_dedup_ratio",
                "KV bytes as agents and pools read them over bytes really held (1: nothing shared).", ratio);
        put_u64(&b, "counter", "agentkv_kv_linked_blocks_total",
                "KV blocks linked from a pool or the content index instead of computed or read.", g->linked_blocks);
        put_u64(&b, "gauge", "agentkv_pools", "Pools (shared prefixes) in RAM or in the memory directory.",
                (uint64_t)g->pools);
        put_u64(&b, "gauge", "agentkv_pools_resident", "Pools whose blocks are in RAM.", (uint64_t)g->pools_resident);
    }
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

void ak_metrics_gauges_collect(ak_metrics_gauges *g, ak_agents *ag, ak_block_pool *pool, int agents_hot,
                               int agents_warm, uint64_t bytes_warm, int active, int queued) {
    ak_block_pool_stats st;
    ak_block_pool_get_stats(pool, &st);
    g->agents_hot = agents_hot;
    g->agents_warm = agents_warm;
    g->bytes_hot = st.used;
    g->bytes_budget = st.budget;
    g->bytes_warm = bytes_warm;
    g->active = active;
    g->queued = queued;
    ak_save_stats ss;
    ak_agents_save_stats(ag, &ss);
    g->saves = ss.saves;
    g->save_failures = ss.failures;
    g->saves_retrying = ss.retrying;
    g->agents_unsaved = ss.unsaved;
    g->disk_budget = ss.disk_budget;
    ak_share_stats sh;
    ak_agents_share_stats(ag, &sh);
    g->shared_bytes = sh.shared_bytes;
    g->logical_bytes = sh.logical_bytes;
    g->used_bytes = sh.used_bytes;
    g->linked_blocks = sh.linked_blocks;
    g->pools = sh.pools;
    g->pools_resident = sh.pools_resident;
}
