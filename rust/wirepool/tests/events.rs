//! Progress events (EVENT frames) from real workers into the parent's bounded mailboxes.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use serde::Deserialize;
use wirepool::{event_channel, CallOptions, Codec, WorkerCommand, WorkerEvent};

#[derive(Deserialize, Debug, PartialEq)]
struct Progress {
    done: u64,
    of: u64,
}

fn progress_of(events: &[WorkerEvent]) -> Vec<u64> {
    events
        .iter()
        .map(|e| {
            assert_eq!(e.topic, "progress");
            e.decode::<Progress>().unwrap().done
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_reaches_the_calls_mailbox_or_else_the_pools() {
    bounded(30, async {
        let (pool_events, mut pool_rx) = event_channel(64);
        let pool = builder(1).events(pool_events).start().await.unwrap();

        // A call with its own mailbox, read while the call runs.
        let (events, mut rx) = event_channel(16);
        let opts = CallOptions {
            events: Some(events),
            ..Default::default()
        };
        let call = pool.call_with::<_, u64>("progress", &5u64, opts);
        let read = async {
            let mut got = Vec::new();
            // Ends once the call ended: its route and options held the last senders.
            while let Some(e) = rx.recv().await {
                got.push(e);
            }
            got
        };
        let (n, got) = tokio::join!(call, read);
        assert_eq!(n.unwrap(), 5);
        assert_eq!(progress_of(&got), vec![1, 2, 3, 4, 5]);
        assert!(got
            .iter()
            .all(|e| e.request_id == got[0].request_id && e.request_id != 0));
        assert_eq!(got[0].decode::<Progress>().unwrap().of, 5);
        assert_eq!(rx.dropped(), 0);
        assert!(
            pool_rx.try_recv().is_none(),
            "the call's own mailbox took its events"
        );

        // A call without one: its events go to the pool's mailbox.
        let n: u64 = pool.call("progress", &3u64).await.unwrap();
        assert_eq!(n, 3);
        let got: Vec<WorkerEvent> = std::iter::from_fn(|| pool_rx.try_recv()).collect();
        assert_eq!(progress_of(&got), vec![1, 2, 3]);
        assert_eq!(pool_rx.dropped(), 0);

        let pids = pool.worker_pids();
        pool.shutdown().await;
        assert_reaped(&pids);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_events_to_an_unread_mailbox_keeps_memory_bounded() {
    bounded(60, async {
        // A worker that does not coalesce: 100,000 events of ~4 KiB (400 MiB if all were
        // kept) while nobody reads the mailbox of 8.
        let cmd = WorkerCommand::new(test_worker()).env("WIREPOOL_FAST_ECHO", "1");
        let pool = wirepool::Pool::builder(cmd)
            .workers(1)
            .startup_timeout(Duration::from_secs(10))
            .start()
            .await
            .unwrap();
        let before = wirepool::peak_rss_bytes(0).unwrap();
        let (events, mut rx) = event_channel(8);
        let opts = CallOptions {
            codec: Some(Codec::Raw),
            events: Some(events),
            ..Default::default()
        };
        let count = 100_000u64;
        let result: Bytes = pool
            .call_with("event_flood", &format!("{count} 4096"), opts)
            .await
            .unwrap();
        assert_eq!(&result[..], count.to_string().as_bytes());
        let growth = wirepool::peak_rss_bytes(0).unwrap().saturating_sub(before);
        assert!(growth < 64 << 20, "peak RSS grew by {growth} bytes");

        // The mailbox holds the 8 latest (same request and topic: each newer one replaced the
        // oldest), and counted every other one as dropped.
        let kept: Vec<u64> = std::iter::from_fn(|| rx.try_recv())
            .map(|e| {
                e.decode::<serde_json::Value>().unwrap()["i"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(kept, (count - 8..count).collect::<Vec<u64>>());
        assert_eq!(rx.dropped(), count - 8);
        assert!(rx.recv().await.is_none(), "the call ended: no sender left");

        let pids = pool.worker_pids();
        pool.shutdown().await;
        assert_reaped(&pids);
    })
    .await
}
