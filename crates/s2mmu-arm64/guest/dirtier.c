/*
 * dirtier: the s2mmu Linux guest's memory writer. Each thread owns a slice
 * of a large anonymous mapping and a file in tmpfs; every pass it checks
 * that each of its pages still holds the previous pass's pattern, then
 * writes the next one, at a controlled rate. A page the host lost (a
 * write the hypervisor dropped or a stale translation) fails the check.
 *
 * Arguments (key=value, all optional):
 *   mem=MiB      anonymous memory in all (default 64)
 *   pages=N      instead: N anonymous pages in all (a few pages rewritten in a
 *                tight loop stay in the CPU's TLB between the host's harvests)
 *   file=MiB     tmpfs file data in all (default 8)
 *   rate=N       pages per second in all, 0 = as fast as it can (default 0)
 *   secs=N       how long to run (default 10)
 *   threads=N    writer threads (default: one per online CPU)
 *   thp=1        madvise(MADV_HUGEPAGE) the mapping
 *   tick=MS      print the progress line every MS milliseconds (1..1000,
 *                default 1000); its pages= is the work done so far, so a
 *                host stamping each line sees the rate and every stall
 *   corrupt=1    flip a bit of one page after the first pass, as a lost
 *                write would (shows that the check fails)
 *   fb=ADDR:SIZE instead: map [ADDR, ADDR+SIZE) of /dev/mem (a region
 *                outside RAM) and write/check it the same way
 *   paced=N      with fb: a fixed amount of work, N passes over every page
 *                but the region's last, each once; pass k starts when the
 *                host writes k to word 0 of the last page, and its end is
 *                k written to word 1 (secs bounds the whole run)
 * Prints progress lines each second, then exactly one of
 *   s2mmu-dirtier: ok passes=N pages=M secs=S pages_per_s=R
 *   s2mmu-dirtier: FAIL ...
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define WORDS_CHECKED 64 /* one 8-byte word per 64-byte line */
#define MAX_THREADS 64

struct cfg {
	uint64_t mem_pages, file_pages, rate, secs, threads, thp, corrupt, tick;
	uint64_t fb_addr, fb_size, paced;
};

struct worker {
	pthread_t tid;
	int id;
	volatile uint64_t *mem; /* this thread's slice */
	uint64_t mem_pages, first_page;
	int fd;
	uint64_t file_pages;
	double rate; /* pages/s for this thread, 0 = unlimited */
	_Atomic uint64_t passes, pages;
	int failed;
};

static struct cfg cfg = { .mem_pages = 64 * 256, .file_pages = 8 * 256, .secs = 10, .tick = 1000 };
static double t0, deadline;
static atomic_int stop;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The word at line `w` of global page `p` in pass `gen`. */
static uint64_t pattern(uint64_t p, uint64_t gen, unsigned w)
{
	return 0x5332ULL << 48 ^ p << 20 ^ gen << 6 ^ w;
}

static void fail(const char *what, int t, uint64_t page, unsigned w, uint64_t got, uint64_t want)
{
	printf("s2mmu-dirtier: FAIL %s thread=%d page=%" PRIu64 " word=%u got=%#" PRIx64
	       " want=%#" PRIx64 "\n", what, t, page, w, got, want);
	fflush(stdout);
	atomic_store(&stop, 1);
}

/* Checks page `p` (at `v`) holds pass `gen - 1` (if gen > 1), writes `gen`. */
static int step(volatile uint64_t *v, int t, uint64_t p, uint64_t gen, const char *what)
{
	for (unsigned w = 0; w < WORDS_CHECKED; w++) {
		volatile uint64_t *word = v + w * 8;
		if (gen > 1 && *word != pattern(p, gen - 1, w)) {
			fail(what, t, p, w, *word, pattern(p, gen - 1, w));
			return -1;
		}
		*word = pattern(p, gen, w);
	}
	return 0;
}

