/* ids.c - see ids.h */
#include "base/ids.h"

#include <stddef.h>

/* The rule of ids.h, character by character with explicit ranges (no
 * locale can widen the set); stops at the first character past the
 * longest id. */
int ak_agent_id_valid(const char *id) {
    if (!id || !id[0] || id[0] == '.') return 0;
    size_t n = 0;
    for (const char *p = id; *p; p++, n++) {
        char c = *p;
        if (n >= AK_AGENT_ID_MAX) return 0;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '-'))
            return 0;
    }
    return 1;
}
