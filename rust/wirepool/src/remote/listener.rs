//! The pool's listener (PROTOCOL.md 21.3, 21.4): TLS 1.3 with the pool's own certificate, the
//! JOIN block checked before anything else is read, and every unauthenticated connection held
//! within fixed bounds of time, bytes and count, whatever its peer does.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch, Notify};
use wirepool_proto::{ErrorCode, Frame, FrameBody};

use super::ticket::{is_loopback, JoinBlock, Ticket, JOIN_SIZE};
use super::tls::{PoolCertificate, TlsSocket};
use super::transport::Transport;
use super::ALPN;

/// How a [`Listener`] listens and what it allows. The defaults are PROTOCOL.md 21's SDK
/// defaults (`spec/constants.json`, `remote.sdk_defaults`): TLS on 127.0.0.1 on a free port.
///
/// ```
/// use std::time::Duration;
/// use wirepool::remote::ListenerOptions;
/// let opts = ListenerOptions::default()
///     .bind("0.0.0.0:7700".parse().unwrap())
///     .advertise("pool.internal")
///     .join_timeout(Duration::from_secs(2));
/// ```
#[derive(Clone, Debug)]
pub struct ListenerOptions {
    pub(crate) bind: SocketAddr,
    pub(crate) advertise: Option<String>,
    pub(crate) tls: bool,
    pub(crate) join_timeout: Duration,
    pub(crate) hello_timeout: Duration,
    pub(crate) max_pending_joins: usize,
    pub(crate) refusal_log_per_second: u32,
    pub(crate) ticket_ttl: Duration,
}

impl Default for ListenerOptions {
    fn default() -> Self {
        ListenerOptions {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            advertise: None,
            tls: true,
            join_timeout: Duration::from_millis(5000),
            hello_timeout: Duration::from_millis(10_000),
            max_pending_joins: 64,
            refusal_log_per_second: 10,
            ticket_ttl: Duration::from_secs(86_400),
        }
    }
}

impl ListenerOptions {
    /// The address to listen on (default `127.0.0.1:0`: loopback, a free port).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }
    /// The host name or address written into tickets, as workers are to reach the listener
    /// (default: the bound address; required when binding all interfaces).
    pub fn advertise(mut self, host: impl Into<String>) -> Self {
        self.advertise = Some(host.into());
        self
    }
    /// Plain TCP without TLS: loopback only (the listener refuses to start on any other
    /// address), for tests and benchmarks (PROTOCOL.md 21.1).
    pub fn plain_tcp(mut self) -> Self {
        self.tls = false;
        self
    }
    /// From accept to the end of the TLS handshake and the 64 JOIN bytes (default 5 s).
    pub fn join_timeout(mut self, d: Duration) -> Self {
        self.join_timeout = d;
        self
    }
    /// From accept to a complete HELLO (default 10 s).
    pub fn hello_timeout(mut self, d: Duration) -> Self {
        self.hello_timeout = d;
        self
    }
    /// Connections between accept and HELLO at once; more are closed as soon as they are
    /// accepted (default 64).
    pub fn max_pending_joins(mut self, n: usize) -> Self {
        self.max_pending_joins = n.max(1);
        self
    }
    /// Refusals logged one by one per second; the rest are counted (default 10).
    pub fn refusal_log_per_second(mut self, n: u32) -> Self {
        self.refusal_log_per_second = n;
        self
    }
    /// How long the pool ticket ([`Listener::ticket`]) is valid (default 24 h).
    pub fn ticket_ttl(mut self, d: Duration) -> Self {
        self.ticket_ttl = d;
        self
    }
}

/// What a listener has seen: connections accepted, joined and refused (by cause), and how many
/// are between accept and HELLO now and at most.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListenerStats {
    /// TCP connections accepted.
    pub accepted: u64,
    /// Connections that passed the join step and went to a worker slot.
    pub joined: u64,
    /// Connections refused or timed out before their HELLO.
    pub refused: u64,
    /// Refusals by cause (`tls handshake failed`, `join timeout`, `bad magic`, ...).
    pub refused_by_cause: BTreeMap<String, u64>,
    /// Connections between accept and their hand-over to a slot, now.
    pub pending: usize,
    /// The most there ever were at once.
    pub peak_pending: usize,
}

