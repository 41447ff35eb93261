/*
 * The cost of the first write to a shared file's pages: what a migration's
 * receiver pays writing a destination's RAM (a MAP_SHARED file QEMU maps
 * too) that was first touched by a read.
 *
 * Maps a new 1 GiB file in DIR 2 MiB-aligned, touches one byte of every
 * 4 KiB page (by a read or by a write), then writes every page 4 KiB at a
 * time, twice, and prints nanoseconds a page for each step.
 *
 *   gcc -O2 -o /tmp/shm_first_write scripts/shm_first_write.c
 *   /tmp/shm_first_write /dev/shm read; /tmp/shm_first_write /dev/shm write
 *   (and DIR on a tmpfs mounted huge=always for 2 MiB pages)
 *
 * Run each case more than once: the first run that forms 2 MiB pages pays
 * for compaction (compact_stall in /proc/vmstat).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SZ (1UL << 30)
#define PG 4096UL
#define HUGE (2UL << 20)

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static char src[16 * PG] __attribute__((aligned(64)));

int main(int argc, char **argv)
{
	if (argc != 3 || (strcmp(argv[2], "read") && strcmp(argv[2], "write"))) {
		fprintf(stderr, "usage: %s DIR read|write\n", argv[0]);
		return 2;
	}
	char path[4096];
	snprintf(path, sizeof path, "%s/shm-first-write-%d", argv[1], (int)getpid());
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0 || unlink(path) || ftruncate(fd, SZ)) {
		perror(path);
		return 1;
	}
	char *res = mmap(NULL, SZ + HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (res == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	char *at = (char *)(((unsigned long)res + HUGE - 1) & ~(HUGE - 1));
	char *m = mmap(at, SZ, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
	if (m == MAP_FAILED) {
		perror("mmap of the file");
		return 1;
	}
	memset(src, 7, sizeof src);
	volatile char sink = 0;
	double t = now();
	if (!strcmp(argv[2], "read"))
		for (size_t o = 0; o < SZ; o += PG)
			sink += m[o];
	else
		for (size_t o = 0; o < SZ; o += PG)
			m[o] = 0;
	double touch = now() - t;
	printf("%s, first touched by a %s: %.0f ns a page\n", argv[1], argv[2], touch * 1e9 / (SZ / PG));
	for (int pass = 1; pass <= 2; pass++) {
		t = now();
		for (size_t o = 0; o < SZ; o += PG)
			memcpy(m + o, src + (o / PG) % 16 * PG, PG);
		printf("  write pass %d: %.0f ns a page\n", pass, (now() - t) * 1e9 / (SZ / PG));
	}
	return 0;
}
