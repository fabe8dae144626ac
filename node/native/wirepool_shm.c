// wirepool's optional native part for the shared-memory lane (PROTOCOL.md section 20), Linux
// only: what Node cannot do in JavaScript. Sealed memory files (memfd_create + F_ADD_SEALS), the
// receiver's descriptor checks (F_GET_SEALS, fstatfs, fstat), recvmsg/sendmsg with SCM_RIGHTS
// (room for 8 descriptors, MSG_CTRUNC reported), a readiness watch on the socket (uv_poll on a
// duplicate of its descriptor), and read-only mappings copied out by memcpy (the bench's other
// data path). Node-API only (ABI-stable across Node versions). Every function validates its
// arguments and reports failures as negative errno or a thrown Error; nothing here aborts.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <node_api.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <uv.h>

#define MAX_FDS 8

#define CHECK(call)                                                  \
  do {                                                               \
    if ((call) != napi_ok) {                                         \
      napi_throw_error(env, NULL, "wirepool_shm: " #call " failed"); \
      return NULL;                                                   \
    }                                                                \
  } while (0)

static napi_value num(napi_env env, double v) {
  napi_value out;
  if (napi_create_double(env, v, &out) != napi_ok) return NULL;
  return out;
}

static int get_int(napi_env env, napi_value v, int64_t *out) {
  return napi_get_value_int64(env, v, out) == napi_ok ? 0 : -1;
}

static napi_value throw_errno(napi_env env, const char *what, int err) {
  char msg[160];
  snprintf(msg, sizeof msg, "%s: %s", what, strerror(err));
  napi_throw_error(env, NULL, msg);
  return NULL;
}

// memfd(size) -> fd: a memory file of `size` bytes sealed against shrinking, growing and more
// seals (20.5), close-on-exec.
static napi_value js_memfd(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  int64_t size;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 1 || get_int(env, argv[0], &size) || size < 1) {
    napi_throw_range_error(env, NULL, "memfd(size): size must be a positive integer");
    return NULL;
  }
  int fd = memfd_create("wirepool-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return throw_errno(env, "memfd_create", errno);
  if (ftruncate(fd, (off_t)size) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int err = errno;
    close(fd);
    return throw_errno(env, "memfd ftruncate/F_ADD_SEALS", err);
  }
  return num(env, fd);
}

// checkRegion(fd, size) -> null | reason: the receiver's checks of a SHM_REGION's descriptor,
// before anything is mapped (20.5): sealed against shrinking and growing, on tmpfs, of `size`.
static napi_value js_check_region(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  int64_t fd, size;
  char reason[200];
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 2 || get_int(env, argv[0], &fd) || get_int(env, argv[1], &size) || fd < 0) {
    napi_throw_type_error(env, NULL, "checkRegion(fd, size)");
    return NULL;
  }
  int seals = fcntl((int)fd, F_GET_SEALS);
  struct statfs fs;
  struct stat st;
  if (seals < 0) {
    snprintf(reason, sizeof reason, "not a sealable memory file (F_GET_SEALS: %s)", strerror(errno));
  } else if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    snprintf(reason, sizeof reason, "the memory file is not sealed against shrinking and growing (seals 0x%x)", seals);
  } else if (fstatfs((int)fd, &fs) != 0) {
    snprintf(reason, sizeof reason, "fstatfs: %s", strerror(errno));
  } else if ((unsigned long)fs.f_type != TMPFS_MAGIC) {
    snprintf(reason, sizeof reason, "the memory file is not on tmpfs (filesystem 0x%lx)", (unsigned long)fs.f_type);
  } else if (fstat((int)fd, &st) != 0) {
    snprintf(reason, sizeof reason, "fstat: %s", strerror(errno));
  } else if ((int64_t)st.st_size != size) {
    snprintf(reason, sizeof reason, "the memory file has %lld bytes, its SHM_REGION announced %lld", (long long)st.st_size,
             (long long)size);
  } else {
    napi_value nul;
    CHECK(napi_get_null(env, &nul));
    return nul;
  }
  napi_value out;
  CHECK(napi_create_string_utf8(env, reason, NAPI_AUTO_LENGTH, &out));
  return out;
}

