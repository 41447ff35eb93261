/*
 * counter_loop.h: the counter's steps, which counter.c and fill.c share.
 * Each step folds the sum of what it checked into a running hash and
 * prints
 *   s2mmu-counter: n=N hash=H
 * (the tests parse this line and recompute H); counter_wait sleeps until
 * the next interval; counter_ok prints the last line of a run that ended.
 * The host writes this file next to each program's source before it
 * compiles them (crates/s2mmu-arm64/src/linux/assets/mod.rs).
 */
#ifndef S2MMU_COUNTER_LOOP_H
#define S2MMU_COUNTER_LOOP_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

/* The running hash before the first step (FNV-1a's offset basis). */
#define COUNTER_HASH0 0xcbf29ce484222325ULL

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Folds step n's sum into `hash` and prints the step's line; the new hash. */
static uint64_t counter_step(uint64_t hash, uint64_t sum, uint64_t n)
{
	hash = (hash ^ sum ^ n) * 0x100000001b3ULL;
	printf("s2mmu-counter: n=%" PRIu64 " hash=%016" PRIx64 "\n", n, hash);
	return hash;
}

/* Sleeps until `*next` plus `ms`, the new `*next`; a step that ran late
 * starts the next interval now instead of catching up. */
static void counter_wait(double *next, uint64_t ms)
{
	*next += ms / 1000.0;
	double wait = *next - now();
	if (wait > 0) {
		struct timespec ts = { (time_t)wait, (long)((wait - (time_t)wait) * 1e9) };
		nanosleep(&ts, NULL);
	} else {
		*next = now();
	}
}

/* The last line of a counter that ran its course: `n` steps, `hash`. */
static void counter_ok(uint64_t n, uint64_t hash)
{
	printf("s2mmu-counter: ok n=%" PRIu64 " hash=%016" PRIx64 "\n", n, hash);
}

#endif
