//! Launchers (PROTOCOL.md 21.8): where a pool's worker processes run. The pool's restart and
//! recycle policy stays the pool's; a launcher only places a process and stops it when the pool
//! lets its worker go.

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::process::Child;
use tokio::task::JoinHandle;

use super::listener::{AcceptError, Listener};
use super::ticket::Ticket;
use super::transport::Transport;
use crate::config::PoolConfig;
use crate::error::{Error, ExitCause, ExitInfo, Result};
use crate::spawn::{self, StderrTail};

/// How long a child whose connection ended has to exit by itself (after GOODBYE, or at end of
/// file: PROTOCOL.md 8.4) before it is killed: the goodbye grace.
const STOP_GRACE: Duration = Duration::from_secs(1);

type TicketMap = Arc<dyn Fn(&Ticket) -> Ticket + Send + Sync>;
type TicketHook = Arc<dyn Fn(&Ticket) + Send + Sync>;

/// Where a pool's workers run (PROTOCOL.md 21.8); set with
/// [`PoolBuilder::launcher`](crate::PoolBuilder::launcher) for the pool's slots, or
/// [`PoolBuilder::add_workers`](crate::PoolBuilder::add_workers) for more slots beside them.
///
/// - [`local`](Launcher::local) (the default): children with an inherited socketpair.
/// - [`subprocess`](Launcher::subprocess): children that join over TCP + TLS with a ticket of
///   their own, exactly as remote workers do (tests, benchmarks, trying a deployment out).
/// - [`external`](Launcher::external): workers started by anything else join with the pool's
///   ticket, handed out by [`on_ticket`](Launcher::on_ticket).
///
/// ```no_run
/// # async fn demo() -> wirepool::Result<()> {
/// use std::time::Duration;
/// use wirepool::remote::{Launcher, ListenerOptions};
/// use wirepool::{Pool, WorkerCommand};
///
/// let external = Launcher::external()
///     .on_ticket(|ticket| std::fs::write("/run/wirepool/ticket", ticket.encode()).unwrap())
///     .join_wait(Duration::from_secs(120));
/// let pool = Pool::builder(WorkerCommand::new("unused"))
///     .workers(4)
///     .launcher(external)
///     .listen(ListenerOptions::default().bind("0.0.0.0:7700".parse().unwrap()).advertise("pool.internal"))
///     .start()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Launcher {
    kind: Kind,
    join_wait: Option<Duration>,
}

#[derive(Clone)]
enum Kind {
    Local,
    Subprocess {
        child_ticket: Option<TicketMap>,
        stop_grace: Duration,
    },
    External {
        on_ticket: Option<TicketHook>,
        /// Shared by the clones of one launcher: `on_ticket` is called once per pool.
        told: Arc<OnceLock<()>>,
    },
}

impl fmt::Debug for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.kind {
            Kind::Local => "local",
            Kind::Subprocess { .. } => "subprocess",
            Kind::External { .. } => "external",
        };
        f.debug_struct("Launcher")
            .field("kind", &name)
            .field("join_wait", &self.join_wait)
            .finish_non_exhaustive()
    }
}

impl Default for Launcher {
    fn default() -> Self {
        Launcher::local()
    }
}

impl Launcher {
    /// Local children with an inherited socketpair (PROTOCOL.md 1): the default.
    pub fn local() -> Launcher {
        Launcher {
            kind: Kind::Local,
            join_wait: None,
        }
    }

    /// Children of this process that join the pool's listener with a single-use ticket in
    /// `WIREPOOL_TICKET` (instead of `WIREPOOL_FD`), over TLS unless the listener is plain TCP
    /// on loopback. Their stdout and stderr are the pool's as for local workers; a child whose
    /// connection ends has one second to exit by itself, then it is killed.
    pub fn subprocess() -> Launcher {
        Launcher {
            kind: Kind::Subprocess {
                child_ticket: None,
                stop_grace: STOP_GRACE,
            },
            join_wait: None,
        }
    }