static int get_bytes(napi_env env, napi_value v, uint8_t **data, size_t *len) {
  napi_typedarray_type t;
  size_t length, offset;
  napi_value ab;
  void *base;
  if (napi_get_typedarray_info(env, v, &t, &length, &base, &ab, &offset) != napi_ok || t != napi_uint8_array) return -1;
  *data = base;
  *len = length;
  return 0;
}

// recvmsg(fd, buf: Uint8Array, out: Int32Array(10)) -> bytes read (0: end of file) or -errno.
// out[0] = descriptors received (close-on-exec, the caller's), out[1..8] = them, out[9] = 1 when
// MSG_CTRUNC (more than 8 in one read: the ones that arrived are closed here, none reported).
static napi_value js_recvmsg(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  int64_t fd;
  uint8_t *buf;
  size_t len;
  napi_typedarray_type t;
  size_t olen, ooff;
  napi_value oab;
  void *obase;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 3 || get_int(env, argv[0], &fd) || fd < 0 || get_bytes(env, argv[1], &buf, &len) ||
      napi_get_typedarray_info(env, argv[2], &t, &olen, &obase, &oab, &ooff) != napi_ok || t != napi_int32_array ||
      olen < 2 + MAX_FDS) {
    napi_throw_type_error(env, NULL, "recvmsg(fd, Uint8Array, Int32Array(10))");
    return NULL;
  }
  int32_t *out = obase;
  union {
    char buf[CMSG_SPACE(MAX_FDS * sizeof(int))];
    struct cmsghdr align;
  } control;
  struct iovec iov = {.iov_base = buf, .iov_len = len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf, .msg_controllen = sizeof control.buf};
  out[0] = 0;
  out[1 + MAX_FDS] = 0;
  ssize_t n;
  do n = recvmsg((int)fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) return num(env, -errno);
  int got = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    int fds[MAX_FDS];
    if (k > MAX_FDS) k = MAX_FDS;
    memcpy(fds, CMSG_DATA(c), k * sizeof(int));
    for (size_t i = 0; i < k; i++) {
      if (got < MAX_FDS) out[1 + got++] = fds[i];
      else close(fds[i]);
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    for (int i = 0; i < got; i++) close(out[1 + i]);
    got = 0;
    out[1 + MAX_FDS] = 1;
  }
  out[0] = got;
  return num(env, (double)n);
}

