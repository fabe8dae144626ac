//! The Rust pool's listener under a hostile crowd (PROTOCOL.md 21.4): garbage before TLS,
//! stalled TLS handshakes, TLS then a partial JOIN block, forged tickets and silent peers, 1,000
//! connections a round, 60 at once (below the 64 pending allowed). Each is refused within its bound, at most
//! `max_pending_joins` are ever pending, and this process's descriptors and memory are the same
//! after each round; more connections than that at once are closed as soon as they are
//! accepted; refusals are logged at most 10 lines a second, the rest counted.
//!
//! One test in its own binary: it counts this process's descriptors, which no other test may
//! open meanwhile.

#![cfg(feature = "remote")]

mod remote_support;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use remote_support::{client_config, error_message, timed, until_closed};
use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use wirepool::remote::{Listener, ListenerOptions};

const JOIN_TIMEOUT: Duration = Duration::from_secs(1);

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Garbage,
    SlowTls,
    PartialJoin,
    Forged,
    Silent,
}

const KINDS: [Kind; 5] = [
    Kind::Garbage,
    Kind::SlowTls,
    Kind::PartialJoin,
    Kind::Forged,
    Kind::Silent,
];

/// One hostile peer: what it does, then how long until the listener closed on it, and what the
/// listener answered.
async fn hostile(addr: SocketAddr, kind: Kind) -> (Duration, Vec<u8>) {
    timed(async {
        let Ok(mut tcp) = TcpStream::connect(addr).await else {
            return Vec::new();
        };
        match kind {
            Kind::Garbage => {
                let _ = tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
                until_closed(tcp).await
            }
            Kind::SlowTls => {
                // A TLS record header announcing 200 bytes of ClientHello, and 4 of them.
                let _ = tcp
                    .write_all(&[0x16, 0x03, 0x01, 0x00, 0xc8, 0x01, 0x00, 0x00])
                    .await;
                until_closed(tcp).await
            }
            Kind::Silent => until_closed(tcp).await,
            Kind::PartialJoin | Kind::Forged => {
                let connector = tokio_rustls::TlsConnector::from(client_config(true));
                let name = ServerName::try_from("localhost").unwrap();
                let Ok(mut tls) = connector.connect(name, tcp).await else {
                    return Vec::new();
                };
                let mut block = [0u8; 64];
                block[..8].copy_from_slice(b"WIREJOIN");
                block[8] = 1;
                for (i, b) in block[16..].iter_mut().enumerate() {
                    *b = (i as u8).wrapping_mul(97).wrapping_add(13);
                }
                let sent = if kind == Kind::Forged { 64 } else { 20 };
                let _ = tls.write_all(&block[..sent]).await;
                let _ = tls.flush().await;
                until_closed(tls).await
            }
        }
    })
    .await
}

/// Captures the `wirepool::remote` log lines.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn a_hostile_crowd_is_refused_within_bounds_and_leaves_nothing_behind() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("wirepool::remote=warn")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // A current-thread runtime: the listener's tasks log on this thread.
    let _logging = tracing::subscriber::set_default(subscriber);
    tokio::time::timeout(Duration::from_secs(120), crowd(&lines))
        .await
        .expect("the test's time bound");
}

