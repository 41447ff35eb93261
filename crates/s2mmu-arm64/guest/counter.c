/*
 * counter: a guest program whose progress survives (or visibly does not
 * survive) a live migration. Every interval it checks that its buffer
 * holds what the previous step wrote, rewrites the whole buffer for the
 * next value, folds the buffer into a running hash and prints
 *   s2mmu-counter: n=N hash=H
 * N only grows by one; H depends on every earlier step, so the line after
 * a migration must continue the sequence exactly.
 *
 * Arguments (key=value, all optional):
 *   secs=N       stop after N seconds, 0 = never (default 0)
 *   kib=N        buffer size in KiB (default 256)
 *   ms=N         interval in milliseconds (default 100)
 * Ends with "s2mmu-counter: ok n=N hash=H" or "s2mmu-counter: FAIL ...".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "counter_loop.h"

static uint64_t num(const char *k, const char *s)
{
	char *end;
	errno = 0;
	uint64_t v = strtoull(s, &end, 0);
	if (errno || *end) {
		printf("s2mmu-counter: FAIL bad %s=%s\n", k, s);
		exit(2);
	}
	return v;
}

/* The buffer's word i after step n. */
static uint64_t word(uint64_t n, uint64_t i)
{
	uint64_t x = n * 0x9e3779b97f4a7c15ULL ^ i * 0xbf58476d1ce4e5b9ULL;
	return x ^ x >> 31;
}

int main(int argc, char **argv)
{
	uint64_t secs = 0, kib = 256, ms = 100;
	for (int i = 1; i < argc; i++) {
		char *v = strchr(argv[i], '=');
		if (!v) {
			printf("s2mmu-counter: FAIL argument %s is not key=value\n", argv[i]);
			return 2;
		}
		*v++ = 0;
		if (!strcmp(argv[i], "secs")) secs = num("secs", v);
		else if (!strcmp(argv[i], "kib")) kib = num("kib", v);
		else if (!strcmp(argv[i], "ms")) ms = num("ms", v);
		else {
			printf("s2mmu-counter: FAIL unknown argument %s\n", argv[i]);
			return 2;
		}
	}
	if (kib == 0 || kib > (1 << 20) || ms == 0 || ms > 60000) {
		printf("s2mmu-counter: FAIL kib=%" PRIu64 " (1..1048576) ms=%" PRIu64 " (1..60000)\n", kib, ms);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	uint64_t words = kib * 128;
	volatile uint64_t *buf = malloc(words * 8);
	if (!buf) {
		printf("s2mmu-counter: FAIL malloc of %" PRIu64 " KiB\n", kib);
		return 1;
	}
	uint64_t hash = COUNTER_HASH0, n;
	double start = now(), next = start;
	for (n = 1; secs == 0 || now() - start < secs; n++) {
		uint64_t sum = 0;
		for (uint64_t i = 0; i < words; i++) {
			if (n > 1 && buf[i] != word(n - 1, i)) {
				printf("s2mmu-counter: FAIL n=%" PRIu64 " word=%" PRIu64 " got=%#" PRIx64
				       " want=%#" PRIx64 "\n", n, i, buf[i], word(n - 1, i));
				return 1;
			}
			buf[i] = word(n, i);
			sum += buf[i];
		}
		hash = counter_step(hash, sum, n);
		counter_wait(&next, ms);
	}
	counter_ok(n - 1, hash);
	return 0;
}
