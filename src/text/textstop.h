/* textstop.h - stop strings on streamed text: where generation must end and
 * how much of the text generated so far may already be shown.
 *
 * A server streams text while it is generated, but a stop string must never
 * reach the client (the answer ends where it begins), and neither may half
 * of a UTF-8 character. So the tail that could still grow into a stop string
 * is held back until the next bytes decide it:
 *
 *   - a stop string hit: the earliest-starting occurrence of any stop string
 *     in the text so far; the text is cut there, and everything before the
 *     cut may be shown;
 *   - otherwise, when generation has ended, everything may be shown;
 *   - otherwise the longest tail of the text that is the beginning (a proper
 *     prefix) of some stop string is held back; for a stop string longer than
 *     AK_TEXTSTOP_EXACT bytes, whose prefixes would cost too much to compare at
 *     every token, its length minus one bytes are held back instead. The cut
 *     is then moved back (at most 3 bytes) to the start of a UTF-8 character.
 *
 * As valid UTF-8 text is appended in whole characters (as ak_detok hands it
 * out), the shown length never decreases. Stateless and thread-safe; nothing
 * is allocated.
 */
#ifndef AK_TEXTSTOP_H
#define AK_TEXTSTOP_H

#include <stddef.h>

/* Stop strings up to this many bytes are held back exactly (by their
 * longest prefix the text ends with). */
#define AK_TEXTSTOP_EXACT 64

/* Scans text[0..len) for the n_stop stop strings stop[i] (NUL-terminated;
 * empty ones are ignored). The first `checked` bytes were scanned before by a
 * call on a prefix of this same text that found no hit (pass 0 to scan all),
 * so only occurrences ending after them are looked for; checked > len counts
 * as len. ended: 1 when no more text will come.
 * Returns the offset of the earliest-starting stop string occurrence, or -1
 * when there is none; *visible gets the number of bytes that may be shown
 * (that offset on a hit, len when ended, else len less the held-back tail). */
long ak_textstop_scan(const char *text, size_t len, size_t checked, const char *const *stop, int n_stop,
                      int ended, size_t *visible);

#endif
