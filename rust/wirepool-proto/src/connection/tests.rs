use super::*;
use crate::handshake::{MethodInfo, MethodKind};

/// A worker core past the handshake with these limits.
fn open_worker(max_frame_size: u32, max_message_size: u64) -> Connection {
    let hello = Hello {
        methods: vec![MethodInfo {
            name: "echo".into(),
            kind: MethodKind::Unary,
            codecs: vec![0],
        }],
        ..Hello::new("test", "1")
    };
    let mut worker = Connection::new_worker();
    worker.send_hello(&hello, &mut Vec::new()).unwrap();
    let welcome = Welcome {
        max_frame_size,
        max_message_size,
        ..Welcome::for_hello(&hello, 1).unwrap()
    };
    let mut wire = Vec::new();
    Frame::new(0, FrameBody::Welcome(welcome))
        .encode(&mut wire)
        .unwrap();
    worker.receive(&wire);
    assert!(matches!(worker.next_event(), Ok(Some(Event::Welcome(_)))));
    worker
}

fn request(id: u64, more: bool, body: Vec<u8>) -> Vec<u8> {
    let mut frame = Frame::new(
        id,
        FrameBody::Request {
            method: 0,
            codec: 0,
            timeout_us: 0,
            body: body.into(),
        },
    );
    frame.more = more;
    let mut wire = Vec::new();
    frame.encode(&mut wire).unwrap();
    wire
}

fn continuation(id: u64, more: bool, chunk: Vec<u8>) -> Vec<u8> {
    let mut frame = Frame::new(
        id,
        FrameBody::Continuation {
            chunk: chunk.into(),
        },
    );
    frame.more = more;
    let mut wire = Vec::new();
    frame.encode(&mut wire).unwrap();
    wire
}

/// Every byte reserved for messages in progress or kept for the next one.
fn reserved(conn: &Connection) -> usize {
    conn.spare.capacity()
        + conn
            .partials
            .values()
            .map(|p| p.body.capacity())
            .sum::<usize>()
}

#[test]
fn reassembly_never_reserves_past_the_connection_bound() {
    const LIMIT: u64 = 300_000;
    const PREFIX: u64 = 12;
    let mut worker = open_worker(65_536, LIMIT);
    // A 250,000-byte message: the guess for the next one's buffer.
    worker.receive(&request(1, true, vec![1; 60_000]));
    for more in [true, true, true, false] {
        worker.receive(&continuation(1, more, vec![1; 47_500]));
    }
    let Ok(Some(Event::Request { body, .. })) = worker.next_event() else {
        panic!("no request")
    };
    assert_eq!(body.len(), 60_000 + 4 * 47_500);
    drop(body);
    assert!(reserved(&worker) as u64 <= LIMIT);

    // Two messages in progress at once: the second's buffer is sized within what the
    // connection may still hold, not from the previous message's size.
    worker.receive(&request(2, true, vec![2; 60_000]));
    worker.receive(&request(3, true, vec![3; 60_000]));
    assert!(matches!(worker.next_event(), Ok(None)));
    assert_eq!(worker.partial_bytes, 2 * (PREFIX + 60_000));
    assert!(worker.partials[&3].body.capacity() as u64 <= LIMIT - (PREFIX + 60_000));
    // Growing them stays within the bound too, until the sum passes it: the typed error,
    // raised before anything is reserved for the offending chunk.
    worker.receive(&continuation(2, true, vec![2; 60_000]));
    worker.receive(&continuation(3, true, vec![3; 60_000]));
    assert!(matches!(worker.next_event(), Ok(None)));
    assert!(worker
        .partials
        .values()
        .all(|p| p.body.capacity() as u64 <= LIMIT));
    let before = reserved(&worker);
    worker.receive(&continuation(2, true, vec![2; 60_001]));
    let e = worker.next_event().unwrap_err();
    assert_eq!(e.code, ErrorCode::MessageTooLarge);
    assert_eq!(reserved(&worker), before);
}

/// Feeds `wire` as a driver reading a socket would: into `read_buffer`, never past its
/// spare capacity (a lent buffer's is exactly the rest of its frame), collecting events.
fn feed(conn: &mut Connection, mut wire: &[u8], events: &mut Vec<Event>) {
    while !wire.is_empty() {
        let rb = conn.read_buffer();
        let n = (rb.capacity() - rb.len()).min(wire.len()).min(1 << 20);
        rb.extend_from_slice(&wire[..n]);
        wire = &wire[n..];
        conn.next_events(events).unwrap();
    }
}

