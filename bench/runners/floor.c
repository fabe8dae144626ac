/* The physical floor: what one parent and forked children can do over a Unix socketpair with a
 * u32 length prefix and nothing else. No codec, no ids, no allocation per message; the parent
 * walks length prefixes but never parses a payload. Every wirepool figure is divided by these.
 *
 *   floor echo   <payload> <inflight> <duration_s> <min_calls> <warmup_s> <repeats> <oneway> <lat>
 *   floor rows   <large:0|1> <n> <repeats> <every> <pause_us>
 *   floor pool   <workers> <task_us> <tasks> <repeats>
 *   floor frames <frame_bytes> <frames_per_write> <frames_total> <repeats>
 *
 * Prints one JSON object: {"values": {figure: [per repeat]}, "rss_parent_kib", "rss_child_kib",
 * "sockbuf"}. Built by bench/run.py with `cc -O2`; wrapped by floor_c.py into the runner contract.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SOCKBUF (4 << 20)
#define MAX_WORKERS 64

static int sockbuf_got = 0;
/* Parent ends of earlier socketpairs: a later child must close its inherited copies, or the
 * earlier child never sees EOF when the parent closes its end. */
static int open_parent_fds[MAX_WORKERS];
static int n_open_parent_fds = 0;

static void die(const char *what) {
  fprintf(stderr, "floor: %s: %s\n", what, strerror(errno));
  exit(2);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("write");
    }
    p += n;
    len -= (size_t)n;
  }
}

/* Returns 0 on clean EOF before any byte, 1 when `len` bytes were read. */
static int read_exact(int fd, void *buf, size_t len) {
  char *p = buf;
  size_t got = 0;
  while (got < len) {
    ssize_t n = read(fd, p + got, len - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("read");
    }
    if (n == 0) {
      if (got == 0) return 0;
      errno = EPIPE;
      die("short read");
    }
    got += (size_t)n;
  }
  return 1;
}

static uint32_t get_u32(const char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static void put_u32(char *p, uint32_t v) { memcpy(p, &v, 4); }

static void *xmalloc(size_t n) {
  void *p = malloc(n);
  if (!p) die("malloc");
  return p;
}

static long peak_rss_kib(pid_t pid) {
  char path[64], line[256];
  long kib = -1;
  if (pid == 0)
    snprintf(path, sizeof path, "/proc/self/status");
  else
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "VmHWM:", 6) == 0) kib = strtol(line + 6, NULL, 10);
  fclose(f);
  return kib;
}

static void grow_sockbuf(int fd) {
  int size = SOCKBUF;
  /* SO_*BUFFORCE ignores net.core.[rw]mem_max when we are allowed to; otherwise the plain
   * option is clamped by the kernel, and we report what we got. */
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  socklen_t len = sizeof size;
  if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, &len) == 0) sockbuf_got = size;
}

/* Fork a child running `body(fd)`; the parent keeps the other end. The child dies with us. */
static pid_t spawn(int *parent_fd, void (*body)(int, void *), void *arg) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair");
  grow_sockbuf(sv[0]);
  grow_sockbuf(sv[1]);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(sv[0]);
    for (int i = 0; i < n_open_parent_fds; i++) close(open_parent_fds[i]);
    body(sv[1], arg);
    _exit(0);
  }
  close(sv[1]);
  *parent_fd = sv[0];
  if (n_open_parent_fds < MAX_WORKERS) open_parent_fds[n_open_parent_fds++] = sv[0];
  return pid;
}

static void reap(pid_t pid, int fd) {
  close(fd);
  int status;
  waitpid(pid, &status, 0);
}

/* ------------------------------------------------------------------ output */

#define MAX_FIGS 4
#define MAX_REPEATS 64
static const char *fig_names[MAX_FIGS];
static double fig_values[MAX_FIGS][MAX_REPEATS];
static int fig_count[MAX_FIGS];
static int n_figs = 0;