// sendmsg(fd, buf: Uint8Array, fds: number[]) -> bytes written or -errno; the descriptors (at
// most 8) travel with the first byte, so after a short write the rest goes without them.
static napi_value js_sendmsg(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  int64_t fd;
  uint8_t *buf;
  size_t len;
  uint32_t nfds = 0;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 3 || get_int(env, argv[0], &fd) || fd < 0 || get_bytes(env, argv[1], &buf, &len) ||
      napi_get_array_length(env, argv[2], &nfds) != napi_ok || nfds > MAX_FDS) {
    napi_throw_type_error(env, NULL, "sendmsg(fd, Uint8Array, fds: number[] (at most 8))");
    return NULL;
  }
  union {
    char buf[CMSG_SPACE(MAX_FDS * sizeof(int))];
    struct cmsghdr align;
  } control;
  memset(&control, 0, sizeof control);
  struct iovec iov = {.iov_base = buf, .iov_len = len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
    int fds[MAX_FDS];
    for (uint32_t i = 0; i < nfds; i++) {
      napi_value e;
      int64_t v;
      if (napi_get_element(env, argv[2], i, &e) != napi_ok || get_int(env, e, &v) || v < 0 || v > INT32_MAX) {
        napi_throw_type_error(env, NULL, "sendmsg: a descriptor is not a non-negative integer");
        return NULL;
      }
      fds[i] = (int)v;
    }
    msg.msg_control = control.buf;
    msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  ssize_t n;
  do n = sendmsg((int)fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return num(env, n < 0 ? -errno : (double)n);
}

// A readiness watch: uv_poll on a duplicate of the socket's descriptor (libuv keeps one watcher
// per descriptor number), calling back on each readable event until unwatch().
typedef struct {
  uv_poll_t poll;
  napi_env env;
  napi_ref cb;
  napi_async_context ctx;
  int fd;
  int stopped;
} watch_t;

static void on_close(uv_handle_t *h) {
  watch_t *w = (watch_t *)h;
  close(w->fd);
  free(w);
}

static void on_poll(uv_poll_t *p, int status, int events) {
  watch_t *w = (watch_t *)p;
  napi_env env = w->env;
  napi_handle_scope scope;
  if (w->stopped || napi_open_handle_scope(env, &scope) != napi_ok) return;
  napi_value cb, recv, arg, result;
  if (napi_get_reference_value(env, w->cb, &cb) == napi_ok && napi_get_global(env, &recv) == napi_ok &&
      napi_create_int32(env, status < 0 ? status : events, &arg) == napi_ok) {
    // make_callback runs the microtasks and reports a throw as an uncaught exception.
    napi_make_callback(env, w->ctx, recv, cb, 1, &arg, &result);
  }
  napi_close_handle_scope(env, scope);
}

static void watch_finalize(napi_env env, void *data, void *hint) {
  (void)env;
  (void)data;
  (void)hint;
}

// watch(fd, cb(events), ref = true) -> handle; with ref false the watch does not keep the
// event loop alive (a pool's idle connections never hold the process).
static napi_value js_watch(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  int64_t fd;
  napi_valuetype t;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 2 || get_int(env, argv[0], &fd) || fd < 0 || napi_typeof(env, argv[1], &t) != napi_ok || t != napi_function) {
    napi_throw_type_error(env, NULL, "watch(fd, callback)");
    return NULL;
  }
  uv_loop_t *loop;
  CHECK(napi_get_uv_event_loop(env, &loop));
  watch_t *w = calloc(1, sizeof *w);
  if (w == NULL) return throw_errno(env, "watch", ENOMEM);
  w->fd = fcntl((int)fd, F_DUPFD_CLOEXEC, 3);
  if (w->fd < 0) {
    int err = errno;
    free(w);
    return throw_errno(env, "watch: dup", err);
  }
  w->env = env;
  napi_value name;
  if (napi_create_reference(env, argv[1], 1, &w->cb) != napi_ok ||
      napi_create_string_utf8(env, "wirepool_shm.watch", NAPI_AUTO_LENGTH, &name) != napi_ok ||
      napi_async_init(env, NULL, name, &w->ctx) != napi_ok) {
    close(w->fd);
    free(w);
    napi_throw_error(env, NULL, "watch: napi");
    return NULL;
  }
  int r = uv_poll_init(loop, &w->poll, w->fd);
  if (r == 0) r = uv_poll_start(&w->poll, UV_READABLE | UV_DISCONNECT, on_poll);
  bool ref = true;
  if (r == 0 && argc >= 3) {
    napi_valuetype rt;
    if (napi_typeof(env, argv[2], &rt) == napi_ok && rt == napi_boolean) napi_get_value_bool(env, argv[2], &ref);
  }
  if (r == 0 && !ref) uv_unref((uv_handle_t *)&w->poll);
  if (r != 0) {
    napi_delete_reference(env, w->cb);
    napi_async_destroy(env, w->ctx);
    close(w->fd);
    free(w);
    napi_throw_error(env, NULL, uv_strerror(r));
    return NULL;
  }
  napi_value ext;
  CHECK(napi_create_external(env, w, watch_finalize, NULL, &ext));
  return ext;
}

// unwatch(handle): stops the watch and closes its duplicate descriptor (once; later calls do nothing).
static napi_value js_unwatch(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  void *data;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 1 || napi_get_value_external(env, argv[0], &data) != napi_ok) {
    napi_throw_type_error(env, NULL, "unwatch(handle)");
    return NULL;
  }
  watch_t *w = data;
  if (!w->stopped) {
    w->stopped = 1;
    uv_poll_stop(&w->poll);
    napi_delete_reference(env, w->cb);
    napi_async_destroy(env, w->ctx);
    uv_close((uv_handle_t *)&w->poll, on_close);
  }
  return NULL;
}

// A read-only mapping of a received region, only reached through copyOut (JavaScript never
// holds a view of read-only memory: a write through it would kill the process).
typedef struct {
  uint8_t *base;
  size_t size;
} mapping_t;

static void mapping_finalize(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  mapping_t *m = data;
  if (m->base != NULL) munmap(m->base, m->size);
  free(m);
}

