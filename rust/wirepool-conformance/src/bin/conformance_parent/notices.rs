//! The pool's clamp notices (PROTOCOL.md 4.2): a pool whose `max_in_flight` is above a worker's
//! `max_concurrency` uses the offer and says so once per pool, as a `tracing` warning. The runner
//! counts them (the scenarios' `clamp_notices` expectation) with a layer of its own.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::Layer;

/// What every SDK's clamp notice says (conformance/README.md, `clamp_notices`).
const CLAMP_TEXT: &str = "is above the worker's max_concurrency";

static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Installs the counting layer as the process's subscriber; call once, at start.
pub fn install() {
    let subscriber = tracing_subscriber::registry().with(ClampNotices);
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// Starts a new count (a scenario's pool is about to start).
pub fn reset() {
    COUNT.store(0, Relaxed);
}

/// Clamp notices since the last [`reset`].
pub fn count() -> usize {
    COUNT.load(Relaxed)
}

struct ClampNotices;

impl<S: Subscriber> Layer<S> for ClampNotices {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() != Level::WARN {
            return;
        }
        let mut says = Says(false);
        event.record(&mut says);
        if says.0 {
            COUNT.fetch_add(1, Relaxed);
        }
    }
}

/// Whether the event's message is a clamp notice.
struct Says(bool);

impl Visit for Says {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" && format!("{value:?}").contains(CLAMP_TEXT) {
            self.0 = true;
        }
    }
}
