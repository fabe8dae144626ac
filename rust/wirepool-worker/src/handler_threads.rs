//! Threads for blocking handlers, so the I/O thread always answers PING and CANCEL.
//!
//! The threads must serve two loads well: many tiny handlers (echo at hundreds of thousands of calls
//! per second) and a few handlers that block for a long time (sleep, wait on I/O). Waking a thread
//! per request is what kills the first (a futex and a context switch per call, and a thread per
//! request in flight), so only as many threads as there are spare CPUs are woken for queued work.
//! A monitor on the I/O loop covers the second: while work is queued and no thread has started a
//! task for a tick, it adds one more thread (up to the worker's concurrency limit), so blocked
//! handlers never starve the queue for more than a tick each.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

pub(crate) type Task = Box<dyn FnOnce() + Send + 'static>;

/// The handler threads of one worker process (not a pool of workers: that is the parent's).
#[derive(Clone)]
pub(crate) struct HandlerThreads {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<QueueState>,
    work: Condvar,
    max_threads: usize,
    /// Threads woken for queued work without evidence that running ones are stuck.
    eager_threads: usize,
}

struct QueueState {
    queue: VecDeque<Task>,
    idle: usize,
    threads: usize,
    /// Tasks started so far, and the figure the monitor saw last.
    started: u64,
    started_at_last_check: u64,
    monitor_running: bool,
}

enum Helper {
    None,
    Wake,
    Spawn,
}

impl Inner {
    /// Whether queued work should get another thread; `force` ignores the eager limit (the
    /// monitor saw no progress).
    fn helper_for(&self, st: &mut QueueState, force: bool) -> Helper {
        let busy = st.threads - st.idle;
        if st.queue.is_empty() || (!force && busy >= self.eager_threads) {
            Helper::None
        } else if st.idle > 0 {
            Helper::Wake
        } else if st.threads < self.max_threads {
            st.threads += 1;
            Helper::Spawn
        } else {
            Helper::None
        }
    }
}

impl HandlerThreads {
    pub(crate) fn new(max_threads: usize) -> HandlerThreads {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let max_threads = max_threads.max(1);
        HandlerThreads {
            inner: Arc::new(Inner {
                state: Mutex::new(QueueState {
                    queue: VecDeque::new(),
                    idle: 0,
                    threads: 0,
                    started: 0,
                    started_at_last_check: 0,
                    monitor_running: false,
                }),
                work: Condvar::new(),
                max_threads,
                // One CPU stays with the I/O thread.
                eager_threads: cpus.saturating_sub(1).clamp(1, max_threads),
            }),
        }
    }

    /// Queue every task in `tasks` (leaving it empty). Returns true if the caller should start
    /// the monitor ([`HandlerThreads::check_progress`] every tick until it returns false).
    pub(crate) fn submit(&self, tasks: &mut Vec<Task>) -> bool {
        if tasks.is_empty() {
            return false;
        }
        let (helper, start_monitor) = {
            let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
            st.queue.extend(tasks.drain(..));
            let first = st.threads == 0;
            let helper = self.inner.helper_for(&mut st, first);
            let start_monitor = !st.monitor_running;
            if start_monitor {
                st.monitor_running = true;
                st.started_at_last_check = st.started;
            }
            (helper, start_monitor)
        };
        help(&self.inner, helper);
        start_monitor
    }

    /// The monitor's tick: if work is queued and no task started since the last tick, add a
    /// thread. Returns false (and stops counting as running) once the queue is empty.
    pub(crate) fn check_progress(&self) -> bool {
        let helper = {
            let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
            if st.queue.is_empty() {
                st.monitor_running = false;
                return false;
            }
            let stalled = st.started == st.started_at_last_check;
            st.started_at_last_check = st.started;
            if stalled {
                self.inner.helper_for(&mut st, true)
            } else {
                Helper::None
            }
        };
        help(&self.inner, helper);
        true
    }
}

fn help(inner: &Arc<Inner>, helper: Helper) {
    match helper {
        Helper::None => {}
        Helper::Wake => inner.work.notify_one(),
        Helper::Spawn => {
            let inner2 = Arc::clone(inner);
            let spawned = std::thread::Builder::new()
                .name("wirepool-handler".into())
                .spawn(move || thread_main(inner2));
            if spawned.is_err() {
                // Out of threads: the queued work waits for a running thread instead.
                inner
                    .state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .threads -= 1;
            }
        }
    }
}

fn thread_main(inner: Arc<Inner>) {
    let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if let Some(task) = st.queue.pop_front() {
            st.started += 1;
            let helper = inner.helper_for(&mut st, false);
            drop(st);
            help(&inner, helper);
            // Handlers catch their own panics; this guard only keeps the thread alive if the
            // SDK's glue around them ever panics.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(task));
            st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
        } else {
            st.idle += 1;
            st = inner.work.wait(st).unwrap_or_else(|p| p.into_inner());
            st.idle -= 1;
        }
    }
}