// mapRead(fd, size) -> handle (MAP_SHARED, PROT_READ); check the descriptor first.
static napi_value js_map_read(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  int64_t fd, size;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 2 || get_int(env, argv[0], &fd) || get_int(env, argv[1], &size) || fd < 0 || size < 1) {
    napi_throw_type_error(env, NULL, "mapRead(fd, size)");
    return NULL;
  }
  void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, (int)fd, 0);
  if (p == MAP_FAILED) return throw_errno(env, "mmap", errno);
  mapping_t *m = malloc(sizeof *m);
  if (m == NULL) {
    munmap(p, (size_t)size);
    return throw_errno(env, "mapRead", ENOMEM);
  }
  m->base = p;
  m->size = (size_t)size;
  napi_value ext;
  CHECK(napi_create_external(env, m, mapping_finalize, NULL, &ext));
  return ext;
}

// copyOut(handle, offset, target: Uint8Array) -> copies target.length bytes from offset; a range
// past the mapping or an unmapped handle throws a RangeError (never a read outside it).
static napi_value js_copy_out(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  void *data;
  int64_t off;
  uint8_t *buf;
  size_t len;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 3 || napi_get_value_external(env, argv[0], &data) != napi_ok || get_int(env, argv[1], &off) ||
      get_bytes(env, argv[2], &buf, &len)) {
    napi_throw_type_error(env, NULL, "copyOut(handle, offset, Uint8Array)");
    return NULL;
  }
  mapping_t *m = data;
  if (m->base == NULL || off < 0 || (uint64_t)off > m->size || len > m->size - (size_t)off) {
    napi_throw_range_error(env, NULL, "copyOut: a range outside the mapping");
    return NULL;
  }
  memcpy(buf, m->base + off, len);
  return NULL;
}

// unmap(handle): unmaps now (later copyOut calls throw).
static napi_value js_unmap(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  void *data;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 1 || napi_get_value_external(env, argv[0], &data) != napi_ok) {
    napi_throw_type_error(env, NULL, "unmap(handle)");
    return NULL;
  }
  mapping_t *m = data;
  if (m->base != NULL) munmap(m->base, m->size);
  m->base = NULL;
  return NULL;
}


// A writable mapping of a region this process owns (MAP_SHARED), only reached through copyIn,
// so unmap() (at the region's retirement) is never a use after free.
// mapWrite(fd, size) -> handle
static napi_value js_map_write(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  int64_t fd, size;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 2 || get_int(env, argv[0], &fd) || get_int(env, argv[1], &size) || fd < 0 || size < 1) {
    napi_throw_type_error(env, NULL, "mapWrite(fd, size)");
    return NULL;
  }
  void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
  if (p == MAP_FAILED) return throw_errno(env, "mmap", errno);
  mapping_t *m = malloc(sizeof *m);
  if (m == NULL) {
    munmap(p, (size_t)size);
    return throw_errno(env, "mapWrite", ENOMEM);
  }
  m->base = p;
  m->size = (size_t)size;
  napi_value ext;
  CHECK(napi_create_external(env, m, mapping_finalize, NULL, &ext));
  return ext;
}

// copyIn(handle, offset, source: Uint8Array): source into the mapping at offset (bounds checked).
static napi_value js_copy_in(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  void *data;
  int64_t off;
  uint8_t *buf;
  size_t len;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 3 || napi_get_value_external(env, argv[0], &data) != napi_ok || get_int(env, argv[1], &off) ||
      get_bytes(env, argv[2], &buf, &len)) {
    napi_throw_type_error(env, NULL, "copyIn(handle, offset, Uint8Array)");
    return NULL;
  }
  mapping_t *m = data;
  if (m->base == NULL || off < 0 || (uint64_t)off > m->size || len > m->size - (size_t)off) {
    napi_throw_range_error(env, NULL, "copyIn: a range outside the mapping");
    return NULL;
  }
  memcpy(m->base + off, buf, len);
  return NULL;
}

// A zero-copy view of a lent range: its own private mapping (MAP_PRIVATE, read and write: a
// write by the application copies that page for it and never reaches the owner or faults), as
// an ArrayBuffer unmapped when it is collected. The seals make every page of it readable for as
// long as it lives (no SIGBUS: the file cannot shrink).
typedef struct {
  void *base;
  size_t len;
} view_t;