/// The pool's listener: where remote workers connect and join with a [`Ticket`]
/// (PROTOCOL.md 21). One per pool; cheap to clone. A pool with remote workers starts one of
/// its own ([`PoolBuilder::listen`](crate::PoolBuilder::listen)), or takes one started before
/// it ([`PoolBuilder::listener`](crate::PoolBuilder::listener)), for example to hand out its
/// ticket first.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use wirepool::remote::{Listener, ListenerOptions};
/// let listener = Listener::start(ListenerOptions::default()).await?;
/// let ticket = listener.ticket(); // WIREPOOL_TICKET=<ticket.encode()> ./my_worker
/// println!("workers join {}:{} with ticket {}", ticket.host(), ticket.port(), ticket.id());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Listener {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local_addr", &self.core().local_addr)
            .field("advertise", &self.core().advertise)
            .field("tls", &self.core().certificate.is_some())
            .finish_non_exhaustive()
    }
}

/// The last handle closes the listener.
struct Handle {
    core: Arc<Core>,
    _close: watch::Sender<bool>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.core.closed.store(true, SeqCst);
    }
}

struct Core {
    opts: ListenerOptions,
    local_addr: SocketAddr,
    advertise: String,
    certificate: Option<PoolCertificate>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    state: Mutex<State>,
    /// Woken when a slot starts waiting for a worker: parked joins look again.
    slot_waiting: Notify,
    pending: AtomicUsize,
    peak_pending: AtomicUsize,
    accepted: AtomicU64,
    joined: AtomicU64,
    closed: std::sync::atomic::AtomicBool,
    log: Mutex<RefusalLog>,
    pool_ticket: Ticket,
}

#[derive(Default)]
struct State {
    tickets: HashMap<[u8; 16], Issued>,
    revoked: HashSet<[u8; 16]>,
    waiters: VecDeque<Waiter>,
    /// Connections that joined with each ticket, for `revoke(.., drop_workers)`.
    joined: HashMap<[u8; 16], Vec<Weak<Transport>>>,
    refused: u64,
    refused_by_cause: BTreeMap<String, u64>,
}

struct Issued {
    ticket: Ticket,
    single_use: bool,
}

struct Waiter {
    /// A single-use ticket's id; `None`: any worker joining with a pool ticket.
    ticket: Option<[u8; 16]>,
    tx: oneshot::Sender<Joined>,
}

/// A connection that passed the join step, handed to the slot waiting for it.
pub(crate) struct Joined {
    pub(crate) transport: Transport,
    pub(crate) peer: SocketAddr,
    pub(crate) ticket_id: [u8; 16],
    /// The HELLO is due by then (21.4).
    pub(crate) hello_deadline: Instant,
}

/// Why [`Listener::accept`] returned without a worker.
pub(crate) enum AcceptError {
    TimedOut,
    Closed,
}

/// Each refusal logged once with the peer's address, at most `per_second` lines a second; the
/// rest counted and summed up once the second is over (21.4).
struct RefusalLog {
    per_second: u32,
    window: Option<Instant>,
    lines: u32,
    suppressed: u64,
}

impl RefusalLog {
    fn refused(&mut self, peer: &SocketAddr, cause: &str, now: Instant) {
        if self
            .window
            .is_none_or(|w| now.duration_since(w) >= Duration::from_secs(1))
        {
            if self.suppressed > 0 {
                tracing::warn!(
                    target: "wirepool::remote",
                    suppressed = self.suppressed,
                    "{} more joins refused in the last second (not logged one by one)",
                    self.suppressed
                );
            }
            self.window = Some(now);
            self.lines = 0;
            self.suppressed = 0;
        }
        if self.lines < self.per_second {
            self.lines += 1;
            tracing::warn!(target: "wirepool::remote", %peer, cause, "join from {peer} refused: {cause}");
        } else {
            self.suppressed += 1;
        }
    }
}

/// The step of a join that failed, and what (if anything) the peer is told.
struct Refusal {
    cause: String,
    answer: Option<(ErrorCode, &'static str)>,
}

impl Refusal {
    fn silent(cause: impl Into<String>) -> Refusal {
        Refusal {
            cause: cause.into(),
            answer: None,
        }
    }

