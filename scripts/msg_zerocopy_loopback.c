// The MSG_ZEROCOPY experiment: plain TCP over loopback, 1 GiB in
// 128 KiB send()s, with or without MSG_ZEROCOPY (SO_ZEROCOPY set,
// completions reaped from the error queue; a buffer of the ring of 64 is
// reused only after its completion). Prints MiB/s, the sender's and the
// receiver's CPU ns per 4 KiB page, and how many completions said
// SO_EE_CODE_ZEROCOPY_COPIED (the kernel copied after all: on loopback it
// always does, see Documentation/networking/msg_zerocopy.rst, "Loopback").
//   gcc -O2 -o /tmp/zc scripts/msg_zerocopy_loopback.c
//   /tmp/zc 0   # copying send()
//   /tmp/zc 1   # MSG_ZEROCOPY
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
#define CHUNK (128 << 10)
#define NBUF 64
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static long copied, completions;
static unsigned reap(int fd, int block) {
  unsigned done = 0;
  for (;;) {
    char ctl[128]; struct msghdr m = {0}; m.msg_control = ctl; m.msg_controllen = sizeof ctl;
    if (block) { struct pollfd p = {fd, 0, 0}; poll(&p, 1, 1000); }
    if (recvmsg(fd, &m, MSG_ERRQUEUE) < 0) { if (errno == EAGAIN) return done; perror("errqueue"); exit(1); }
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    struct sock_extended_err *e = (void *)CMSG_DATA(c);
    if (e->ee_origin != SO_EE_ORIGIN_ZEROCOPY) { fprintf(stderr, "origin\n"); exit(1); }
    done += e->ee_data - e->ee_info + 1; completions++;
    if (e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) copied++;
    block = 0;
  }
}
int main(int argc, char **argv) {
  int zc = argc > 1 && atoi(argv[1]);
  long total = 1L << 30;
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  bind(l, (void *)&a, sizeof a); listen(l, 1); getsockname(l, (void *)&a, &al);
  pid_t pid = fork();
  if (pid == 0) {
    int s = accept(l, 0, 0); char *b = malloc(CHUNK); long got = 0; ssize_t n;
    while ((n = read(s, b, CHUNK)) > 0) got += n;
    if (got != total) { fprintf(stderr, "got %ld\n", got); _exit(1); }
    _exit(0);
  }
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(s, (void *)&a, sizeof a)) { perror("connect"); return 1; }
  int one = 1;
  if (zc && setsockopt(s, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one)) { perror("SO_ZEROCOPY"); return 1; }
  char *bufs = aligned_alloc(4096, (size_t)CHUNK * NBUF);
  memset(bufs, 0x5a, (size_t)CHUNK * NBUF);
  struct rusage r0, r1; getrusage(RUSAGE_SELF, &r0);
  double t0 = now();
  unsigned sent_calls = 0, completed = 0;
  for (long off = 0; off < total; off += CHUNK) {
    if (zc) while (sent_calls - completed >= NBUF) completed += reap(s, 1);
    char *b = bufs + (size_t)(sent_calls % NBUF) * CHUNK;
    size_t left = CHUNK; 
    while (left) {
      ssize_t n = send(s, b + CHUNK - left, left, zc ? MSG_ZEROCOPY : 0);
      if (n < 0) { if (errno == ENOBUFS) { completed += reap(s, 1); continue; } perror("send"); return 1; }
      left -= n;
      if (zc && left) sent_calls++; // each successful call has a completion id
    }
    sent_calls++;
    if (zc) completed += reap(s, 0);
  }
  if (zc) while (completed < sent_calls) completed += reap(s, 1);
  shutdown(s, SHUT_WR);
  int st; waitpid(pid, &st, 0);
  double t = now() - t0;
  getrusage(RUSAGE_SELF, &r1);
  struct rusage rc; getrusage(RUSAGE_CHILDREN, &rc);
  double ccpu = rc.ru_utime.tv_sec + rc.ru_stime.tv_sec + (rc.ru_utime.tv_usec + rc.ru_stime.tv_usec) * 1e-6;
  double cpu = (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) + (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) * 1e-6;
  printf("%s: %.0f MiB/s, sender CPU %.0f ns/page, receiver CPU %.0f ns/page, completions %ld (copied %ld), receiver exit %d\n", zc ? "MSG_ZEROCOPY" : "copy", total / t / 1048576, cpu * 1e9 / (total / 4096), ccpu * 1e9 / (total / 4096), completions, copied, WEXITSTATUS(st));
  return 0;
}
