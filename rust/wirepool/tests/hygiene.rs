//! Process hygiene: 1,000 spawn/kill cycles leak no file descriptor and leave no zombie.
//! Its own test binary, so no other test's children are counted.

mod common;

use std::time::Duration;

use common::*;
use wirepool::RestartPolicy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_spawn_kill_cycles_leak_no_fd_and_no_zombie() {
    bounded(300, async {
        // Warm up the runtime's own descriptors (signal pipe, epoll, blocking pool) first.
        let pool = builder(1).start().await.unwrap();
        pool.shutdown().await;
        assert_no_children();
        let fds_before = open_fds();

        let pool = builder(1)
            .restart_policy(RestartPolicy {
                initial_backoff: Duration::from_millis(0),
                max_backoff: Duration::from_millis(1),
                max_restarts: 100_000,
                within: Duration::from_secs(60),
                reset_after: Duration::from_secs(1),
            })
            .start()
            .await
            .unwrap();
        let mut last = 0;
        for cycle in 0..1000 {
            let pid: u32 = pool
                .call("pid", &())
                .await
                .unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
            assert_ne!(pid, last, "cycle {cycle}: a fresh worker each time");
            last = pid;
            kill(pid, libc::SIGKILL);
            // The next call lands on the replacement (or fails with WORKER_EXITED if it raced
            // the death); wait for the slot to be ready again.
            assert!(
                pool.wait_ready(Duration::from_secs(10)).await,
                "cycle {cycle}"
            );
            while pool.worker_pids().contains(&pid) {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(pool.metrics().total_restarts(), 1000);
        pool.shutdown().await;
        assert_no_children();
        assert_eq!(open_fds(), fds_before, "file descriptors leaked");

        // Whole pools too.
        for _ in 0..50 {
            let pool = builder(2).start().await.unwrap();
            let _: i64 = pool.call("add", &(1, 2)).await.unwrap();
            pool.shutdown().await;
        }
        assert_no_children();
        assert_eq!(open_fds(), fds_before, "file descriptors leaked");
    })
    .await
}
