//! `Launcher::external().on_ticket(...)`'s threading (issue 28): the hook runs off the runtime's
//! threads, so one that blocks while its worker starts (as `ssh host worker` would) does not
//! stall the listener that worker connects to, on a `current_thread` runtime too; a panic in
//! it reaches the caller of `start`.

#![cfg(feature = "remote")]

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{bounded, builder, test_worker};
use wirepool::remote::{Launcher, Listener, ListenerOptions};

#[tokio::test(flavor = "current_thread")]
async fn a_blocking_on_ticket_does_not_stall_the_listener() {
    let listener = Listener::start(ListenerOptions::default()).await.unwrap();
    let child: Arc<Mutex<Option<Child>>> = Arc::default();
    let (held, watched) = (child.clone(), listener.clone());
    // Starts its worker, blocks 2 s, then until the listener has accepted that worker: on the
    // runtime's only thread nothing would be accepted while it blocks, and it would panic.
    let hook = move |ticket: &wirepool::remote::Ticket| {
        let worker = Command::new(test_worker())
            .env_remove("WIREPOOL_FD")
            .env("WIREPOOL_TICKET", ticket.encode())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        *held.lock().unwrap() = Some(worker);
        std::thread::sleep(Duration::from_secs(2)); // the blocking under test
        let deadline = Instant::now() + Duration::from_secs(30);
        while watched.stats().accepted < 1 {
            assert!(
                Instant::now() < deadline,
                "nothing was accepted while on_ticket blocked"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let outcome = bounded(90, async {
        let pool = builder(1)
            .launcher(
                Launcher::external()
                    .on_ticket(hook)
                    .join_wait(Duration::from_secs(20)),
            )
            .listener(listener.clone())
            .start()
            .await
            .unwrap();
        let sum: i64 = pool.call("add", &(20, 22)).await.unwrap();
        pool.shutdown().await;
        sum
    })
    .await;
    let mut worker = child
        .lock()
        .unwrap()
        .take()
        .expect("the hook started a worker");
    let _ = worker.kill();
    let _ = worker.wait();
    assert_eq!(outcome, 42);
}

#[tokio::test(flavor = "current_thread")]
#[should_panic(expected = "no space left for the ticket")]
async fn a_panic_in_on_ticket_reaches_the_caller_of_start() {
    let _ = builder(1)
        .launcher(Launcher::external().on_ticket(|_| panic!("no space left for the ticket")))
        .start()
        .await;
}
