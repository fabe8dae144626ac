//! Progress events (EVENT frames) from workers, delivered to a bounded mailbox.
//!
//! EVENT frames are not flow controlled (PROTOCOL.md section 2): a worker may send them faster
//! than anyone reads them. So the mailbox never grows past its capacity; when it is full, a new
//! event replaces the queued one of the same request and topic (the latest progress wins), or
//! else pushes out the oldest queued event. Every event so discarded is counted in
//! [`EventReceiver::dropped`]. The reader task that delivers events never waits for the
//! consumer, so a slow consumer slows neither results nor rows.

use crate::lock::Locked;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// One EVENT frame from a worker: a progress report or notification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerEvent {
    /// The worker incarnation that sent it.
    pub worker_id: u32,
    /// The request it reports on, or 0 for a connection-level event.
    pub request_id: u64,
    /// 1-255 bytes, chosen by the worker (e.g. `"progress"`).
    pub topic: String,
    /// JSON text, possibly empty.
    pub data: String,
}

impl WorkerEvent {
    /// The data decoded from JSON (empty data decodes as `null`).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        let text = if self.data.is_empty() {
            "null"
        } else {
            &self.data
        };
        serde_json::from_str(text).map_err(|e| Error::Decode {
            what: "event",
            message: e.to_string(),
        })
    }
}

/// A bounded mailbox for [`WorkerEvent`]s: give the [`EventSender`] to calls
/// ([`CallOptions::events`](crate::CallOptions::events)) or to the whole pool
/// ([`PoolBuilder::events`](crate::PoolBuilder::events)), and read the [`EventReceiver`].
///
/// At most `capacity` events (at least 1) wait in the mailbox, each at most one frame; see the
/// module's rules for what happens when it is full.
///
/// ```no_run
/// # async fn demo(pool: wirepool::Pool) -> wirepool::Result<()> {
/// use wirepool::{event_channel, CallOptions};
///
/// #[derive(serde::Deserialize)]
/// struct Progress { done: u64, of: u64 }
///
/// let (events, mut progress) = event_channel(16);
/// let opts = CallOptions { events: Some(events), ..Default::default() };
/// let call = pool.call_with::<_, u64>("progress", &100u64, opts);
/// let show = async {
///     // Ends when the call has ended (and with it, the last sender).
///     while let Some(event) = progress.recv().await {
///         let p: Progress = event.decode()?;
///         println!("{}: {}/{}", event.topic, p.done, p.of);
///     }
///     Ok::<_, wirepool::Error>(())
/// };
/// let (result, shown) = tokio::join!(call, show);
/// shown?;
/// assert_eq!(result?, 100);
/// # Ok(()) }
/// ```
pub fn event_channel(capacity: usize) -> (EventSender, EventReceiver) {
    let mailbox = Arc::new(Mailbox {
        capacity: capacity.max(1),
        state: Mutex::new(MailboxState {
            queue: VecDeque::new(),
            dropped: 0,
            waker: None,
            senders: 1,
            receiver: true,
        }),
    });
    (
        EventSender {
            mailbox: mailbox.clone(),
        },
        EventReceiver { mailbox },
    )
}

struct Mailbox {
    capacity: usize,
    state: Mutex<MailboxState>,
}

struct MailboxState {
    queue: VecDeque<WorkerEvent>,
    dropped: u64,
    waker: Option<Waker>,
    senders: usize,
    receiver: bool,
}

/// Where events go. Cheap to clone; each call using it holds a clone until it ends.
pub struct EventSender {
    mailbox: Arc<Mailbox>,
}