    /// Workers started by anything else (a Kubernetes Job, a systemd unit, a shell) with the
    /// pool's ticket ([`Listener::ticket`]); each slot takes the next worker that joins.
    pub fn external() -> Launcher {
        Launcher {
            kind: Kind::External {
                on_ticket: None,
                told: Arc::default(),
            },
            join_wait: None,
        }
    }

    /// External: called once with the pool ticket when the listener is up, before the pool
    /// waits for its workers: write it where your workers read it (`WIREPOOL_TICKET`, or a file
    /// named by `WIREPOOL_TICKET_FILE`), or start them from here. No effect on other kinds.
    ///
    /// It runs on tokio's blocking pool ([`tokio::task::spawn_blocking`]), never on a runtime
    /// thread, so it may block (a slow disk, `ssh` starting a worker and waiting for it) while
    /// the listener goes on accepting and authenticating the workers that join meanwhile, on a
    /// `current_thread` runtime too; [`PoolBuilder::start`](crate::PoolBuilder::start) waits
    /// for it to return. A panic in it is resumed in the caller of `start`.
    pub fn on_ticket(mut self, f: impl Fn(&Ticket) + Send + Sync + 'static) -> Launcher {
        if let Kind::External { on_ticket, .. } = &mut self.kind {
            *on_ticket = Some(Arc::new(f));
        }
        self
    }

    /// Subprocess: the ticket handed to each child, made from the one issued for it (for
    /// example the same ticket pointing at a proxy, [`Ticket::with_address`]). No effect on
    /// other kinds.
    pub fn child_ticket(
        mut self,
        f: impl Fn(&Ticket) -> Ticket + Send + Sync + 'static,
    ) -> Launcher {
        if let Kind::Subprocess { child_ticket, .. } = &mut self.kind {
            *child_ticket = Some(Arc::new(f));
        }
        self
    }

    /// Subprocess: how long a child whose connection ended may take to exit by itself before
    /// it is killed (default 1 s).
    pub fn stop_grace(mut self, d: Duration) -> Launcher {
        if let Kind::Subprocess { stop_grace, .. } = &mut self.kind {
            *stop_grace = d;
        }
        self
    }

    /// How long a slot waits for its worker to join (default: the pool's start-up timeout).
    pub fn join_wait(mut self, d: Duration) -> Launcher {
        self.join_wait = Some(d);
        self
    }

    /// Whether this launcher's workers are local children with a socketpair.
    pub(crate) fn is_local(&self) -> bool {
        matches!(self.kind, Kind::Local)
    }

    /// The listener is up: an external launcher hands out the pool ticket (once), off the
    /// runtime's threads, so a hook that blocks does not stall the listener's accept loop and
    /// TLS handshakes (the worker gives up after 5 s).
    pub(crate) async fn opened(&self, listener: &Listener) {
        if let Kind::External {
            on_ticket: Some(f),
            told,
        } = &self.kind
        {
            if told.set(()).is_ok() {
                let (f, ticket) = (f.clone(), listener.ticket());
                if let Err(e) = tokio::task::spawn_blocking(move || f(&ticket)).await {
                    if e.is_panic() {
                        std::panic::resume_unwind(e.into_panic());
                    }
                }
            }
        }
    }
}

/// A remote worker whose connection joined, before its HELLO.
pub(crate) struct Placed {
    pub(crate) transport: Transport,
    pub(crate) peer: SocketAddr,
    pub(crate) ticket_id: [u8; 16],
    pub(crate) hello_deadline: Instant,
    /// The child started for it (subprocess), and how long it may take to exit.
    pub(crate) child: Option<Child>,
    pub(crate) child_pid: u32,
    pub(crate) stop_grace: Duration,
    pub(crate) stderr_tail: Arc<StderrTail>,
    pub(crate) logs_done: Option<JoinHandle<()>>,
}