    fn answered(cause: impl Into<String>) -> Refusal {
        // The same answer whatever the cause: a stranger learns nothing (21.3).
        Refusal {
            cause: cause.into(),
            answer: Some((ErrorCode::BadHandshake, "join refused")),
        }
    }
}

/// The connection during the join step.
enum Joining {
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    Plain(TcpStream),
}

impl Joining {
    async fn read_block(&mut self, block: &mut [u8; JOIN_SIZE]) -> io::Result<()> {
        match self {
            Joining::Tls(s) => s.read_exact(block).await.map(drop),
            Joining::Plain(s) => s.read_exact(block).await.map(drop),
        }
    }

    /// Writes `frame`, then closes (close_notify for TLS).
    async fn answer(&mut self, frame: &[u8]) {
        let _ = match self {
            Joining::Tls(s) => {
                let _ = s.write_all(frame).await;
                s.shutdown().await
            }
            Joining::Plain(s) => {
                let _ = s.write_all(frame).await;
                s.shutdown().await
            }
        };
    }

    fn into_transport(self) -> io::Result<Transport> {
        match self {
            Joining::Tls(s) => {
                let (tcp, conn) = s.into_inner();
                let fd: std::os::fd::OwnedFd = tcp.into_std()?.into();
                Ok(Transport::Tls(Box::new(TlsSocket::new(fd, conn)?)))
            }
            Joining::Plain(s) => Transport::socket(s.into_std()?.into()),
        }
    }
}

impl Listener {
    /// Binds and starts listening: makes the pool's certificate (TLS) and its pool ticket.
    /// Must be called within a tokio runtime.
    ///
    /// Fails for plain TCP on an address that is not loopback, and when binding all interfaces
    /// without [`ListenerOptions::advertise`].
    pub async fn start(opts: ListenerOptions) -> io::Result<Listener> {
        let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
        let advertise = match &opts.advertise {
            Some(host) => host.clone(),
            None if opts.bind.ip().is_unspecified() => {
                return Err(invalid(format!(
                    "listening on {} needs an advertised address for the tickets \
                     (ListenerOptions::advertise)",
                    opts.bind
                )))
            }
            None => opts.bind.ip().to_string(),
        };
        let loopback = opts.bind.ip().is_loopback() && is_loopback(&advertise);
        if !opts.tls && !loopback {
            return Err(invalid(format!(
                "plain TCP (no TLS) is allowed on loopback only, not {} advertised as {advertise:?}",
                opts.bind
            )));
        }
        let certificate = if opts.tls {
            Some(PoolCertificate::generate(std::slice::from_ref(&advertise))?)
        } else {
            None
        };
        let tcp = TcpListener::bind(opts.bind).await?;
        let local_addr = tcp.local_addr()?;
        let fingerprint = certificate.as_ref().map(|c| c.fingerprint);
        let pool_ticket =
            Ticket::issue(&advertise, local_addr.port(), fingerprint, opts.ticket_ttl)
                .map_err(|e| invalid(e.to_string()))?;
        let mut state = State::default();
        state.tickets.insert(
            pool_ticket.id_bytes(),
            Issued {
                ticket: pool_ticket.clone(),
                single_use: false,
            },
        );
        let core = Arc::new(Core {
            acceptor: certificate
                .as_ref()
                .map(|c| tokio_rustls::TlsAcceptor::from(c.config.clone())),
            certificate,
            local_addr,
            advertise,
            state: Mutex::new(state),
            slot_waiting: Notify::new(),
            pending: AtomicUsize::new(0),
            peak_pending: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            joined: AtomicU64::new(0),
            closed: Default::default(),
            log: Mutex::new(RefusalLog {
                per_second: opts.refusal_log_per_second,
                window: None,
                lines: 0,
                suppressed: 0,
            }),
            pool_ticket,
            opts,
        });
        let (close_tx, close_rx) = watch::channel(false);
        tokio::spawn(accept_loop(core.clone(), tcp, close_rx));
        Ok(Listener {
            handle: Arc::new(Handle {
                core,
                _close: close_tx,
            }),
        })
    }

