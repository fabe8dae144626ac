//! A hostile worker on the shared-memory lane (PROTOCOL.md 20.5): more descriptors than one
//! read may carry, or a region announced larger than its memory file, is a typed protocol
//! violation (`SHM_BAD_DESCRIPTOR`, 124) that ends the request, never a SIGBUS in the parent.

mod common;

use std::time::Duration;

use common::{bounded, python};
use wirepool::Error;

/// A fake worker that offers the lane, takes the WELCOME, and on its first REQUEST does `ATTACK`.
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
def memfd(size):
    m = os.memfd_create('hostile', os.MFD_ALLOW_SEALING)
    os.ftruncate(m, size)
    fcntl.fcntl(m, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return m
while True:
    length, ftype = struct.unpack('<IB', read_exact(16)[:5])
    read_exact(length)
    if ftype == 0x10:
        if sys.argv[1] == 'nine':
            socket.send_fds(sock, [b'\0'], [memfd(4096) for _ in range(9)])
        else:  # a region announced at 1 MiB whose file has 4096 bytes
            region = struct.pack('<IIQ', 1, 0, 1 << 20)
            socket.send_fds(sock, [struct.pack('<IBBHQ', 16, 0x50, 0, 0, 0) + region], [memfd(4096)])
        time.sleep(30)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_past_the_rules_are_shm_bad_descriptor_not_a_crash() {
    for attack in ["nine", "short_file"] {
        bounded(30, async {
            let pool = wirepool::Pool::builder(python(FAKE).arg(attack))
                .workers(1)
                .heartbeat(Duration::ZERO)
                .drain_grace(Duration::from_millis(200))
                .start()
                .await
                .unwrap();
            let e = pool
                .call_raw("echo_raw", bytes::Bytes::from_static(b"x"))
                .await
                .unwrap_err();
            assert!(
                matches!(e, Error::ProtocolViolation { code: 124, .. }),
                "{attack}: SHM_BAD_DESCRIPTOR expected, got {e:?}"
            );
            pool.shutdown().await;
        })
        .await;
    }
}