/* Sleeps so that `done` pages since `start` keep to `rate` pages/s. */
static void pace(double rate, double start, uint64_t done)
{
	if (rate <= 0)
		return;
	double ahead = start + done / rate - now();
	if (ahead > 0) {
		struct timespec ts = { (time_t)ahead, (long)((ahead - (time_t)ahead) * 1e9) };
		nanosleep(&ts, NULL);
	}
}

static int file_pass(struct worker *w, uint64_t gen)
{
	uint64_t buf[PAGE / 8];
	memset(buf, 0, sizeof buf);
	for (uint64_t i = 0; i < w->file_pages; i++) {
		uint64_t p = (1ULL << 40) + w->first_page + i; /* distinct from memory pages */
		if (gen > 1 && pread(w->fd, buf, PAGE, i * PAGE) != (ssize_t)PAGE) {
			fail("file-read", w->id, i, 0, errno, 0);
			return -1;
		}
		if (step((volatile uint64_t *)buf, w->id, p, gen, "file") < 0)
			return -1;
		if (pwrite(w->fd, buf, PAGE, i * PAGE) != (ssize_t)PAGE) {
			fail("file-write", w->id, i, 0, errno, 0);
			return -1;
		}
	}
	return 0;
}

static void *writer(void *arg)
{
	struct worker *w = arg;
	double start = now();
	uint64_t done = 0;
	for (uint64_t gen = 1; !atomic_load(&stop); gen++) {
		for (uint64_t i = 0; i < w->mem_pages; i++) {
			if (step(w->mem + i * (PAGE / 8), w->id, w->first_page + i, gen, "memory") < 0) {
				w->failed = 1;
				return NULL;
			}
			atomic_fetch_add(&w->pages, 1);
			if ((++done & 63) == 0) {
				pace(w->rate, start, done);
				if (now() > deadline || atomic_load(&stop)) {
					/* The slice is now half gen, half gen - 1: check both. */
					for (uint64_t j = 0; j < w->mem_pages; j++) {
						volatile uint64_t *v = w->mem + j * (PAGE / 8);
						uint64_t g = j <= i ? gen : gen - 1;
						for (unsigned k = 0; g > 0 && k < WORDS_CHECKED; k++)
							if (v[k * 8] != pattern(w->first_page + j, g, k)) {
								fail("final", w->id, w->first_page + j, k, v[k * 8],
								     pattern(w->first_page + j, g, k));
								w->failed = 1;
								return NULL;
							}
					}
					return NULL;
				}
			}
		}
		if (w->fd >= 0 && file_pass(w, gen) < 0) {
			w->failed = 1;
			return NULL;
		}
		atomic_fetch_add(&w->pages, w->file_pages);
		done += w->file_pages;
		atomic_store(&w->passes, gen);
		if (cfg.corrupt && w->id == 0 && gen == 1)
			w->mem[3 * 8] ^= 1;
	}
	return NULL;
}

static uint64_t num(const char *s)
{
	char *end;
	errno = 0;
	uint64_t v = strtoull(s, &end, 0);
	if (errno || *end) {
		printf("s2mmu-dirtier: FAIL bad number %s\n", s);
		exit(2);
	}
	return v;
}

