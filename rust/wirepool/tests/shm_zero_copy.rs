//! The zero-copy send of the shared-memory lane (PROTOCOL.md 20): a body written into a
//! `BodyBuf` (the parent's `Pool::body_buf`, a worker handler's `Context::body_buf`) is lent to
//! the peer where it was written, never copied; with the lane off, a worker that did not offer
//! it, or a region above the window, the same bytes go over the socket; a handler that fails
//! after allocating gives its region back; a worker killed while it holds a zero-copy body
//! leaves nothing mapped once the body is dropped.

mod common;

use bytes::Bytes;
use common::{bounded, builder};
use wirepool::{BodyBuf, Pool, WorkerCommand};
use wirepool_worker::Encoded;

/// This process's memfd descriptors of wirepool, its own (read-write) region mappings as
/// (start, end), and its mappings of the worker's regions (read-only).
fn footprint() -> (usize, Vec<(usize, usize)>, usize) {
    let fds = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:wirepool-shm"))
        })
        .count();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let ours = maps.lines().filter(|l| l.contains("/memfd:wirepool-shm"));
    let own = ours
        .clone()
        .filter(|l| l.contains(" rw-s "))
        .map(|l| {
            let (a, b) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            )
        })
        .collect();
    let theirs = ours.filter(|l| l.contains(" r--s ")).count();
    (fds, own, theirs)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn sum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |s, &x| s.wrapping_add(x as u64))
}

/// A shared body of `len` bytes of `pattern(len, seed)`, written in place.
fn shared_body(pool: &Pool, len: usize, seed: u8) -> Bytes {
    let mut body = pool.body_buf(len);
    assert!(body.is_shared(), "the pool's lane is on: {body:?}");
    body.unfilled(len).copy_from_slice(&pattern(len, seed));
    body.freeze()
}

async fn checksum(pool: &Pool, body: Bytes) -> u64 {
    let answer = pool.call_raw("sum_raw", body).await.unwrap();
    std::str::from_utf8(&answer).unwrap().parse().unwrap()
}

type Probe = (Vec<(usize, usize)>, (usize, bool));

async fn fill(pool: &Pool, len: usize, seed: u8) -> wirepool::Result<Bytes> {
    let r: Encoded = pool.call("fill_raw", &(len, seed, false)).await?;
    Ok(r.0)
}