static void view_finalize(napi_env env, void *data, void *hint) {
  (void)env;
  (void)data;
  view_t *v = hint;
  munmap(v->base, v->len);
  free(v);
}

// mapView(fd, offset, length) -> ArrayBuffer of exactly length bytes
static napi_value js_map_view(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  int64_t fd, off, len;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 3 || get_int(env, argv[0], &fd) || get_int(env, argv[1], &off) || get_int(env, argv[2], &len) || fd < 0 ||
      off < 0 || len < 1) {
    napi_throw_type_error(env, NULL, "mapView(fd, offset, length)");
    return NULL;
  }
  long page = sysconf(_SC_PAGESIZE);
  int64_t start = off - off % page;
  size_t maplen = (size_t)(off - start + len);
  void *p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE, (int)fd, (off_t)start);
  if (p == MAP_FAILED) return throw_errno(env, "mmap", errno);
  view_t *v = malloc(sizeof *v);
  if (v == NULL) {
    munmap(p, maplen);
    return throw_errno(env, "mapView", ENOMEM);
  }
  v->base = p;
  v->len = maplen;
  napi_value ab;
  if (napi_create_external_arraybuffer(env, (uint8_t *)p + (off - start), (size_t)len, view_finalize, v, &ab) != napi_ok) {
    munmap(p, maplen);
    free(v);
    napi_throw_error(env, NULL, "mapView: napi_create_external_arraybuffer");
    return NULL;
  }
  int64_t adjusted;
  napi_adjust_external_memory(env, 0, &adjusted);
  return ab;
}


// socketpair() -> [a, b]: a Unix stream socketpair, close-on-exec (a child gets one end as a
// stdio entry, which libuv dup2s without the flag): a parent that reads its end with recvmsg
// owns it, so libuv never reads it (a plain read would drop the descriptors).
static napi_value js_socketpair(napi_env env, napi_callback_info info) {
  (void)info;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return throw_errno(env, "socketpair", errno);
  napi_value arr;
  CHECK(napi_create_array_with_length(env, 2, &arr));
  CHECK(napi_set_element(env, arr, 0, num(env, sv[0])));
  CHECK(napi_set_element(env, arr, 1, num(env, sv[1])));
  return arr;
}

// closeFd(fd) -> 0 or -errno (fs.closeSync would do too; this one never throws).
static napi_value js_close(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  int64_t fd;
  CHECK(napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  if (argc < 1 || get_int(env, argv[0], &fd) || fd < 0) return num(env, -EBADF);
  return num(env, close((int)fd) == 0 ? 0 : -errno);
}

NAPI_MODULE_INIT() {
  napi_property_descriptor props[] = {
      {"memfd", NULL, js_memfd, NULL, NULL, NULL, napi_enumerable, NULL},
      {"checkRegion", NULL, js_check_region, NULL, NULL, NULL, napi_enumerable, NULL},
      {"recvmsg", NULL, js_recvmsg, NULL, NULL, NULL, napi_enumerable, NULL},
      {"sendmsg", NULL, js_sendmsg, NULL, NULL, NULL, napi_enumerable, NULL},
      {"watch", NULL, js_watch, NULL, NULL, NULL, napi_enumerable, NULL},
      {"unwatch", NULL, js_unwatch, NULL, NULL, NULL, napi_enumerable, NULL},
      {"mapRead", NULL, js_map_read, NULL, NULL, NULL, napi_enumerable, NULL},
      {"copyOut", NULL, js_copy_out, NULL, NULL, NULL, napi_enumerable, NULL},
      {"unmap", NULL, js_unmap, NULL, NULL, NULL, napi_enumerable, NULL},
      {"mapWrite", NULL, js_map_write, NULL, NULL, NULL, napi_enumerable, NULL},
      {"copyIn", NULL, js_copy_in, NULL, NULL, NULL, napi_enumerable, NULL},
      {"mapView", NULL, js_map_view, NULL, NULL, NULL, napi_enumerable, NULL},
      {"socketpair", NULL, js_socketpair, NULL, NULL, NULL, napi_enumerable, NULL},
      {"closeFd", NULL, js_close, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  if (napi_define_properties(env, exports, sizeof props / sizeof props[0], props) != napi_ok) return NULL;
  return exports;
}