/// Places one remote worker: starts its process (subprocess), waits for its join.
pub(crate) async fn place(
    launcher: &Launcher,
    listener: &Listener,
    cfg: &PoolConfig,
    worker_id: u32,
) -> Result<Placed> {
    let wait = launcher.join_wait.unwrap_or(cfg.startup_timeout);
    let timed_out = |tail: Vec<String>| Error::StartupTimeout {
        after: wait,
        stderr_tail: tail,
    };
    match &launcher.kind {
        Kind::Local => unreachable!("local workers are spawned with a socketpair"),
        Kind::External { .. } => {
            let joined = match listener.accept(None, wait).await {
                Ok(joined) => joined,
                Err(AcceptError::TimedOut) => return Err(timed_out(Vec::new())),
                Err(AcceptError::Closed) => return Err(Error::PoolClosed("the listener closed")),
            };
            Ok(Placed {
                transport: joined.transport,
                peer: joined.peer,
                ticket_id: joined.ticket_id,
                hello_deadline: joined.hello_deadline,
                child: None,
                child_pid: 0,
                stop_grace: STOP_GRACE,
                stderr_tail: Arc::new(StderrTail::new(0)),
                logs_done: None,
            })
        }
        Kind::Subprocess {
            child_ticket,
            stop_grace,
        } => {
            // Valid for one join, for the join bound plus the time the child takes to start.
            let ticket = listener.issue_single_use(wait + listener.hello_timeout());
            let handed = match child_ticket {
                Some(f) => f(&ticket),
                None => ticket.clone(),
            };
            let spawned = match spawn::spawn_joining(
                &cfg.command,
                worker_id,
                &handed.encode(),
                cfg.stderr_tail_lines,
                cfg.worker_output,
            ) {
                Ok(spawned) => spawned,
                Err(e) => {
                    listener.forget(&ticket);
                    return Err(e);
                }
            };
            let spawn::Spawned {
                mut child,
                pid,
                stderr_tail,
                logs_done,
                ..
            } = spawned;
            let accepted = tokio::select! {
                joined = listener.accept(Some(ticket.id_bytes()), wait) => Ok(joined),
                status = child.wait() => Err(status.ok()),
            };
            let failed = match accepted {
                Ok(Ok(joined)) => {
                    return Ok(Placed {
                        transport: joined.transport,
                        peer: joined.peer,
                        ticket_id: joined.ticket_id,
                        hello_deadline: joined.hello_deadline,
                        child: Some(child),
                        child_pid: pid,
                        stop_grace: *stop_grace,
                        stderr_tail,
                        logs_done: Some(logs_done),
                    })
                }
                // The child exited before it joined (a bad ticket, a worker that cannot
                // connect): it is ours, so its status and stderr say why.
                Err(status) => {
                    let _ = tokio::time::timeout(Duration::from_millis(200), logs_done).await;
                    Error::WorkerExited(Arc::new(child_exit(worker_id, pid, status, &stderr_tail)))
                }
                Ok(Err(e)) => {
                    spawn::signal_group(pid, libc::SIGKILL);
                    let _ = child.wait().await;
                    let _ = tokio::time::timeout(Duration::from_millis(200), logs_done).await;
                    match e {
                        AcceptError::TimedOut => timed_out(stderr_tail.snapshot()),
                        AcceptError::Closed => Error::PoolClosed("the listener closed"),
                    }
                }
            };
            listener.forget(&ticket);
            Err(failed)
        }
    }
}

fn child_exit(
    worker_id: u32,
    pid: u32,
    status: Option<std::process::ExitStatus>,
    tail: &StderrTail,
) -> ExitInfo {
    use std::os::unix::process::ExitStatusExt;
    ExitInfo {
        worker_id,
        pid,
        code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        cause: ExitCause::Crashed,
        stderr_tail: tail.snapshot(),
        host: None,
        connection_lost: false,
        attempts: 1,
    }
}