static void record(const char *name, double v) {
  int i;
  for (i = 0; i < n_figs; i++)
    if (strcmp(fig_names[i], name) == 0) break;
  if (i == n_figs) {
    if (n_figs == MAX_FIGS) return;
    fig_names[n_figs++] = name;
  }
  if (fig_count[i] < MAX_REPEATS) fig_values[i][fig_count[i]++] = v;
}

static void print_result(long rss_child) {
  printf("{\"values\": {");
  for (int i = 0; i < n_figs; i++) {
    printf("%s\"%s\": [", i ? ", " : "", fig_names[i]);
    for (int j = 0; j < fig_count[i]; j++) printf("%s%.6g", j ? ", " : "", fig_values[i][j]);
    printf("]");
  }
  printf("}, \"rss_parent_kib\": %ld, \"rss_child_kib\": %ld, \"sockbuf\": %d}\n",
         peak_rss_kib(0), rss_child, sockbuf_got);
}

/* ------------------------------------------------------------------ echo / oneway */

struct echo_cfg {
  size_t payload;
  int oneway;
};

/* Reads whatever is available, answers every complete frame with one write per read. */
static void echo_child(int fd, void *arg) {
  struct echo_cfg *cfg = arg;
  size_t cap = cfg->payload + 4 > (1u << 20) ? cfg->payload + 4 : (1u << 20);
  char *rbuf = xmalloc(cap);
  char *acks = xmalloc(cap);
  size_t have = 0;
  for (;;) {
    ssize_t n = read(fd, rbuf + have, cap - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    have += (size_t)n;
    size_t pos = 0, nacks = 0;
    while (have - pos >= 4) {
      uint32_t len = get_u32(rbuf + pos);
      if (have - pos - 4 < len) break;
      if (cfg->oneway) {
        put_u32(acks + nacks, 4);
        put_u32(acks + nacks + 4, len);
        nacks += 8;
      }
      pos += 4 + (size_t)len;
    }
    if (cfg->oneway) {
      if (nacks) write_all(fd, acks, nacks);
    } else if (pos) {
      write_all(fd, rbuf, pos); /* complete frames are contiguous: echo them in place */
    }
    memmove(rbuf, rbuf + pos, have - pos);
    have -= pos;
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static double pct(uint64_t *sorted, size_t n, double q) {
  size_t rank = (size_t)(q / 100.0 * (double)n + 0.5);
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  return (double)sorted[rank - 1] / 1000.0;
}

static int mode_echo(int argc, char **argv) {
  if (argc < 10) return 1;
  struct echo_cfg cfg = {strtoull(argv[2], 0, 10), atoi(argv[8])};
  int inflight = atoi(argv[3]);
  double duration = atof(argv[4]);
  long min_calls = atol(argv[5]);
  double warmup = atof(argv[6]);
  int repeats = atoi(argv[7]);
  int want_lat = atoi(argv[9]);
  int fd;
  pid_t pid = spawn(&fd, echo_child, &cfg);

  size_t frame = cfg.payload + 4;
  size_t reply = cfg.oneway ? 8 : frame;
  char *req = xmalloc(frame * (size_t)inflight);
  for (int k = 0; k < inflight; k++) {
    put_u32(req + frame * k, (uint32_t)cfg.payload);
    for (size_t i = 0; i < cfg.payload; i++) req[frame * k + 4 + i] = (char)(i * 31 + 7);
  }
  size_t rcap = reply * (size_t)inflight + (1u << 16);
  char *rbuf = xmalloc(rcap);
  size_t lat_cap = 1 << 16, nlat = 0;
  uint64_t *lat = xmalloc(lat_cap * sizeof *lat);

  for (int rep = -1; rep < repeats; rep++) { /* rep -1 is the warm-up */
    double window = rep < 0 ? warmup : duration;
    long need = rep < 0 ? 1 : min_calls;
    uint64_t start = now_ns(), deadline = start + (uint64_t)(window * 1e9);
    long calls = 0;
    nlat = 0;
    if (inflight == 1) {
      uint64_t t = start;
      while (t < deadline || calls < need) {
        uint64_t t0 = t;
        write_all(fd, req, frame);
        if (!read_exact(fd, rbuf, reply)) die("child gone");
        t = now_ns();
        if (want_lat) {
          if (nlat == lat_cap) lat = realloc(lat, (lat_cap *= 2) * sizeof *lat);
          lat[nlat++] = t - t0;
        }
        calls++;
      }
    } else {
      /* Keep `inflight` outstanding: every read that completes k replies sends k new requests
       * in one write. Stop sending at the deadline, then drain. */
      write_all(fd, req, frame * (size_t)inflight);
      long outstanding = inflight, sent = inflight;
      size_t have = 0;
      int stopping = 0;
      while (outstanding > 0) {
        ssize_t n = read(fd, rbuf + have, rcap - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die("child gone");
        have += (size_t)n;
        size_t done = have / reply;
        memmove(rbuf, rbuf + done * reply, have - done * reply);
        have -= done * reply;
        outstanding -= (long)done;
        calls += (long)done;
        if (!stopping && now_ns() >= deadline && calls >= need) stopping = 1;
        if (!stopping && done) {
          write_all(fd, req, frame * done);
          outstanding += (long)done;
          sent += (long)done;
        }
      }
    }
    double secs = (double)(now_ns() - start) / 1e9;
    if (rep < 0) continue;
    if (cfg.payload >= (1u << 20) || cfg.oneway) {
      double dirs = cfg.oneway ? 1.0 : 2.0;
      record("mb_per_s", (double)calls * (double)cfg.payload * dirs / secs / 1e6);
    } else {
      record("calls_per_s", (double)calls / secs);
      if (want_lat && nlat) {
        qsort(lat, nlat, sizeof *lat, cmp_u64);
        record("p50_us", pct(lat, nlat, 50));
        record("p99_us", pct(lat, nlat, 99));
      }
    }
  }
  long child_kib = peak_rss_kib(pid);
  reap(pid, fd);
  print_result(child_kib);
  return 0;
}

/* ------------------------------------------------------------------ rows */

struct rows_cfg {
  int large;
};

static char *put_dec(char *p, uint32_t v) {
  char tmp[12];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (n) *p++ = tmp[--n];
  return p;
}

#define LIT(p, s) (memcpy((p), (s), sizeof(s) - 1), (p) + sizeof(s) - 1)

/* Encodes rows as JSON frames into a 256 KiB buffer and writes it whenever it fills: the child
 * holds no more than one buffer, so a slow parent is felt through the socket, not in memory. */
static void rows_child(int fd, void *arg) {
  struct rows_cfg *cfg = arg;
  static char blob[4096];
  memset(blob, 'x', sizeof blob);
  const size_t cap = 256 << 10;
  char *buf = xmalloc(cap);
  char req[8];
  while (read_exact(fd, req, 8)) {
    uint32_t n = get_u32(req + 4);
    size_t used = 0;
    for (uint32_t i = 0; i < n; i++) {
      if (cap - used < 4096 + 128) {
        write_all(fd, buf, used);
        used = 0;
      }
      char *start = buf + used, *p = start + 4;
      p = LIT(p, "{\"i\":");
      p = put_dec(p, i);
      p = LIT(p, ",\"name\":\"decl_");
      p = put_dec(p, i);
      p = LIT(p, "\",\"kind\":\"theorem\"");
      if (cfg->large) { /* 8 digits of i, then 4088 'x': distinct in every row */
        p = LIT(p, ",\"blob\":\"");
        memcpy(p, blob, sizeof blob);
        for (uint32_t v = i, d = 8; d-- > 0; v /= 10) p[d] = (char)('0' + v % 10);
        p += sizeof blob;
        *p++ = '"';
      }
      *p++ = '}';
      put_u32(start, (uint32_t)(p - start - 4));
      used = (size_t)(p - buf);
    }
    put_u32(buf + used, 0); /* end of stream */
    used += 4;
    write_all(fd, buf, used);
  }
}

static int mode_rows(int argc, char **argv) {
  if (argc < 7) return 1;
  struct rows_cfg cfg = {atoi(argv[2])};
  uint32_t n = (uint32_t)strtoul(argv[3], 0, 10);
  int repeats = atoi(argv[4]);
  long every = atol(argv[5]);
  long pause_us = atol(argv[6]);
  int fd;
  pid_t pid = spawn(&fd, rows_child, &cfg);
  const size_t cap = 1 << 20;
  char *buf = xmalloc(cap);
  struct timespec pause = {pause_us / 1000000, (pause_us % 1000000) * 1000};
  for (int rep = 0; rep < repeats; rep++) {
    uint64_t start = now_ns();
    char req[8];
    put_u32(req, 4);
    put_u32(req + 4, n);
    write_all(fd, req, 8);
    size_t have = 0;
    uint64_t rows = 0;
    int ended = 0;
    while (!ended) {
      ssize_t got = read(fd, buf + have, cap - have);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) die("child gone");
      have += (size_t)got;
      size_t pos = 0;
      while (have - pos >= 4) {
        uint32_t len = get_u32(buf + pos);
        if (have - pos - 4 < len) break;
        pos += 4 + len;
        if (len == 0) {
          ended = 1;
          break;
        }
        rows++;
        if (every > 0 && rows % (uint64_t)every == 0) nanosleep(&pause, NULL);
      }
      memmove(buf, buf + pos, have - pos);
      have -= pos;
    }
    if (rows != n) {
      fprintf(stderr, "floor: got %llu rows, expected %u\n", (unsigned long long)rows, n);
      return 3;
    }
    record("rows_per_s", (double)n / ((double)(now_ns() - start) / 1e9));
  }
  long child_kib = peak_rss_kib(pid);
  reap(pid, fd);
  print_result(child_kib);
  return 0;
}

/* ------------------------------------------------------------------ pool */

static void pool_child(int fd, void *arg) {
  (void)arg;
  char req[8];
  while (read_exact(fd, req, 8)) {
    uint64_t end = thread_cpu_ns() + (uint64_t)get_u32(req + 4) * 1000ull;
    volatile uint64_t spins = 0;
    while (thread_cpu_ns() < end) spins++;
    write_all(fd, req, 8);
  }
}

static int mode_pool(int argc, char **argv) {
  if (argc < 6) return 1;
  int workers = atoi(argv[2]);
  uint32_t task_us = (uint32_t)strtoul(argv[3], 0, 10);
  long tasks = atol(argv[4]);
  int repeats = atoi(argv[5]);
  if (workers < 1 || workers > MAX_WORKERS) return 1;
  int fds[MAX_WORKERS];
  pid_t pids[MAX_WORKERS];
  for (int w = 0; w < workers; w++) pids[w] = spawn(&fds[w], pool_child, NULL);
  char req[8];
  put_u32(req, 4);
  put_u32(req + 4, task_us);
  struct pollfd pfd[MAX_WORKERS];
  for (int rep = 0; rep < repeats; rep++) {
    uint64_t start = now_ns();
    long sent = 0, done = 0;
    int outstanding[MAX_WORKERS] = {0};
    /* Two tasks in flight per worker, so a worker never waits for the parent's round trip. */
    for (int k = 0; k < 2; k++)
      for (int w = 0; w < workers && sent < tasks; w++) {
        write_all(fds[w], req, 8);
        outstanding[w]++;
        sent++;
      }
    while (done < tasks) {
      for (int w = 0; w < workers; w++) pfd[w] = (struct pollfd){fds[w], POLLIN, 0};
      if (poll(pfd, (nfds_t)workers, -1) < 0) {
        if (errno == EINTR) continue;
        die("poll");
      }
      for (int w = 0; w < workers; w++) {
        if (!(pfd[w].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char reply[8 * 8];
        ssize_t got = read(fds[w], reply, (size_t)outstanding[w] * 8 < sizeof reply
                                              ? (size_t)outstanding[w] * 8 : sizeof reply);
        if (got <= 0) die("worker gone");
        if (got % 8) { /* a partial reply: finish it so framing stays aligned */
          if (!read_exact(fds[w], reply + got, 8 - (size_t)(got % 8))) die("worker gone");
          got += 8 - got % 8;
        }
        long k = got / 8;
        done += k;
        outstanding[w] -= (int)k;
        for (long i = 0; i < k && sent < tasks; i++) {
          write_all(fds[w], req, 8);
          outstanding[w]++;
          sent++;
        }
      }
    }
    record("tasks_per_s", (double)tasks / ((double)(now_ns() - start) / 1e9));
  }
  long child_kib = 0;
  for (int w = 0; w < workers; w++) {
    long k = peak_rss_kib(pids[w]);
    if (k > child_kib) child_kib = k;
  }
  for (int w = 0; w < workers; w++) reap(pids[w], fds[w]);
  print_result(child_kib);
  return 0;
}

/* ------------------------------------------------------------------ frames */

struct frames_cfg {
  size_t frame;
  long per_write;
};

static void frames_child(int fd, void *arg) {
  struct frames_cfg *cfg = arg;
  size_t unit = cfg->frame + 4;
  char *batch = xmalloc(unit * (size_t)cfg->per_write);
  for (long k = 0; k < cfg->per_write; k++) {
    put_u32(batch + unit * (size_t)k, (uint32_t)cfg->frame);
    memset(batch + unit * (size_t)k + 4, 'f', cfg->frame);
  }
  char req[8];
  while (read_exact(fd, req, 8)) {
    long total = (long)get_u32(req + 4);
    for (long sent = 0; sent < total; sent += cfg->per_write) {
      long k = total - sent < cfg->per_write ? total - sent : cfg->per_write;
      write_all(fd, batch, unit * (size_t)k);
    }
  }
}

static int mode_frames(int argc, char **argv) {
  if (argc < 6) return 1;
  struct frames_cfg cfg = {strtoull(argv[2], 0, 10), atol(argv[3])};
  uint32_t total = (uint32_t)strtoul(argv[4], 0, 10);
  int repeats = atoi(argv[5]);
  int fd;
  pid_t pid = spawn(&fd, frames_child, &cfg);
  const size_t cap = 1 << 20;
  char *buf = xmalloc(cap);
  for (int rep = 0; rep < repeats; rep++) {
    uint64_t start = now_ns();
    char req[8];
    put_u32(req, 4);
    put_u32(req + 4, total);
    write_all(fd, req, 8);
    size_t have = 0;
    uint32_t frames = 0;
    while (frames < total) {
      ssize_t got = read(fd, buf + have, cap - have);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) die("child gone");
      have += (size_t)got;
      size_t pos = 0;
      while (have - pos >= 4) {
        uint32_t len = get_u32(buf + pos);
        if (have - pos - 4 < len) break;
        pos += 4 + len;
        frames++;
      }
      memmove(buf, buf + pos, have - pos);
      have -= pos;
    }
    record("frames_per_s", (double)total / ((double)(now_ns() - start) / 1e9));
  }
  long child_kib = peak_rss_kib(pid);
  reap(pid, fd);
  print_result(child_kib);
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  int rc = 1;
  if (argc >= 2 && strcmp(argv[1], "echo") == 0) rc = mode_echo(argc, argv);
  else if (argc >= 2 && strcmp(argv[1], "rows") == 0) rc = mode_rows(argc, argv);
  else if (argc >= 2 && strcmp(argv[1], "pool") == 0) rc = mode_pool(argc, argv);
  else if (argc >= 2 && strcmp(argv[1], "frames") == 0) rc = mode_frames(argc, argv);
  if (rc == 1) fprintf(stderr, "usage: see the comment at the top of floor.c\n");
  return rc;
}