/// Where the next payload byte read through `read_buffer` lands.
fn read_at(conn: &mut Connection) -> usize {
    let rb = conn.read_buffer();
    rb.as_ptr() as usize + rb.len()
}

#[test]
fn a_large_first_frame_is_read_into_the_message_buffer_and_that_buffer_is_reused() {
    const FIRST: usize = 3 << 20; // above the decoder's OWN_BUFFER_MIN
    let mut worker = open_worker(4 << 20, 64 << 20);
    let mut start = 0;
    for (id, fill) in [(1, 1u8), (2, 2)] {
        let first = request(id, true, vec![fill; FIRST]);
        let mut events = Vec::new();
        // Header and prefix, then one byte of the body: the frame is pending, lent.
        feed(&mut worker, &first[..16 + 12 + 1], &mut events);
        let at = read_at(&mut worker) - 12 - 1;
        feed(&mut worker, &first[16 + 12 + 1..], &mut events);
        feed(
            &mut worker,
            &continuation(id, false, vec![9; 1024]),
            &mut events,
        );
        let [Event::Request { id: got, body, .. }] = &events[..] else {
            panic!("{events:?}")
        };
        assert_eq!(*got, id);
        assert_eq!(body.len(), FIRST + 1024);
        assert!(body[..FIRST].iter().all(|&b| b == fill));
        assert!(body[FIRST..].iter().all(|&b| b == 9));
        // The body starts where the first frame's bytes were read, after its prefix: not
        // copied into a reassembly buffer.
        assert_eq!(body.as_ptr() as usize, at + 12);
        if id == 1 {
            start = at;
        } else {
            // The reader dropped the first message: its buffer took the second one.
            assert_eq!(at, start);
        }
        assert_eq!(worker.partial_bytes, 0);
        worker.send_result(id, b"", &mut Vec::new()).unwrap();
    }
    assert!(reserved(&worker) <= 64 << 20);
}

#[test]
fn a_large_first_frame_past_the_limits_fails_in_order_without_a_lent_buffer() {
    // One frame above max_message_size itself: MESSAGE_TOO_LARGE, as without the lending.
    let mut worker = open_worker(4 << 20, 4 << 20);
    let mut events = Vec::new();
    worker.receive(&request(1, true, vec![1; 3 << 20]));
    worker.next_events(&mut events).unwrap();
    worker.receive(&request(2, true, vec![1; (3 << 20) - 16]));
    assert_eq!(
        worker.next_events(&mut events).unwrap_err().code,
        ErrorCode::MessageTooLarge
    );
    assert!(events.is_empty());
    // A duplicate id comes before the size: DUPLICATE_ID, lent or not.
    let mut worker = open_worker(4 << 20, 64 << 20);
    worker.receive(&request(5, false, vec![1; 10]));
    assert_eq!(worker.next_events(&mut events).unwrap(), 1);
    let dup = request(5, true, vec![1; 3 << 20]);
    feed_err(&mut worker, &dup, ErrorCode::DuplicateId);
}

fn feed_err(conn: &mut Connection, mut wire: &[u8], code: ErrorCode) {
    while !wire.is_empty() {
        let rb = conn.read_buffer();
        let n = (rb.capacity() - rb.len()).min(wire.len());
        rb.extend_from_slice(&wire[..n]);
        wire = &wire[n..];
        match conn.next_event() {
            Ok(None) => {}
            Ok(Some(e)) => panic!("{e:?}"),
            Err(e) => {
                assert_eq!(e.code, code);
                assert!(wire.is_empty());
                return;
            }
        }
    }
    panic!("no error");
}

#[test]
fn one_message_past_max_message_size_is_refused_before_its_buffer_grows() {
    let mut worker = open_worker(65_536, 100_000);
    worker.receive(&request(1, true, vec![1; 60_000]));
    assert!(matches!(worker.next_event(), Ok(None)));
    let before = reserved(&worker);
    worker.receive(&continuation(1, false, vec![1; 40_001]));
    let e = worker.next_event().unwrap_err();
    assert_eq!(e.code, ErrorCode::MessageTooLarge);
    assert_eq!(reserved(&worker), before);
    assert!(before <= 100_000);
}