static void parse(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		char *v = strchr(argv[i], '=');
		if (!v) {
			printf("s2mmu-dirtier: FAIL argument %s is not key=value\n", argv[i]);
			exit(2);
		}
		*v++ = 0;
		if (!strcmp(argv[i], "mem")) cfg.mem_pages = num(v) * 256;
		else if (!strcmp(argv[i], "pages")) cfg.mem_pages = num(v);
		else if (!strcmp(argv[i], "file")) cfg.file_pages = num(v) * 256;
		else if (!strcmp(argv[i], "rate")) cfg.rate = num(v);
		else if (!strcmp(argv[i], "secs")) cfg.secs = num(v);
		else if (!strcmp(argv[i], "threads")) cfg.threads = num(v);
		else if (!strcmp(argv[i], "thp")) cfg.thp = num(v);
		else if (!strcmp(argv[i], "corrupt")) cfg.corrupt = num(v);
		else if (!strcmp(argv[i], "tick")) cfg.tick = num(v);
		else if (!strcmp(argv[i], "paced")) cfg.paced = num(v);
		else if (!strcmp(argv[i], "fb")) {
			char *c = strchr(v, ':');
			if (!c) {
				printf("s2mmu-dirtier: FAIL fb=%s is not ADDR:SIZE\n", v);
				exit(2);
			}
			*c++ = 0;
			cfg.fb_addr = num(v);
			cfg.fb_size = num(c);
		} else {
			printf("s2mmu-dirtier: FAIL unknown argument %s\n", argv[i]);
			exit(2);
		}
	}
	if (cfg.threads == 0)
		cfg.threads = sysconf(_SC_NPROCESSORS_ONLN);
	if (cfg.threads < 1 || cfg.threads > MAX_THREADS || cfg.mem_pages < cfg.threads ||
	    cfg.secs > 86400 || cfg.mem_pages > (1ULL << 24) || cfg.tick < 1 || cfg.tick > 1000) {
		printf("s2mmu-dirtier: FAIL threads=%" PRIu64 " (1..%d), mem=%" PRIu64
		       " MiB (at least one page a thread, at most 64 GiB), secs=%" PRIu64
		       ", tick=%" PRIu64 " (1..1000)\n",
		       cfg.threads, MAX_THREADS, cfg.mem_pages / 256, cfg.secs, cfg.tick);
		exit(2);
	}
}

int fb_main(void);

int main(int argc, char **argv)
{
	static struct worker ws[MAX_THREADS];
	parse(argc, argv);
	setvbuf(stdout, NULL, _IOLBF, 0);
	t0 = now();
	deadline = t0 + cfg.secs;
	if (cfg.fb_size)
		return fb_main();
	size_t len = cfg.mem_pages * PAGE;
	uint64_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		printf("s2mmu-dirtier: FAIL mmap of %zu bytes: %s\n", len, strerror(errno));
		return 1;
	}
	if (cfg.thp)
		madvise(mem, len, MADV_HUGEPAGE);
	uint64_t per = cfg.mem_pages / cfg.threads, fper = cfg.file_pages / cfg.threads;
	printf("s2mmu-dirtier: start threads=%" PRIu64 " mem_pages=%" PRIu64 " file_pages=%" PRIu64
	       " rate=%" PRIu64 " secs=%" PRIu64 "\n",
	       cfg.threads, per * cfg.threads, fper * cfg.threads, cfg.rate, cfg.secs);
	for (uint64_t t = 0; t < cfg.threads; t++) {
		struct worker *w = &ws[t];
		char name[64];
		w->id = t;
		w->first_page = t * per;
		w->mem = (volatile uint64_t *)mem + t * per * (PAGE / 8);
		w->mem_pages = per;
		w->rate = (double)cfg.rate / cfg.threads;
		w->file_pages = fper;
		w->fd = -1;
		if (fper) {
			snprintf(name, sizeof name, "/tmp/dirtier.%d", (int)t);
			w->fd = open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);
			if (w->fd < 0) {
				printf("s2mmu-dirtier: FAIL open %s: %s\n", name, strerror(errno));
				return 1;
			}
		}
		if (pthread_create(&w->tid, NULL, writer, w)) {
			printf("s2mmu-dirtier: FAIL pthread_create\n");
			return 1;
		}
	}
	int alive = 1;
	while (alive) {
		struct timespec tick = { cfg.tick / 1000, (long)(cfg.tick % 1000) * 1000000 };
		nanosleep(&tick, NULL);
		uint64_t passes = UINT64_MAX, pages = 0;
		alive = 0;
		for (uint64_t t = 0; t < cfg.threads; t++) {
			uint64_t p = atomic_load(&ws[t].passes);
			passes = p < passes ? p : passes;
			pages += atomic_load(&ws[t].pages);
		}
		alive = now() < deadline + 1 && !atomic_load(&stop);
		printf("s2mmu-dirtier: t=%.*fs passes=%" PRIu64 " pages=%" PRIu64 "\n",
		       cfg.tick < 1000 ? 3 : 0, now() - t0, passes, pages);
	}
	atomic_store(&stop, 1);
	uint64_t passes = UINT64_MAX, pages = 0;
	int failed = 0;
	for (uint64_t t = 0; t < cfg.threads; t++) {
		pthread_join(ws[t].tid, NULL);
		failed |= ws[t].failed;
		passes = ws[t].passes < passes ? ws[t].passes : passes;
		pages += ws[t].pages;
	}
	if (failed)
		return 1;
	double secs = now() - t0;
	printf("s2mmu-dirtier: ok passes=%" PRIu64 " pages=%" PRIu64 " secs=%.2f pages_per_s=%.0f\n",
	       passes, pages, secs, pages / secs);
	return 0;
}

