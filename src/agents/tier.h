/* tier.h - where an agent's memory was when a turn began.
 *
 * Its own header because modules below the agent module (metrics.h labels
 * its histograms by tier) need the enum without the agent module itself.
 */
#ifndef AK_TIER_H
#define AK_TIER_H

/* HOT: its cache was in RAM; WARM: restored from the store; COLD: prefilled
 * from nothing. */
typedef enum { AK_TIER_HOT, AK_TIER_WARM, AK_TIER_COLD } ak_tier;

#endif