    fn core(&self) -> &Arc<Core> {
        &self.handle.core
    }

    /// The pool ticket: any number of workers may join with it until it expires or is revoked
    /// (what an external launcher hands to all its workers).
    pub fn ticket(&self) -> Ticket {
        self.core().pool_ticket.clone()
    }

    /// Another ticket any number of workers may join with, valid for `ttl`.
    pub fn issue(&self, ttl: Duration) -> Ticket {
        self.core().issue(ttl, false)
    }

    /// Forgets `ticket`: later joins with it are refused. With `drop_workers`, the workers
    /// that joined with it are disconnected too (they are replaced like any lost worker).
    pub fn revoke(&self, ticket: &Ticket, drop_workers: bool) {
        self.core().revoke(ticket.id_bytes(), drop_workers);
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.core().local_addr
    }

    /// The host written into tickets.
    pub fn advertised_host(&self) -> &str {
        &self.core().advertise
    }

    /// The fingerprint workers pin (`sha256:` and 64 hex digits); `None` for plain TCP.
    pub fn fingerprint(&self) -> Option<String> {
        self.core()
            .certificate
            .as_ref()
            .map(|c| format!("sha256:{}", super::ticket::to_hex(&c.fingerprint)))
    }

    /// Counters of what the listener has seen.
    pub fn stats(&self) -> ListenerStats {
        let core = self.core();
        let state = core.lock();
        ListenerStats {
            accepted: core.accepted.load(Relaxed),
            joined: core.joined.load(Relaxed),
            refused: state.refused,
            refused_by_cause: state.refused_by_cause.clone(),
            pending: core.pending.load(Relaxed),
            peak_pending: core.peak_pending.load(Relaxed),
        }
    }

    /// A per-worker ticket: one join, valid for `ttl`.
    pub(crate) fn issue_single_use(&self, ttl: Duration) -> Ticket {
        self.core().issue(ttl, true)
    }

    pub(crate) fn hello_timeout(&self) -> Duration {
        self.core().opts.hello_timeout
    }

    /// Waits up to `wait` for a worker joining with `ticket` (a single-use ticket's id), or
    /// with any multi-use ticket (`None`).
    pub(crate) async fn accept(
        &self,
        ticket: Option<[u8; 16]>,
        wait: Duration,
    ) -> Result<Joined, AcceptError> {
        let core = self.core();
        if core.closed.load(SeqCst) {
            return Err(AcceptError::Closed);
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut state = core.lock();
            state.waiters.retain(|w| !w.tx.is_closed());
            state.waiters.push_back(Waiter { ticket, tx });
        }
        core.slot_waiting.notify_waiters();
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(joined)) => Ok(joined),
            Ok(Err(_)) => Err(AcceptError::Closed),
            Err(_) => Err(AcceptError::TimedOut),
        }
    }

    /// Every slot waiting in [`accept`](Self::accept) gives up now (its pool closed).
    pub(crate) fn stop_waiting(&self) {
        let waiters = std::mem::take(&mut self.core().lock().waiters);
        drop(waiters); // each receiver sees its sender go: AcceptError::Closed
    }

    /// A worker that joined with `ticket_id` now serves on `transport` (for revocation).
    pub(crate) fn joined(&self, ticket_id: [u8; 16], transport: &Arc<Transport>) {
        let mut state = self.core().lock();
        let list = state.joined.entry(ticket_id).or_default();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(transport));
    }

    /// A joined connection that sent no valid HELLO in time (counted and logged as a refusal).
    pub(crate) fn refused(&self, peer: &SocketAddr, cause: &str) {
        self.core().refuse(peer, cause);
    }

    /// Forgets a single-use ticket whose worker never joined.
    pub(crate) fn forget(&self, ticket: &Ticket) {
        self.core().lock().tickets.remove(&ticket.id_bytes());
    }
}