impl EventSender {
    /// Puts `event` in the mailbox without waiting: when full, it replaces the queued event of
    /// the same request and topic, else the oldest queued event is dropped.
    pub(crate) fn deliver(&self, event: WorkerEvent) {
        let waker = {
            let mut s = self.mailbox.state.locked();
            if !s.receiver {
                return;
            }
            if s.queue.len() >= self.mailbox.capacity {
                let same = s
                    .queue
                    .iter()
                    .position(|e| e.request_id == event.request_id && e.topic == event.topic);
                match same {
                    Some(i) => {
                        s.queue.remove(i);
                    }
                    None => {
                        s.queue.pop_front();
                    }
                }
                s.dropped += 1;
            }
            s.queue.push_back(event);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl Clone for EventSender {
    fn clone(&self) -> Self {
        self.mailbox.state.locked().senders += 1;
        EventSender {
            mailbox: self.mailbox.clone(),
        }
    }
}

impl Drop for EventSender {
    fn drop(&mut self) {
        let waker = {
            let mut s = self.mailbox.state.locked();
            s.senders -= 1;
            if s.senders > 0 {
                return;
            }
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl std::fmt::Debug for EventSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSender")
            .field("capacity", &self.mailbox.capacity)
            .finish_non_exhaustive()
    }
}

/// The reading end of an [`event_channel`].
pub struct EventReceiver {
    mailbox: Arc<Mailbox>,
}

impl EventReceiver {
    /// The next event; `None` once the mailbox is empty and every sender is gone (the
    /// `CallOptions` or builder holding it dropped, and every call that used it ended).
    pub async fn recv(&mut self) -> Option<WorkerEvent> {
        std::future::poll_fn(|cx| {
            let mut s = self.mailbox.state.locked();
            if let Some(e) = s.queue.pop_front() {
                return Poll::Ready(Some(e));
            }
            if s.senders == 0 {
                return Poll::Ready(None);
            }
            match &s.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => s.waker = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }

    /// The next event if one is waiting.
    pub fn try_recv(&mut self) -> Option<WorkerEvent> {
        self.mailbox.state.locked().queue.pop_front()
    }

    /// Events discarded so far because the mailbox was full (replaced by a newer event of the
    /// same request and topic, or pushed out as the oldest).
    pub fn dropped(&self) -> u64 {
        self.mailbox.state.locked().dropped
    }
}

impl Drop for EventReceiver {
    fn drop(&mut self) {
        let mut s = self.mailbox.state.locked();
        s.receiver = false;
        s.queue.clear();
    }
}

impl std::fmt::Debug for EventReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventReceiver")
            .field("capacity", &self.mailbox.capacity)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(request_id: u64, topic: &str, data: &str) -> WorkerEvent {
        WorkerEvent {
            worker_id: 1,
            request_id,
            topic: topic.into(),
            data: data.into(),
        }
    }

    #[tokio::test]
    async fn a_full_mailbox_keeps_the_latest_of_a_topic_and_drops_the_oldest_otherwise() {
        let (tx, mut rx) = event_channel(3);
        tx.deliver(ev(1, "progress", "1"));
        tx.deliver(ev(1, "log", "\"a\""));
        tx.deliver(ev(2, "progress", "1"));
        // Full: replaces request 1's progress.
        tx.deliver(ev(1, "progress", "2"));
        // Full, no match: the oldest (request 1's log) goes.
        tx.deliver(ev(3, "other", ""));
        assert_eq!(rx.dropped(), 2);
        let got: Vec<(u64, String, String)> = std::iter::from_fn(|| rx.try_recv())
            .map(|e| (e.request_id, e.topic, e.data))
            .collect();
        assert_eq!(
            got,
            vec![
                (2, "progress".into(), "1".into()),
                (1, "progress".into(), "2".into()),
                (3, "other".into(), "".into()),
            ]
        );
        let held = tx.clone();
        drop(tx);
        held.deliver(ev(1, "progress", "{\"done\":3}"));
        drop(held);
        let last = rx.recv().await.unwrap();
        assert_eq!(last.decode::<serde_json::Value>().unwrap()["done"], 3);
        assert_eq!(rx.recv().await, None, "every sender is gone");
    }

    #[test]
    fn nothing_is_kept_once_the_receiver_is_gone() {
        let (tx, rx) = event_channel(0);
        drop(rx);
        for i in 0..10 {
            tx.deliver(ev(i, "progress", ""));
        }
        assert!(tx.mailbox.state.locked().queue.is_empty());
        assert_eq!(ev(1, "t", "").decode::<Option<u8>>().unwrap(), None);
        assert!(ev(1, "t", "{").decode::<u8>().is_err());
    }
}
