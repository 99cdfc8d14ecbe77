/* kvformat_layout.c - the components of each stored vector (see the storage
 * layout at the top of kvformat.c), for writing caches as separate tensors. */
#include "kv/kvformat.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int ak_kv_format_components(ak_kv_format f, int d, ak_kv_component out[2]) {
    if (!ak_kv_format_supports(f, d)) return 0;
    int64_t code_bits = 0, group = 0;
    switch (f) {
    case AK_KV_F32: out[0] = (ak_kv_component){"values", "F32", 0, 4 * (size_t)d, 1, {d, 0}}; return 1;
    case AK_KV_F16: out[0] = (ak_kv_component){"values", "F16", 0, 2 * (size_t)d, 1, {d, 0}}; return 1;
    case AK_KV_BF16: out[0] = (ak_kv_component){"values", "BF16", 0, 2 * (size_t)d, 1, {d, 0}}; return 1;
    case AK_KV_Q8: {
        int64_t ng = ceil_div(d, 32);
        out[0] = (ak_kv_component){"q", "I8", 0, (size_t)d, 1, {d, 0}};
        out[1] = (ak_kv_component){"scale", "F16", (size_t)d, 2 * (size_t)ng, 1, {ng, 0}};
        return 2;
    }
    case AK_KV_Q4: code_bits = 4; group = 32; break;
    case AK_KV_Q2: code_bits = 2; group = 16; break;
    case AK_KV_TQ4: code_bits = 4; break;
    case AK_KV_TQ3:
    case AK_KV_TCQ3: code_bits = 3; break;
    case AK_KV_TQ2: code_bits = 2; break;
    default: return 0;
    }
    int64_t cb = ceil_div(code_bits * d, 8);
    out[0] = (ak_kv_component){"codes", "U8", 0, (size_t)cb, 1, {cb, 0}};
    if (group) {
        int64_t ng = ceil_div(d, group);
        out[1] = (ak_kv_component){"scale_min", "F16", (size_t)cb, 4 * (size_t)ng, 2, {ng, 2}};
    } else {
        out[1] = (ak_kv_component){"norm", "F16", (size_t)cb, 2, 0, {0, 0}};
    }
    return 2;
}

size_t ak_kv_format_code_bytes(ak_kv_format f, int d) {
    ak_kv_component c[2];
    return ak_kv_format_components(f, d, c) ? c[0].bytes : 0;
}

size_t ak_kv_format_meta_bytes(ak_kv_format f, int d) {
    ak_kv_component c[2];
    return ak_kv_format_components(f, d, c) == 2 ? c[1].bytes : 0;
}
