//! Remote workers (PROTOCOL.md 21): workers that connect back to the pool over TCP with TLS 1.3
//! and join with a [`Ticket`], and the [`Launcher`]s that decide where worker processes run.
//!
//! From its HELLO on, a remote worker is driven by the same driver as a local one; only the
//! transport differs (the socketpair, TLS, or plain TCP on loopback). The pool's [`Listener`]
//! makes its own certificate (the fingerprint workers pin), issues tickets (a pool ticket, and
//! one single-use ticket per worker the pool starts itself), checks each JOIN block before the
//! HELLO, and holds every unauthenticated connection within the bounds of 21.4.
//!
//! ```no_run
//! # async fn demo() -> wirepool::Result<()> {
//! use wirepool::remote::Launcher;
//! use wirepool::{Pool, WorkerCommand};
//!
//! // Two local workers, and two children that join over TLS with a ticket of their own
//! // (the remote path on one machine).
//! let pool = Pool::builder(WorkerCommand::new("./my_worker"))
//!     .workers(2)
//!     .add_workers(2, Launcher::subprocess())
//!     .start()
//!     .await?;
//! for w in pool.metrics().workers {
//!     println!("slot {} runs on {:?}, pid {:?}", w.slot, w.host, w.pid);
//! }
//! # Ok(()) }
//! ```
//!
//! Workers started by anything else (a Kubernetes Job, a systemd unit) join with the pool
//! ticket, handed out by [`Launcher::external`]'s `on_ticket`; `docs/REMOTE.md` has examples.

mod transport;
pub(crate) use transport::Transport;

#[cfg(feature = "remote")]
mod launcher;
#[cfg(feature = "remote")]
mod listener;
#[cfg(feature = "remote")]
mod ticket;
#[cfg(feature = "remote")]
mod tls;

#[cfg(feature = "remote")]
pub(crate) use launcher::place;
#[cfg(feature = "remote")]
pub use launcher::Launcher;
#[cfg(feature = "remote")]
pub use listener::{Listener, ListenerOptions, ListenerStats};
#[cfg(feature = "remote")]
pub use ticket::{Ticket, TicketError};

/// The ALPN protocol of a wirepool connection (21.1).
#[cfg(feature = "remote")]
pub(crate) const ALPN: &[u8] = wirepool_proto::constants::REMOTE_ALPN.as_bytes();
