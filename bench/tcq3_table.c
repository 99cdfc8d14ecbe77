/* tcq3_table.c - trains the 512-value table of the tcq3 KV format (see
 * TRELLIS at the top of src/kv/kvformat.c) and prints it as C.
 *
 *   cc -O2 -o /tmp/tcq3_table bench/tcq3_table.c -lm
 *   /tmp/tcq3_table 40 20000 > table.txt      (rounds, training vectors)
 *
 * The training set is n unit vectors of d = 64 Gaussian coordinates scaled
 * to norm sqrt(64) (what tcq3 quantizes: a rotated vector scaled to unit
 * variance per coordinate). Starting from a table of N(0,1) draws, each
 * round codes every vector by Viterbi (the path of 3-bit codes minimizing
 * the squared error, from the state "two zero codes", as the quantizer
 * does) and moves each table entry to the mean of the values coded with it
 * (Lloyd's step for a trellis). The error per coordinate falls every round;
 * the last line on stderr is the error on 5000 fresh vectors with the
 * least-squares norm. Deterministic: a fixed xorshift seed, doubles.
 * Standalone (no project code), run once; the output is pasted into
 * src/kv/kvformat.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define D 64
#define NT 512   /* table entries: windows of 3 codes of 3 bits */
#define NS 64    /* Viterbi states: the last two codes */

static uint64_t rng = 12345;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((rng >> 11) + 0.5) / 9007199254740992.0;
}
/* One N(0,1) draw (Box-Muller, one of the pair). */
static double grand(void) { return sqrt(-2 * log(urand())) * cos(2 * M_PI * urand()); }

/* A Gaussian vector scaled to norm sqrt(D). */
static void draw_vector(float *y) {
    double n = 0;
    for (int i = 0; i < D; i++) {
        y[i] = (float)grand();
        n += (double)y[i] * y[i];
    }
    n = sqrt(D / n);
    for (int i = 0; i < D; i++) y[i] = (float)(y[i] * n);
}

/* The Viterbi path of codes for y under table T; returns its squared error. */
static double viterbi(const float *y, const float *T, int *codes) {
    static double cost[NS], nc[NS];
    static int from[D][NS];
    for (int s = 0; s < NS; s++) cost[s] = s ? 1e30 : 0;
    for (int i = 0; i < D; i++) {
        for (int s = 0; s < NS; s++) nc[s] = 1e30;
        for (int s = 0; s < NS; s++) {
            if (cost[s] >= 1e29) continue;
            for (int c = 0; c < 8; c++) {
                int w = s << 3 | c, ns = w & (NS - 1);
                double e = y[i] - T[w], v = cost[s] + e * e;
                if (v < nc[ns]) {
                    nc[ns] = v;
                    from[i][ns] = s;
                }
            }
        }
        memcpy(cost, nc, sizeof cost);
    }
    int best = 0;
    for (int s = 1; s < NS; s++)
        if (cost[s] < cost[best]) best = s;
    for (int i = D - 1, s = best; i >= 0; i--) {
        codes[i] = s & 7;
        s = from[i][s];
    }
    return cost[best];
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 40, n = argc > 2 ? atoi(argv[2]) : 20000;
    if (rounds < 0 || n < 1) return 2;
    float T[NT], *Y = malloc(sizeof(float) * (size_t)n * D);
    double *sum = malloc(sizeof(double) * NT), *cnt = malloc(sizeof(double) * NT);
    int C[D];
    if (!Y || !sum || !cnt) return 1;
    for (int w = 0; w < NT; w++) T[w] = (float)grand();
    for (int j = 0; j < n; j++) draw_vector(Y + (size_t)j * D);
    for (int it = 0; it < rounds; it++) {
        memset(sum, 0, sizeof(double) * NT);
        memset(cnt, 0, sizeof(double) * NT);
        double err = 0;
        for (int j = 0; j < n; j++) {
            const float *y = Y + (size_t)j * D;
            err += viterbi(y, T, C);
            for (int i = 0, w = 0; i < D; i++) {
                w = (w << 3 | C[i]) & (NT - 1);
                sum[w] += y[i];
                cnt[w] += 1;
            }
        }
        fprintf(stderr, "round %d: error per coordinate %.5f\n", it, err / n / D);
        for (int w = 0; w < NT; w++)
            if (cnt[w] > 0) T[w] = (float)(sum[w] / cnt[w]);
    }
    double err = 0;
    const int ne = 5000;
    for (int j = 0; j < ne; j++) {
        float y[D], t[D];
        draw_vector(y);
        viterbi(y, T, C);
        double yc = 0, cc = 0;
        for (int i = 0, w = 0; i < D; i++) {
            w = (w << 3 | C[i]) & (NT - 1);
            t[i] = T[w];
            yc += (double)y[i] * t[i];
            cc += (double)t[i] * t[i];
        }
        for (int i = 0; i < D; i++) {
            double e = y[i] - yc / cc * t[i];
            err += e * e;
        }
    }
    fprintf(stderr, "fresh vectors: error per coordinate %.5f (least-squares norm)\n", err / ne / D);
    /* Here a window is c_{i-2}*64 + c_{i-1}*8 + c_i (a shift register);
     * the format indexes by c_i*64 + c_{i-1}*8 + c_{i-2} (the bits of the
     * code stream as they lie): print in that order. */
    printf("const float ak_kvf_tcq3_table[512] = {\n");
    for (int k = 0; k < NT; k++) {
        int w = (k & 7) << 6 | (k & 0x38) | k >> 6;
        printf("%s%.9gf,%s", k % 8 ? " " : "    ", T[w], k % 8 == 7 ? "\n" : "");
    }
    printf("};\n");
    free(Y);
    free(sum);
    free(cnt);
    return 0;
}