impl Core {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn issue(&self, ttl: Duration, single_use: bool) -> Ticket {
        let fingerprint = self.certificate.as_ref().map(|c| c.fingerprint);
        // The address was checked when the pool ticket was made: the same one cannot fail.
        let ticket = Ticket::issue(&self.advertise, self.local_addr.port(), fingerprint, ttl)
            .expect("the listener's address makes valid tickets");
        let mut state = self.lock();
        // Expired tickets go as new ones come, so the table stays as large as what is valid.
        state.tickets.retain(|_, t| !t.ticket.expired());
        state.tickets.insert(
            ticket.id_bytes(),
            Issued {
                ticket: ticket.clone(),
                single_use,
            },
        );
        ticket
    }

    fn revoke(&self, id: [u8; 16], drop_workers: bool) {
        let dropped = {
            let mut state = self.lock();
            state.tickets.remove(&id);
            state.revoked.insert(id);
            if drop_workers {
                state.joined.remove(&id).unwrap_or_default()
            } else {
                Vec::new()
            }
        };
        for t in dropped.iter().filter_map(Weak::upgrade) {
            t.shut_down();
        }
    }

    fn refuse(&self, peer: &SocketAddr, cause: &str) {
        {
            let mut state = self.lock();
            state.refused += 1;
            // Counted by the cause's fixed words (a ticket's id is not part of the key).
            let key = cause.split(" (").next().unwrap_or(cause);
            *state.refused_by_cause.entry(key.to_owned()).or_default() += 1;
        }
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .refused(peer, cause, Instant::now());
    }

    /// PROTOCOL.md 21.3's checks, in order; the ticket when they pass.
    fn check(&self, block: &[u8; JOIN_SIZE]) -> Result<(Ticket, bool), Refusal> {
        let (id, secret) = match JoinBlock::read(block) {
            JoinBlock::BadMagic => return Err(Refusal::silent("bad magic")),
            JoinBlock::Version(v) => {
                return Err(Refusal {
                    cause: format!("join version {v}"),
                    answer: Some((ErrorCode::VersionMismatch, "join version not supported (1)")),
                })
            }
            JoinBlock::Reserved => return Err(Refusal::answered("reserved bytes not zero")),
            JoinBlock::Ticket { id, secret } => (id, secret),
        };
        let mut state = self.lock();
        let name = super::ticket::to_hex(&id);
        let Some(issued) = state.tickets.get(&id) else {
            return Err(Refusal::answered(if state.revoked.contains(&id) {
                format!("revoked ticket ({name})")
            } else {
                "unknown ticket".to_owned()
            }));
        };
        if !issued.ticket.secret_matches(secret) {
            return Err(Refusal::answered(format!("wrong secret ({name})")));
        }
        if issued.ticket.expired() {
            return Err(Refusal::answered(format!("expired ticket ({name})")));
        }
        let (ticket, single_use) = (issued.ticket.clone(), issued.single_use);
        if single_use {
            state.tickets.remove(&id);
        }
        Ok((ticket, single_use))
    }

    /// Hands `joined` to a slot waiting for its ticket; gives it back when none waits.
    fn route(&self, joined: Joined, single_use: bool) -> Option<Joined> {
        let mut joined = joined;
        let mut state = self.lock();
        let mut i = 0;
        while i < state.waiters.len() {
            let fits = match state.waiters[i].ticket {
                Some(id) => id == joined.ticket_id,
                None => !single_use,
            };
            if !fits {
                i += 1;
                continue;
            }
            let waiter = state.waiters.remove(i).expect("in range");
            match waiter.tx.send(joined) {
                Ok(()) => return None,
                Err(back) => joined = back, // that slot stopped waiting
            }
        }
        Some(joined)
    }
}

/// Counts a connection from accept to its hand-over or its end.
struct PendingGuard(Arc<Core>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, SeqCst);
    }
}

async fn accept_loop(core: Arc<Core>, tcp: TcpListener, mut closed: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            r = tcp.accept() => r,
            _ = closed.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of descriptors (or a connection reset before it was taken): the backlog
                // waits while the crowd's connections end.
                tracing::warn!(target: "wirepool::remote", error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        core.accepted.fetch_add(1, Relaxed);
        let pending = core.pending.fetch_add(1, SeqCst) + 1;
        let guard = PendingGuard(core.clone());
        if pending > core.opts.max_pending_joins {
            drop(guard);
            abort(stream);
            core.refuse(&peer, "too many pending");
            continue;
        }
        core.peak_pending.fetch_max(pending, Relaxed);
        let core = core.clone();
        let closed = closed.clone();
        tokio::spawn(async move {
            let mut closed = closed;
            tokio::select! {
                () = join(&core, stream, peer, guard) => {}
                _ = closed.changed() => {}
            }
        });
    }
}