// One test: the footprint counts are of the whole process, so nothing else may run beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_written_in_place_are_lent_without_a_copy_and_fall_back_to_the_socket() {
    bounded(180, async {
        assert_eq!(footprint(), (0, vec![], 0), "nothing mapped before");
        let pool = builder(1).shm_lane(Some(1 << 20)).start().await.unwrap();

        // ---- The parent's request body: lent where it was written.
        let len = 16 << 20;
        let body = shared_body(&pool, len, 1);
        assert!(wirepool_io_is_shared(&body));
        let want = sum(&pattern(len, 1));
        for _ in 0..5 {
            assert_eq!(checksum(&pool, body.clone()).await, want);
        }
        let (fds, own, _) = footprint();
        // One region of ours, the body's: the copying path would have made a second one to
        // copy into (the body's region is held by `body`, so it could not be reused).
        assert_eq!(own.len(), 1, "own regions {own:x?}");
        let at = body.as_ptr() as usize;
        assert!(
            own[0].0 <= at && at + len <= own[0].1,
            "the body is the lent region"
        );
        assert_eq!(fds, 1, "the parent keeps its region's descriptor");
        // A slice of it is lent in place too.
        let half = body.slice(len / 4..len / 2);
        assert_eq!(checksum(&pool, half.clone()).await, sum(&half));
        assert_eq!(footprint().1.len(), 1);
        drop(half);

        // ---- The worker's result: written in place, lent where it was written.
        let result = fill(&pool, 8 << 20, 7).await.unwrap();
        assert!(result.as_ref() == pattern(8 << 20, 7).as_slice());
        let (regions, (wrote_at, was_shared)): Probe = pool.call("shm_probe", &()).await.unwrap();
        assert!(
            was_shared,
            "Context::body_buf is shared memory with the lane on"
        );
        assert_eq!(
            regions.len(),
            1,
            "one region of the worker's, the one written: {regions:x?}"
        );
        assert!(regions[0].0 <= wrote_at && wrote_at < regions[0].1);
        drop(result);
        // Back to back: the worker reuses the region its last result was released from.
        for seed in 0..4u8 {
            let r = fill(&pool, 8 << 20, seed).await.unwrap();
            assert!(r.as_ref() == pattern(8 << 20, seed).as_slice());
        }
        let (regions, _): Probe = pool.call("shm_probe", &()).await.unwrap();
        assert_eq!(regions.len(), 1, "reused: {regions:x?}");

        // ---- A handler that fails after allocating gives its region back.
        let failed: wirepool::Result<Encoded> = pool.call("fill_raw", &(24 << 20, 1u8, true)).await;
        assert!(
            matches!(&failed, Err(e) if e.to_string().contains("failed after allocating")),
            "{failed:?}"
        );
        let (regions, (_, was_shared)): Probe = pool.call("shm_probe", &()).await.unwrap();
        assert!(was_shared);
        // (The 8 MiB one may be retired by now on a slow machine: idle for 1 s.)
        assert!(
            regions.len() <= 1 && regions.iter().all(|(s, e)| e - s < 24 << 20),
            "the failed handler's 24 MiB region is unmapped: {regions:x?}"
        );

        // ---- A parent body that is dropped unsent gives its region back.
        let unsent = pool.body_buf(4 << 20);
        assert!(unsent.is_shared());
        assert_eq!(footprint().1.len(), 2);
        drop(unsent);
        assert_eq!(footprint().1.len(), 1);

        // ---- A region larger than the window (1 GiB, the default max_message_size): the
        // body goes over the socket, from the region, with no copy made for the lane.
        let mut huge: BodyBuf = pool.body_buf((1 << 30) + (4 << 20));
        assert!(
            huge.is_shared(),
            "sparse: nothing of it is touched but what is written"
        );
        huge.extend_from_slice(&pattern(3 << 20, 9));
        let huge = huge.freeze();
        assert_eq!(
            checksum(&pool, huge.clone()).await,
            sum(&pattern(3 << 20, 9))
        );
        let (_, own, _) = footprint();
        assert_eq!(
            own.len(),
            2,
            "the huge region and the 16 MiB one, nothing copied into a third"
        );
        drop(huge);

        // ---- The worker killed while it holds a zero-copy body: one outcome, and nothing of
        // it is left once the body and the idle regions are gone.
        let pid: u32 = pool.call("pid", &()).await.unwrap();
        let mut held = Box::pin(pool.call_raw("hold_raw", body.clone()));
        tokio::select! {
            biased;
            early = &mut held => panic!("hold_raw ended before the kill: {early:?}"),
            p = pool.call::<_, u32>("pid", &()) => assert_eq!(p.unwrap(), pid),
        }
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        let outcome = held.await;
        assert!(
            matches!(outcome, Err(wirepool::Error::WorkerExited(_))),
            "{outcome:?}"
        );
        let mut replaced = false;
        for _ in 0..200 {
            match pool.call::<_, u32>("pid", &()).await {
                Ok(p) if p != pid => {
                    replaced = true;
                    break;
                }
                _ => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
        assert!(replaced, "the worker was replaced");
        // The same body to the new worker: announced to it, lent again, still no copy.
        assert_eq!(checksum(&pool, body.clone()).await, want);
        assert_eq!(footprint().1.len(), 1);
        drop(body);
        pool.shutdown().await;
        assert_eq!(footprint(), (0, vec![], 0), "all unmapped after shutdown");

        // ---- The lane off in the pool: ordinary heap buffers, the same answers.
        let off = builder(1).shm_lane(None).start().await.unwrap();
        let mut body = off.body_buf(16 << 20);
        assert!(!body.is_shared());
        body.extend_from_slice(&pattern(16 << 20, 2));
        assert_eq!(
            checksum(&off, body.freeze()).await,
            sum(&pattern(16 << 20, 2))
        );
        let r = fill(&off, 8 << 20, 3).await.unwrap();
        assert!(r.as_ref() == pattern(8 << 20, 3).as_slice());
        let (regions, (_, was_shared)): Probe = off.call("shm_probe", &()).await.unwrap();
        assert!(
            !was_shared && regions.is_empty(),
            "the worker's lane is off too"
        );
        off.shutdown().await;
        assert_eq!(footprint(), (0, vec![], 0));

        // ---- A worker that did not offer the lane: the parent's shared body goes over the
        // socket (writev from the region), the worker's buffers are on the heap.
        let refused = Pool::builder(
            WorkerCommand::new(common::test_worker()).env("WIREPOOL_TEST_NO_SHM", "1"),
        )
        .shm_lane(Some(1 << 20))
        .start()
        .await
        .unwrap();
        let body = shared_body(&refused, 16 << 20, 4);
        assert_eq!(
            checksum(&refused, body.clone()).await,
            sum(&pattern(16 << 20, 4))
        );
        let r = fill(&refused, 8 << 20, 5).await.unwrap();
        assert!(r.as_ref() == pattern(8 << 20, 5).as_slice());
        let (regions, (_, was_shared)): Probe = refused.call("shm_probe", &()).await.unwrap();
        assert!(!was_shared && regions.is_empty());
        let (_, own, theirs) = footprint();
        assert_eq!(
            (own.len(), theirs),
            (1, 0),
            "only the body's own region, never sent"
        );
        drop(body);
        refused.shutdown().await;
    })
    .await;
    assert_eq!(footprint(), (0, vec![], 0), "all unmapped at the end");
}

fn wirepool_io_is_shared(b: &Bytes) -> bool {
    // The body is a view of a region of this process (what the driver lends without a copy).
    let (_, own, _) = footprint();
    let at = b.as_ptr() as usize;
    own.iter().any(|&(s, e)| s <= at && at + b.len() <= e)
}
