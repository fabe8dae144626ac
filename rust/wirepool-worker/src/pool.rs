//! Threads for blocking handlers, so the I/O thread always answers PING and CANCEL.
//!
//! Threads start on demand up to the worker's concurrency limit and then stay. The reader hands
//! over every request of one socket read at once (one lock, one wake-up); a thread that takes a
//! task while more are queued wakes one more idle thread, so parallelism follows the backlog
//! without a futex wake per request.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

pub(crate) type Task = Box<dyn FnOnce() + Send + 'static>;

pub(crate) struct Pool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    state: Mutex<PoolState>,
    work: Condvar,
    max_threads: usize,
}

struct PoolState {
    queue: VecDeque<Task>,
    idle: usize,
    threads: usize,
}

enum Helper {
    None,
    Wake,
    Spawn,
}

impl PoolInner {
    /// Decide, under the lock, whether more queued work needs another thread.
    fn helper_for(&self, st: &mut PoolState) -> Helper {
        if st.queue.is_empty() {
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

impl Pool {
    pub(crate) fn new(max_threads: usize) -> Pool {
        Pool {
            inner: Arc::new(PoolInner {
                state: Mutex::new(PoolState { queue: VecDeque::new(), idle: 0, threads: 0 }),
                work: Condvar::new(),
                max_threads: max_threads.max(1),
            }),
        }
    }

    /// Queue every task in `tasks` (leaving it empty).
    pub(crate) fn submit(&self, tasks: &mut Vec<Task>) {
        if tasks.is_empty() {
            return;
        }
        let helper = {
            let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
            st.queue.extend(tasks.drain(..));
            self.inner.helper_for(&mut st)
        };
        self.help(helper);
    }

    fn help(&self, helper: Helper) {
        help(&self.inner, helper);
    }
}

fn help(inner: &Arc<PoolInner>, helper: Helper) {
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
                inner.state.lock().unwrap_or_else(|p| p.into_inner()).threads -= 1;
            }
        }
    }
}

fn thread_main(inner: Arc<PoolInner>) {
    let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if let Some(task) = st.queue.pop_front() {
            let helper = inner.helper_for(&mut st);
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