/// Closes with a reset: nothing of the connection lingers in the kernel.
fn abort(stream: TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on the descriptor `stream` owns, with a value of the option's type.
    // With a zero linger the close does not block: it resets the connection.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(stream);
}

/// One connection's join step, within the bounds of 21.4.
async fn join(core: &Arc<Core>, stream: TcpStream, peer: SocketAddr, guard: PendingGuard) {
    let accepted_at = Instant::now();
    let join_deadline = accepted_at + core.opts.join_timeout;
    let hello_deadline = accepted_at + core.opts.hello_timeout;
    let _ = stream.set_nodelay(true);
    let mut block = [0u8; JOIN_SIZE];
    let handshake = async {
        let mut conn = match &core.acceptor {
            Some(acceptor) => {
                let tls = acceptor
                    .accept(stream)
                    .await
                    .map_err(|e| Refusal::silent(format!("tls handshake failed ({e})")))?;
                if tls.get_ref().1.alpn_protocol() != Some(ALPN) {
                    return Err(Refusal::silent("tls handshake failed (no ALPN wirepool/1)"));
                }
                Joining::Tls(Box::new(tls))
            }
            None => Joining::Plain(stream),
        };
        // Exactly the 64 bytes: what rustls decrypted beyond them stays in it (the start of
        // the HELLO); on plain TCP nothing more is read.
        match conn.read_block(&mut block).await {
            Ok(()) => Ok(conn),
            Err(e) => Err(Refusal::silent(format!("closed before joining ({e})"))),
        }
    };
    let mut conn = match tokio::time::timeout_at(join_deadline.into(), handshake).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(refusal)) => return core.refuse(&peer, &refusal.cause),
        Err(_) => return core.refuse(&peer, "join timeout"),
    };
    let (ticket, single_use) = match core.check(&block) {
        Ok(checked) => checked,
        Err(refusal) => {
            core.refuse(&peer, &refusal.cause);
            if let Some((code, message)) = refusal.answer {
                answer(&mut conn, code, message).await;
            }
            return;
        }
    };
    let transport = match conn.into_transport() {
        Ok(t) => t,
        Err(e) => return core.refuse(&peer, &format!("closed before joining ({e})")),
    };
    let mut joined = Joined {
        transport,
        peer,
        ticket_id: ticket.id_bytes(),
        hello_deadline,
    };
    // No slot waiting yet (the pool is full, or a replacement is in its backoff): wait for one
    // until the HELLO bound runs out (21.4).
    loop {
        let notified = core.slot_waiting.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        joined = match core.route(joined, single_use) {
            None => {
                core.joined.fetch_add(1, Relaxed);
                drop(guard);
                return;
            }
            Some(back) => back,
        };
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep_until(hello_deadline.into()) => break,
        }
    }
    core.refuse(&peer, "pool full");
    let mut frame = Vec::new();
    let _ = Frame::new(
        0,
        FrameBody::Error {
            code: ErrorCode::BadHandshake.code(),
            message: "join refused: the pool is full".into(),
            details: String::new(),
        },
    )
    .encode(&mut frame);
    let _ = tokio::time::timeout(Duration::from_secs(1), joined.transport.write_all(&frame)).await;
    joined.transport.shut_down();
}

/// The refusal's ERROR id 0, then close; a peer that does not read it holds the connection one
/// second at most.
async fn answer(conn: &mut Joining, code: ErrorCode, message: &str) {
    let mut frame = Vec::new();
    let _ = Frame::new(
        0,
        FrameBody::Error {
            code: code.code(),
            message: message.to_owned(),
            details: String::new(),
        },
    )
    .encode(&mut frame);
    let _ = tokio::time::timeout(Duration::from_secs(1), conn.answer(&frame)).await;
}