async fn crowd(lines: &Lines) {
    let listener = Listener::start(
        ListenerOptions::default()
            .join_timeout(JOIN_TIMEOUT)
            .hello_timeout(JOIN_TIMEOUT * 2),
    )
    .await
    .unwrap();
    let addr = listener.local_addr();
    // Warm-up: the first TLS handshakes, the runtime's first tasks.
    for kind in KINDS {
        hostile(addr, kind).await;
    }
    let settle = |listener: &Listener| {
        let listener = listener.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while listener.stats().pending > 0 {
                assert!(Instant::now() < deadline, "{:?}", listener.stats());
                tokio::time::sleep(Duration::from_millis(10)).await; // polling, bounded
            }
        }
    };
    settle(&listener).await;
    let fds_before = fds();
    // Fewer at once than max_pending_joins, so that each kind meets its own refusal (with more,
    // most are closed at accept while 64 stalled ones wait out their bound: checked at the end).
    let gate = Arc::new(Semaphore::new(60));
    let mut after = Vec::new();
    for round in 0..3 {
        let started = Instant::now();
        let tasks: Vec<_> = (0..1000)
            .map(|i| {
                let kind = KINDS[i % KINDS.len()];
                let gate = gate.clone();
                tokio::spawn(async move {
                    let _permit = gate.acquire().await.unwrap();
                    (kind, hostile(addr, kind).await)
                })
            })
            .collect();
        let mut worst = std::collections::BTreeMap::<Kind, Duration>::new();
        let mut answered = 0;
        for t in tasks {
            let (kind, (elapsed, answer)) = t.await.unwrap();
            // Refused within the join bound (plus a loaded machine's slack), every kind.
            assert!(
                elapsed < JOIN_TIMEOUT + Duration::from_millis(1500),
                "{kind:?} held for {elapsed:?}"
            );
            match kind {
                Kind::Forged => {
                    if error_message(&answer).map(|(_, m)| m).as_deref() == Some("join refused") {
                        answered += 1;
                    }
                }
                // Nothing, or (garbage in place of a ClientHello) rustls's alert record.
                Kind::Garbage => assert!(
                    answer.is_empty() || (answer[0] == 21 && answer.len() <= 7),
                    "{answer:?}"
                ),
                _ => assert!(answer.is_empty(), "{kind:?} was answered {answer:?}"),
            }
            let w = worst.entry(kind).or_default();
            *w = (*w).max(elapsed);
        }
        assert_eq!(
            answered,
            200,
            "forged tickets answered: {:?}",
            listener.stats()
        );
        settle(&listener).await;
        let stats = listener.stats();
        assert!(stats.peak_pending <= 64, "{stats:?}");
        after.push((fds(), rss_kib()));
        eprintln!(
            "round {round}: {:?}, worst {worst:?}, fds {fds_before} -> {}, rss {} KiB, {stats:?}",
            started.elapsed(),
            fds(),
            rss_kib()
        );
    }
    // Nothing is kept per connection: the same descriptors after every round, and memory flat
    // from the first round on (the first grows the runtime's and allocator's pools).
    for (fds_after, _) in &after {
        assert_eq!(*fds_after, fds_before, "{after:?}");
    }
    let growth = after[2].1.saturating_sub(after[0].1);
    assert!(
        growth < 8 * 1024,
        "RSS grew by {growth} KiB over two rounds: {after:?}"
    );
    let stats = listener.stats();
    assert_eq!(stats.joined, 0);
    assert_eq!(stats.refused, stats.accepted, "{stats:?}");
    for cause in ["tls handshake failed", "join timeout", "unknown ticket"] {
        assert!(
            stats.refused_by_cause.get(cause).copied().unwrap_or(0) >= 600,
            "{cause}: {stats:?}"
        );
    }

    // At most 10 lines a second, the rest counted (the first round's second is long over: a
    // burst of 40 garbage connections now).
    tokio::time::sleep(Duration::from_millis(1100)).await; // a new log window, on purpose
    let logged_before = lines.text().lines().count();
    let burst: Vec<_> = (0..40)
        .map(|_| tokio::spawn(hostile(addr, Kind::Garbage)))
        .collect();
    for t in burst {
        t.await.unwrap();
    }
    let text = lines.text();
    let burst_lines: Vec<&str> = text.lines().skip(logged_before).collect();
    let refusals = burst_lines
        .iter()
        .filter(|l| l.contains("refused: "))
        .count();
    assert!(
        refusals <= 11,
        "{refusals} lines for one burst: {burst_lines:?}"
    );
    // Each names the peer (the count of an earlier second's unlogged ones may come first).
    assert!(burst_lines
        .iter()
        .filter(|l| l.contains("refused: "))
        .all(|l| l.contains("join from 127.0.0.1:")));
    assert!(refusals >= 1, "{burst_lines:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await; // the next window, on purpose
    hostile(addr, Kind::Garbage).await;
    let text = lines.text();
    assert!(
        text.lines()
            .skip(logged_before)
            .any(|l| l.contains("more joins refused in the last second")),
        "no count of the lines not logged: {text}"
    );

    // More than max_pending_joins at once: the rest are closed as soon as they are accepted.
    let small = Listener::start(
        ListenerOptions::default()
            .join_timeout(JOIN_TIMEOUT)
            .max_pending_joins(8),
    )
    .await
    .unwrap();
    let addr = small.local_addr();
    let silent: Vec<_> = (0..40)
        .map(|_| tokio::spawn(hostile(addr, Kind::Silent)))
        .collect();
    let mut quick = 0;
    for t in silent {
        let (elapsed, _) = t.await.unwrap();
        quick += usize::from(elapsed < JOIN_TIMEOUT / 2);
    }
    let stats = small.stats();
    assert!(stats.peak_pending <= 8, "{stats:?}");
    let too_many = stats
        .refused_by_cause
        .get("too many pending")
        .copied()
        .unwrap_or(0);
    assert!(
        too_many >= 32 && quick as u64 >= too_many,
        "{quick} quick, {stats:?}"
    );
}
