/*
 * fill: a guest program that makes most of the guest's RAM data pages. It
 * takes a share of the kernel's MemAvailable, writes every page of it with
 * words no other page holds and none of them zero (so a migration's first
 * round sends data, not zero-page flags), then runs a counter as `counter`
 * does: every interval it re-checks the next slice of its pages against
 * what it wrote, folds the slice into a running hash and prints
 *   s2mmu-counter: n=N hash=H
 * (the counter's format, so the proof that a migrated guest went on, the
 * next step on the destination, is the same). N only grows by one; H
 * depends on every earlier step and every page checked so far. Each time
 * the slices have covered all pages it prints
 *   s2mmu-fill: sweep=K ok
 * Its pages are only read after the fill: the guest stays near idle.
 *
 * Arguments (key=value, all optional):
 *   pct=N        percent of MemAvailable to fill, 1..95 (default 90)
 *   ms=N         interval in milliseconds, 1..60000 (default 1000)
 *   slices=N     slices per sweep, 1..4096 (default 64)
 *   secs=N       stop after N seconds, 0 = never (default 0)
 * Prints "s2mmu-fill: filled pages=P mib=M secs=S" after the fill, and
 * ends with "s2mmu-counter: ok n=N hash=H" or a line with ": FAIL".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "counter_loop.h"

#define PAGE 4096UL
#define WORDS (PAGE / 8)

static uint64_t num(const char *k, const char *s, uint64_t lo, uint64_t hi)
{
	char *end;
	errno = 0;
	uint64_t v = strtoull(s, &end, 0);
	if (errno || *end || v < lo || v > hi) {
		printf("s2mmu-fill: FAIL bad %s=%s (%" PRIu64 "..%" PRIu64 ")\n", k, s, lo, hi);
		exit(2);
	}
	return v;
}

/* Page p's first word: a different, odd (so never zero) value per page. */
static uint64_t seed(uint64_t p)
{
	uint64_t x = (p + 1) * 0x9e3779b97f4a7c15ULL;
	x = (x ^ x >> 30) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ x >> 27) * 0x94d049bb133111ebULL;
	return (x ^ x >> 31) | 1;
}

/* Word i of page p: odd plus an even step, so odd, never zero; pages
 * differ in their first word already. */
static uint64_t word(uint64_t s, uint64_t i)
{
	return s + i * 0xd1b54a32d192ed04ULL;
}

/* MemAvailable in bytes, 0 if it cannot be read. */
static uint64_t mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[128];
	uint64_t kib = 0;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib * 1024;
}

/* Checks pages [first, first + n) of `buf`; their sum, or prints FAIL and
 * exits. */
static uint64_t check(const volatile uint64_t *buf, uint64_t first, uint64_t n, uint64_t step)
{
	uint64_t sum = 0;
	for (uint64_t p = first; p < first + n; p++) {
		uint64_t s = seed(p);
		const volatile uint64_t *w = buf + p * WORDS;
		for (uint64_t i = 0; i < WORDS; i++) {
			if (w[i] != word(s, i)) {
				printf("s2mmu-fill: FAIL n=%" PRIu64 " page=%" PRIu64 " word=%" PRIu64
				       " got=%#" PRIx64 " want=%#" PRIx64 "\n", step, p, i, w[i], word(s, i));
				exit(1);
			}
			sum += w[i];
		}
	}
	return sum;
}

int main(int argc, char **argv)
{
	uint64_t pct = 90, ms = 1000, slices = 64, secs = 0;
	for (int i = 1; i < argc; i++) {
		char *v = strchr(argv[i], '=');
		if (!v) {
			printf("s2mmu-fill: FAIL argument %s is not key=value\n", argv[i]);
			return 2;
		}
		*v++ = 0;
		if (!strcmp(argv[i], "pct")) pct = num("pct", v, 1, 95);
		else if (!strcmp(argv[i], "ms")) ms = num("ms", v, 1, 60000);
		else if (!strcmp(argv[i], "slices")) slices = num("slices", v, 1, 4096);
		else if (!strcmp(argv[i], "secs")) secs = num("secs", v, 0, 1ULL << 32);
		else {
			printf("s2mmu-fill: FAIL unknown argument %s\n", argv[i]);
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	uint64_t pages = mem_available() / 100 * pct / PAGE;
	if (pages < slices) {
		printf("s2mmu-fill: FAIL MemAvailable gives %" PRIu64 " pages, fewer than slices=%" PRIu64 "\n",
		       pages, slices);
		return 1;
	}
	double t0 = now();
	uint64_t *buf = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE,
			     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		printf("s2mmu-fill: FAIL mmap of %" PRIu64 " pages: %s\n", pages, strerror(errno));
		return 1;
	}
	for (uint64_t p = 0; p < pages; p++) {
		uint64_t s = seed(p);
		for (uint64_t i = 0; i < WORDS; i++)
			buf[p * WORDS + i] = word(s, i);
	}
	printf("s2mmu-fill: filled pages=%" PRIu64 " mib=%" PRIu64 " secs=%.1f\n", pages,
	       pages * PAGE >> 20, now() - t0);
	uint64_t per = (pages + slices - 1) / slices, hash = COUNTER_HASH0, n, at = 0;
	uint64_t sweeps = 0;
	double start = now(), next = start;
	for (n = 1; secs == 0 || now() - start < secs; n++) {
		uint64_t cnt = pages - at < per ? pages - at : per;
		uint64_t sum = check(buf, at, cnt, n);
		at += cnt;
		hash = counter_step(hash, sum, n);
		if (at == pages) {
			at = 0;
			printf("s2mmu-fill: sweep=%" PRIu64 " ok\n", ++sweeps);
		}
		counter_wait(&next, ms);
	}
	counter_ok(n - 1, hash);
	return 0;
}
