/* generate.c - the generation step (generate.h). */
#include "text/generate.h"

#include <stdlib.h>
#include <string.h>

#include "text/generate_impl.h"
#include "text/textstop.h"

int ak_gen_init(ak_gen *g, const ak_gen_opts *o, ak_error *err) {
    const int32_t *prompt = o->prompt;
    const int n_prompt = o->n_prompt, max_tokens = o->max_tokens, n_ctx = o->n_ctx, n_stop = o->n_stop;
    const char *const *stop = o->stop;
    const ak_tokenizer *tok = o->tok;
    memset(g, 0, sizeof *g);
    if (n_prompt < 0 || max_tokens < 0 || n_stop < 0 || n_stop > AK_GEN_MAX_STOP)
        return ak_failc(err, AK_ERR_INVALID, "generation: bad prompt length, token limit or stop count");
    for (int i = 0; i < n_stop; i++) {
        if (!stop[i] || !stop[i][0]) return ak_failc(err, AK_ERR_INVALID, "generation: empty stop string");
        g->stop[i] = stop[i];
    }
    g->n_stop = n_stop;
    g->tok = tok;
    g->smp = o->smp;
    g->max_tokens = max_tokens;
    g->n_ctx = n_ctx;
    g->stop_at_eog = o->stop_at_eog;
    /* no more tokens are kept than max_tokens, nor past the context */
    long room = (long)n_prompt + (max_tokens < n_ctx ? max_tokens : n_ctx) + 1;
    g->hist_cap = (int)room;
    g->hist = malloc(sizeof(int32_t) * (size_t)room);
    g->piece_cap = ak_detok_bound(tok);
    g->piece = malloc(g->piece_cap);
    g->cap = 256;
    g->text = malloc(g->cap);
    if (!g->hist || !g->piece || !g->text) {
        ak_gen_free(g);
        return ak_failc(err, AK_ERR_NOMEM, "out of memory");
    }
    if (n_prompt) memcpy(g->hist, prompt, sizeof(int32_t) * (size_t)n_prompt);
    g->n_hist = n_prompt;
    g->text[0] = 0;
    ak_detok_init(&g->dt);
    if (o->constraint && o->constraint->grammar && ak_gen_con_init(g, o->constraint, err) < 0) {
        ak_gen_free(g);
        return -1;
    }
    return 0;
}

void ak_gen_free(ak_gen *g) {
    ak_gen_con_free(g);
    free(g->hist);
    free(g->piece);
    free(g->text);
    g->hist = NULL;
    g->piece = NULL;
    g->text = NULL;
}

/* Appends b[0..n) to the text. Returns 0, or -1 when out of memory. */
static int append(ak_gen *g, const char *b, size_t n) {
    if (g->len + n + 1 > g->cap) {
        size_t nc = (g->len + n + 1) * 2;
        char *nt = realloc(g->text, nc);
        if (!nt) return -1;
        g->text = nt;
        g->cap = nc;
    }
    memcpy(g->text + g->len, b, n);
    g->len += n;
    g->text[g->len] = 0;
    return 0;
}

ak_gen_status ak_gen_step(ak_gen *g, float *logits, int pos, ak_gen_out *out, ak_error *err) {
    memset(out, 0, sizeof *out);
    out->cut = -1;
    out->visible = g->visible;
    out->piece = g->piece;
    /* the history's room bounds the tokens kept as the context does */
    if (g->n_gen >= g->max_tokens || pos >= g->n_ctx || g->n_hist >= g->hist_cap) return AK_GEN_LENGTH;
    int32_t tok;
    if (g->con) {
        /* the constraint's pick (generate_con.c), after the raw logits were read */
        long left = g->max_tokens - g->n_gen;
        if (g->n_ctx - pos < left) left = g->n_ctx - pos;
        if (g->hist_cap - g->n_hist < left) left = g->hist_cap - g->n_hist;
        if ((tok = ak_gen_con_pick(g, logits, left, &out->forced, err)) < 0) return AK_GEN_ERROR;
    } else {
        tok = ak_sample(g->smp, logits, g->hist, g->n_hist);
    }
    out->sampled = 1;
    out->tok = tok;
    if (g->stop_at_eog && ak_token_is_eog(g->tok, tok)) return AK_GEN_STOP;
    g->hist[g->n_hist++] = tok;
    g->n_gen++;
    size_t np = 0;
    if (ak_detok_push(&g->dt, g->tok, tok, g->piece, g->piece_cap, &np) < 0) {
        ak_failc(err, AK_ERR_GENERIC, "cannot decode token %d", (int)tok);
        return AK_GEN_ERROR;
    }
    out->n_piece = np;
    if (np && append(g, g->piece, np) < 0) {
        ak_failc(err, AK_ERR_NOMEM, "out of memory");
        return AK_GEN_ERROR;
    }
    if (g->n_stop && np) {
        /* the text before the new piece held no stop string; what could
         * still become one is held back (textstop.h) */
        size_t vis;
        long at = ak_textstop_scan(g->text, g->len, g->len - np, g->stop, g->n_stop, 0, &vis);
        if (at >= 0) {
            g->len = (size_t)at;
            g->text[g->len] = 0;
            g->visible = g->len;
            g->stopped = 1;
            out->cut = at;
            out->visible = g->visible;
            return AK_GEN_STOP;
        }
        if (vis > g->visible) g->visible = vis;
    } else if (np) {
        g->visible = g->len;
    }
    out->visible = g->visible;
    ak_gen_status end;
    if (g->con && ak_gen_con_done(g, &end)) return end;   /* the grammar is finished */
    if (g->n_gen == g->max_tokens || pos + 1 >= g->n_ctx) return AK_GEN_LENGTH;
    return AK_GEN_MORE;
}

size_t ak_gen_flush(ak_gen *g, const char **piece) {
    *piece = g->piece;
    if (!g->piece) return 0;
    size_t n = ak_detok_flush(&g->dt, g->piece, g->piece_cap);
    if (g->stopped) return 0;   /* past the cut */
    if (n && append(g, g->piece, n) == 0) g->visible = g->len;
    return n;
}
