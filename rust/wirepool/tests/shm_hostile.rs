//! A hostile worker on the shared-memory lane (PROTOCOL.md 20.5): every descriptor or body past
//! the rules is a typed protocol violation that ends the request (`SHM_BAD_REGION` 123,
//! `SHM_BAD_DESCRIPTOR` 124, `SHM_BOUNDS` 125), never a SIGBUS in the parent, and leaves none of
//! the hostile memory files open or mapped here; a region it tries to shrink after sending it
//! cannot shrink (its seals), so the parent reads the whole body.

mod common;

use std::time::Duration;

use common::{bounded, python};
use wirepool::Error;

/// A fake worker that offers the lane, takes the WELCOME, and on its first REQUEST does `ATTACK`
/// (argv[1]); its memory files are named `hostile`.
const FAKE: &str = r#"
import fcntl, os, socket, struct, sys, time
fd = int(os.environ['WIREPOOL_FD'])
sock = socket.socket(fileno=fd)
def str16(s): b = s.encode(); return struct.pack('<H', len(b)) + b
hello = b'WIREPOOL' + struct.pack('<HHIII', 1, 1, os.getpid(), 8, 1 << 20) + str16('py-fake') + str16('0')
hello += struct.pack('<H', 1) + struct.pack('<BBB', 1, 1, 0) + str16('echo_raw')
hello += struct.pack('<HHQ', 1, 8, 1 << 30)  # the shm offer
sock.sendall(struct.pack('<IBBHQ', len(hello), 0x01, 0, 0, 0) + hello)
def read_exact(n):
    b = b''
    while len(b) < n:
        c = sock.recv(n - len(b))
        if not c: sys.exit(0)
        b += c
    return b
SHRINK, GROW = fcntl.F_SEAL_SHRINK, fcntl.F_SEAL_GROW
def memfd(size, seals=SHRINK | GROW, fill=b''):
    m = os.memfd_create('hostile', os.MFD_ALLOW_SEALING)
    os.ftruncate(m, size)
    os.pwrite(m, fill, 0)
    if seals: fcntl.fcntl(m, fcntl.F_ADD_SEALS, seals)
    return m
def region(rid, size, fd=None):
    frame = struct.pack('<IBBHQ', 16, 0x50, 0, 0, 0) + struct.pack('<IIQ', rid, 0, size)
    if fd is None: sock.sendall(frame)
    else: socket.send_fds(sock, [frame], [fd])
def body(rid, offset, length, req):
    # RESULT with MORE and no byte (its prefix is empty), then SHM_BODY: the body is in region rid.
    sock.sendall(struct.pack('<IBBHQ', 0, 0x12, 1, 0, req) +
                 struct.pack('<IBBHQ', 24, 0x7e, 0, 0, req) + struct.pack('<IIQQ', rid, 0, offset, length))
attack = sys.argv[1]
while True:
    length, ftype, _flags, _res, req = struct.unpack('<IBBHQ', read_exact(16))
    read_exact(length)
    if ftype != 0x10:
        continue
    if attack == 'nine':  # more descriptors than one read may carry (MSG_CTRUNC)
        socket.send_fds(sock, [b'\0'], [memfd(4096) for _ in range(9)])
    elif attack == 'short_file':  # a region announced at 1 MiB whose file has 4096 bytes
        region(1, 1 << 20, memfd(4096))
    elif attack == 'unsealed':  # its owner could truncate it under the mapping
        region(1, 4096, memfd(4096, seals=0))
    elif attack in ('grow_only', 'shrink_only'):  # half sealed; grow_only then shrinks it
        m = memfd(4096, seals=GROW if attack == 'grow_only' else SHRINK)
        region(1, 4096, m)
        time.sleep(0.2)  # long after a parent that took it would have mapped it
        if attack == 'grow_only': os.ftruncate(m, 0)
        body(1, 0, 4096, req)
    elif attack == 'pipe':  # not a memory file
        r, w = os.pipe()
        region(1, 4096, r)
    elif attack == 'no_descriptor':
        region(1, 4096)
    elif attack == 'above_window':  # 2 GiB announced, the window (max_message_size) is 1 GiB
        region(1, 2 << 30, memfd(4096))
    elif attack == 'zero_size':
        region(1, 0, memfd(4096))
    elif attack in ('past_end', 'offset_overflow', 'not_live', 'empty'):
        region(1, 4096, memfd(4096))
        rid, offset, n = {'past_end': (1, 0, 8192), 'offset_overflow': (1, (1 << 64) - 8, 16),
                          'not_live': (7, 0, 16), 'empty': (1, 0, 0)}[attack]
        body(rid, offset, n, req)
    elif attack == 'shrink_after':  # properly sealed: the shrink fails, the body stays whole
        m = memfd(4096, fill=b'A' * 4096)
        region(1, 4096, m)
        try: os.ftruncate(m, 0)
        except PermissionError: pass
        body(1, 0, 4096, req)
    time.sleep(30)
"#;

/// This process's descriptors and mappings of the fake worker's memory files.
fn hostile_footprint() -> (usize, usize) {
    let fds = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:hostile"))
        })
        .count();
    let maps = std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("/memfd:hostile"))
        .count();
    (fds, maps)
}

async fn hostile_pool(attack: &str) -> wirepool::Pool {
    wirepool::Pool::builder(python(FAKE).arg(attack))
        .workers(1)
        .heartbeat(Duration::ZERO)
        .drain_grace(Duration::from_millis(200))
        .start()
        .await
        .unwrap()
}

// One test: the footprint counts are of the whole process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_and_bodies_past_the_rules_are_typed_violations_not_a_crash() {
    let attacks = [
        ("nine", 124),
        ("short_file", 124),
        ("unsealed", 124),
        ("grow_only", 124),
        ("shrink_only", 124),
        ("pipe", 124),
        ("no_descriptor", 124),
        ("above_window", 123),
        ("zero_size", 123),
        ("past_end", 125),
        ("offset_overflow", 125),
        ("not_live", 125),
        ("empty", 125),
    ];
    for (attack, code) in attacks {
        bounded(30, async {
            let pool = hostile_pool(attack).await;
            let e = pool
                .call_raw("echo_raw", bytes::Bytes::from_static(b"x"))
                .await
                .unwrap_err();
            assert!(
                matches!(e, Error::ProtocolViolation { code: c, .. } if c == code),
                "{attack}: code {code} expected, got {e:?}"
            );
            pool.shutdown().await;
        })
        .await;
        assert_eq!(
            hostile_footprint(),
            (0, 0),
            "{attack}: a hostile memory file is still open or mapped"
        );
    }
    // A sealed region cannot shrink: the whole body is read, no SIGBUS.
    bounded(30, async {
        let pool = hostile_pool("shrink_after").await;
        let body = pool
            .call_raw("echo_raw", bytes::Bytes::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!(hostile_footprint().1, 1, "the body is a view of the region");
        assert!(body.len() == 4096 && body.iter().all(|&b| b == b'A'));
        drop(body);
        pool.shutdown().await;
    })
    .await;
    assert_eq!(hostile_footprint(), (0, 0), "shrink_after: still mapped");
}