/* The framebuffer mode: a region outside RAM through /dev/mem, written and
 * checked in passes like the anonymous memory (the memslot-move test). */
int fb_main(void)
{
	if (cfg.fb_addr % PAGE || cfg.fb_size % PAGE || cfg.fb_size == 0) {
		printf("s2mmu-dirtier: FAIL fb=%#" PRIx64 ":%#" PRIx64 " not page aligned\n", cfg.fb_addr,
		       cfg.fb_size);
		return 2;
	}
	int fd = open("/dev/mem", O_RDWR | O_SYNC);
	if (fd < 0) {
		printf("s2mmu-dirtier: FAIL open /dev/mem: %s\n", strerror(errno));
		return 1;
	}
	volatile uint64_t *fb = mmap(NULL, cfg.fb_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
				     cfg.fb_addr);
	if (fb == MAP_FAILED) {
		printf("s2mmu-dirtier: FAIL mmap /dev/mem at %#" PRIx64 ": %s\n", cfg.fb_addr,
		       strerror(errno));
		return 1;
	}
	uint64_t pages = cfg.fb_size / PAGE - (cfg.paced ? 1 : 0), gen, written = 0;
	volatile uint64_t *ctl = fb + pages * (PAGE / 8);
	if (cfg.paced && pages == 0) {
		printf("s2mmu-dirtier: FAIL paced needs two pages of fb\n");
		return 2;
	}
	double start = now(), next = t0 + 1;
	printf("s2mmu-dirtier: start fb=%#" PRIx64 ":%#" PRIx64 " paced=%" PRIu64 "\n", cfg.fb_addr,
	       cfg.fb_size, cfg.paced);
	for (gen = 1; cfg.paced ? gen <= cfg.paced : now() < deadline; gen++) {
		while (cfg.paced && ctl[0] < gen) {
			if (now() >= deadline) {
				printf("s2mmu-dirtier: FAIL paced: no start of pass %" PRIu64 " from the host\n",
				       gen);
				return 1;
			}
			usleep(1000);
		}
		for (uint64_t i = 0; i < pages; i++) {
			if (step(fb + i * (PAGE / 8), 0, cfg.fb_addr / PAGE + i, gen, "fb") < 0)
				return 1;
			pace(cfg.rate, start, ++written);
		}
		if (cfg.paced)
			ctl[1] = gen;
		if (now() >= next) {
			printf("s2mmu-dirtier: t=%.0fs passes=%" PRIu64 " pages=%" PRIu64 "\n", now() - t0,
			       gen, written);
			next += 1;
		}
	}
	for (uint64_t i = 0; i < pages; i++)
		for (unsigned w = 0; w < WORDS_CHECKED; w++) {
			uint64_t want = pattern(cfg.fb_addr / PAGE + i, gen - 1, w);
			if (fb[i * (PAGE / 8) + w * 8] != want) {
				fail("fb-final", 0, i, w, fb[i * (PAGE / 8) + w * 8], want);
				return 1;
			}
		}
	double secs = now() - t0;
	printf("s2mmu-dirtier: ok fb passes=%" PRIu64 " pages=%" PRIu64 " secs=%.2f pages_per_s=%.0f\n",
	       gen - 1, written, secs, written / secs);
	return 0;
}
