//! The shared-memory lane through the connection core (PROTOCOL.md 20): negotiated in the
//! handshake, its frame types only while it is on, bodies completed by SHM_BODY as zero-copy
//! views whose drop queues the SHM_RELEASE, and the refusals of each side.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use wirepool_proto::shm::{ShmAccept, ShmFrame, ShmMapping, ShmOffer, ShmRange};
use wirepool_proto::{
    Connection, ErrorCode, Event, FrameBuf, Hello, HelloExtensions, MethodInfo, MethodKind,
    ProtocolError, Welcome, WelcomeExtensions,
};

/// A peer's region as the test's "driver" maps it: plain bytes shared by both sides.
struct FakeRegion(Bytes);

impl ShmMapping for FakeRegion {
    fn lend(
        &self,
        offset: u64,
        length: u64,
        on_release: Box<dyn FnOnce() + Send>,
    ) -> Result<Bytes, ProtocolError> {
        struct Held(Bytes, Option<Box<dyn FnOnce() + Send>>);
        impl AsRef<[u8]> for Held {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        impl Drop for Held {
            fn drop(&mut self) {
                if let Some(f) = self.1.take() {
                    f();
                }
            }
        }
        let part = self.0.slice(offset as usize..(offset + length) as usize);
        Ok(Bytes::from_owner(Held(part, Some(on_release))))
    }
}

/// The regions a side "created", by id, which the other side's mapper looks up (standing in
/// for the descriptor that travels with SCM_RIGHTS).
type Shelf = Arc<Mutex<Vec<Bytes>>>;

fn mapper(shelf: &Shelf, maps: &Arc<AtomicUsize>) -> wirepool_proto::shm::ShmMapper {
    let shelf = shelf.clone();
    let maps = maps.clone();
    Box::new(move |_region, size| {
        maps.fetch_add(1, Ordering::SeqCst);
        let bytes = shelf.lock().unwrap().remove(0);
        assert_eq!(bytes.len() as u64, size);
        Ok(Arc::new(FakeRegion(bytes)) as Arc<dyn ShmMapping>)
    })
}

fn hello(offer: Option<u64>) -> Hello {
    Hello {
        max_concurrency: 4,
        methods: vec![
            MethodInfo {
                name: "echo".into(),
                kind: MethodKind::Unary,
                codecs: vec![0],
            },
            MethodInfo {
                name: "rows".into(),
                kind: MethodKind::Stream,
                codecs: vec![0],
            },
        ],
        extensions: HelloExtensions {
            shm: offer.map(|window| ShmOffer { window }),
        },
        ..Hello::new("lane-test", "1")
    }
}

/// An open pair; the WELCOME accepts `accept` (if the HELLO offered `offer`).
fn open(offer: Option<u64>, accept: Option<ShmAccept>) -> (Connection, Connection) {
    let mut worker = Connection::new_worker();
    let mut parent = Connection::new_parent();
    let mut wire = Vec::new();
    worker.send_hello(&hello(offer), &mut wire).unwrap();
    parent.receive(&wire);
    wire.clear();
    let Some(Event::Hello(h)) = parent.next_event().unwrap() else {
        panic!("no HELLO")
    };
    assert_eq!(h.extensions.shm, offer.map(|window| ShmOffer { window }));
    let welcome = Welcome {
        extensions: WelcomeExtensions { shm: accept },
        ..Welcome::for_hello(&h, 1).unwrap()
    };
    parent.send_welcome(&welcome, &mut wire).unwrap();
    worker.receive(&wire);
    let Some(Event::Welcome(w)) = worker.next_event().unwrap() else {
        panic!("no WELCOME")
    };
    assert_eq!(w.extensions.shm, accept);
    assert_eq!(parent.shm(), accept);
    assert_eq!(worker.shm(), accept);
    (parent, worker)
}

const BOTH: ShmAccept = ShmAccept {
    to_worker_window: 1 << 20,
    to_parent_window: 1 << 20,
};

fn lane_pair() -> (Connection, Connection, Shelf, Shelf) {
    let (mut parent, mut worker) = open(Some(1 << 20), Some(BOTH));
    let (to_worker, to_parent): (Shelf, Shelf) = Default::default();
    let maps = Arc::new(AtomicUsize::new(0));
    worker.set_shm_mapper(mapper(&to_worker, &maps));
    parent.set_shm_mapper(mapper(&to_parent, &maps));
    (parent, worker, to_worker, to_parent)
}

#[test]
fn without_extensions_the_handshake_is_version_1_byte_for_byte() {
    let h = hello(None);
    let mut with_default = Vec::new();
    Connection::new_worker()
        .send_hello(&h, &mut with_default)
        .unwrap();
    let mut offered = Vec::new();
    Connection::new_worker()
        .send_hello(&hello(Some(77)), &mut offered)
        .unwrap();
    // The offer is the only difference: 12 trailing bytes (tag, length, window).
    assert_eq!(offered.len(), with_default.len() + 12);
    assert_eq!(&offered[16..with_default.len()], &with_default[16..]);
    assert_eq!(
        &offered[with_default.len()..],
        &[1, 0, 8, 0, 77, 0, 0, 0, 0, 0, 0, 0]
    );
    let (parent, worker) = open(Some(77), None);
    assert!(parent.shm().is_none() && worker.shm().is_none());
}

#[test]
fn a_worker_refuses_an_acceptance_it_did_not_offer_or_above_its_window() {
    for (offer, accept) in [(None, BOTH), (Some(100), BOTH)] {
        let mut worker = Connection::new_worker();
        let mut wire = Vec::new();
        worker.send_hello(&hello(offer), &mut wire).unwrap();
        // The parent core checks the same rule before sending: write the WELCOME by hand.
        let h = hello(offer);
        let welcome = Welcome {
            extensions: WelcomeExtensions { shm: Some(accept) },
            ..Welcome::for_hello(&h, 1).unwrap()
        };
        let mut parent = Connection::new_parent();
        parent.receive(&wire);
        parent.next_event().unwrap();
        let refused = parent.send_welcome(&welcome, &mut Vec::new()).unwrap_err();
        assert_eq!(refused.code, ErrorCode::BadHandshake);
        let mut bytes = Vec::new();
        wirepool_proto::Frame::new(0, wirepool_proto::FrameBody::Welcome(welcome))
            .encode(&mut bytes)
            .unwrap();
        worker.receive(&bytes);
        assert_eq!(
            worker.next_event().unwrap_err().code,
            ErrorCode::BadHandshake
        );
    }
}

#[test]
fn with_the_lane_off_its_frame_types_are_unknown() {
    let (mut parent, mut worker) = open(Some(1 << 20), None);
    let mut frame = Vec::new();
    ShmFrame::Region {
        region: 1,
        size: 4096,
    }
    .encode(0, &mut frame);
    worker.receive(&frame);
    assert_eq!(
        worker.next_event().unwrap_err().code,
        ErrorCode::UnknownFrameType
    );
    // And nothing of the lane can be sent.
    let e = parent.send_shm_region(4096, &mut Vec::new()).unwrap_err();
    assert_eq!(e.code, ErrorCode::UnexpectedFrame);
    // A descriptor where the lane is off fails the connection at the next event.
    parent.shm_descriptors_received(1);
    assert_eq!(
        parent.next_event().unwrap_err().code,
        ErrorCode::ShmBadDescriptor
    );
}

#[test]
fn a_request_and_its_result_travel_as_views_and_every_range_is_released_once() {
    let (mut parent, mut worker, to_worker, to_parent) = lane_pair();
    let wakes = Arc::new(AtomicUsize::new(0));
    let w = wakes.clone();
    worker.set_shm_release_waker(Arc::new(move || {
        w.fetch_add(1, Ordering::SeqCst);
    }));

    // Parent -> worker: a region, then a request whose body is bytes 100..1100 of it.
    let region_bytes: Bytes = (0..4096u32).map(|i| i as u8).collect::<Vec<u8>>().into();
    let mut wire = Vec::new();
    let region = parent.send_shm_region(4096, &mut wire).unwrap();
    to_worker.lock().unwrap().push(region_bytes.clone());
    let range = ShmRange {
        region,
        offset: 100,
        length: 1000,
    };
    let id = parent.send_request_shm(0, 0, 0, range, &mut wire).unwrap();
    assert_eq!(parent.shm_lender().unwrap().lent_bytes(), 1000);
    worker.shm_descriptors_received(1);
    worker.receive(&wire);
    wire.clear();
    let Some(Event::Request { id: got, body, .. }) = worker.next_event().unwrap() else {
        panic!("no request")
    };
    assert_eq!(got, id);
    assert_eq!(&body[..], &region_bytes[100..1100]);
    assert!(!worker.has_shm_releases());
    let slice = body.slice(10..20);
    drop(body);
    assert!(!worker.has_shm_releases(), "a slice still holds the range");
    drop(slice);
    assert!(worker.has_shm_releases());
    assert_eq!(wakes.load(Ordering::SeqCst), 1);

    // Worker -> parent: the result in the worker's own region; the release goes with it.
    let result_bytes = Bytes::from(vec![9u8; 2048]);
    let theirs = worker.send_shm_region(2048, &mut wire).unwrap();
    to_parent.lock().unwrap().push(result_bytes.clone());
    let result = ShmRange {
        region: theirs,
        offset: 0,
        length: 2048,
    };
    assert_eq!(worker.send_shm_releases(&mut wire), 1);
    worker.send_result_shm(id, result, &mut wire).unwrap();
    parent.shm_descriptors_received(1);
    parent.receive(&wire);
    wire.clear();
    let Some(Event::Result { id: done, body }) = parent.next_event().unwrap() else {
        panic!("no result")
    };
    assert_eq!((done, &body[..]), (id, &result_bytes[..]));
    assert_eq!(parent.in_flight(), 0);
    assert_eq!(parent.shm_lender().unwrap().lent_bytes(), 0, "released");
    parent.send_shm_retire(region, &mut wire).unwrap();

    // The worker's region stays lent until the parent drops the view.
    assert_eq!(
        worker
            .send_shm_retire(theirs, &mut Vec::new())
            .unwrap_err()
            .code,
        ErrorCode::ShmBadRelease
    );
    drop(body);
    assert_eq!(parent.send_shm_releases(&mut wire), 1);
    worker.receive(&wire);
    wire.clear();
    assert!(worker.next_event().unwrap().is_none());
    assert_eq!(worker.shm_lender().unwrap().lent_bytes(), 0);
    worker.send_shm_retire(theirs, &mut wire).unwrap();
    parent.receive(&wire);
    assert!(parent.next_event().unwrap().is_none());
}

#[test]
fn a_stream_summary_can_travel_in_a_region() {
    let (mut parent, mut worker, _to_worker, to_parent) = lane_pair();
    let mut wire = Vec::new();
    let id = parent.send_request(1, 0, 0, b"", &mut wire).unwrap();
    worker.receive(&wire);
    wire.clear();
    assert!(matches!(
        worker.next_event().unwrap(),
        Some(Event::Request { .. })
    ));
    let mut rows = worker.rows(id, &mut wire).unwrap();
    rows.append(b"r").unwrap();
    rows.finish().unwrap();
    let region = worker.send_shm_region(64, &mut wire).unwrap();
    to_parent.lock().unwrap().push(Bytes::from(vec![5u8; 64]));
    let r = ShmRange {
        region,
        offset: 8,
        length: 50,
    };
    worker.send_end_shm(id, r, &mut wire).unwrap();
    parent.shm_descriptors_received(1);
    parent.receive(&wire);
    assert!(matches!(
        parent.next_event().unwrap(),
        Some(Event::Rows { .. })
    ));
    let Some(Event::End {
        row_count, summary, ..
    }) = parent.next_event().unwrap()
    else {
        panic!("no END")
    };
    assert_eq!((row_count, summary.len()), (1, 50));
}

#[test]
fn sends_outside_the_rules_are_refused_and_write_nothing() {
    let (mut parent, _worker, _, _) = lane_pair();
    let mut wire = Vec::new();
    let region = parent.send_shm_region(1000, &mut wire).unwrap();
    let before = wire.len();
    for (offset, length, code) in [
        (0, 1001, ErrorCode::ShmBounds),
        (1000, 1, ErrorCode::ShmBounds),
        (0, 0, ErrorCode::ShmBounds),
    ] {
        let r = ShmRange {
            region,
            offset,
            length,
        };
        let e = parent.send_request_shm(0, 0, 0, r, &mut wire).unwrap_err();
        assert_eq!(e.code, code, "{offset} + {length}");
    }
    let r = ShmRange {
        region,
        offset: 0,
        length: 10,
    };
    let e = parent.send_request_shm(9, 0, 0, r, &mut wire).unwrap_err();
    assert_eq!(e.code, ErrorCode::UnknownMethod);
    assert_eq!(wire.written(), before);
    assert_eq!(parent.shm_lender().unwrap().lent_bytes(), 0);
    assert_eq!(parent.in_flight(), 0);
    // Above the window (1 MiB).
    let e = parent.send_shm_region(1 << 20, &mut wire).unwrap_err();
    assert_eq!(e.code, ErrorCode::ShmBadRegion);
}

/// Bytes of a first frame with MORE and its prefix only, and the SHM_BODY after it.
fn result_then_body(id: u64, first_body: &[u8], r: ShmRange) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(first_body.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0x12, 0x01, 0, 0]);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(first_body);
    ShmFrame::Body(r).encode(id, &mut out);
    out
}

#[test]
fn the_receiver_checks_shm_body_against_its_message_and_region() {
    let r = ShmRange {
        region: 1,
        offset: 0,
        length: 10,
    };
    type Wire = Box<dyn Fn(u64) -> Vec<u8>>;
    let cases: Vec<(&str, Wire, ErrorCode)> = vec![
        (
            "after a body byte",
            Box::new(move |id| result_then_body(id, b"x", r)),
            ErrorCode::Continuation,
        ),
        (
            "no message in progress",
            Box::new(move |id| {
                let mut out = Vec::new();
                ShmFrame::Body(r).encode(id, &mut out);
                out
            }),
            ErrorCode::Continuation,
        ),
        (
            "a region never announced",
            Box::new(move |id| result_then_body(id, b"", ShmRange { region: 2, ..r })),
            ErrorCode::ShmBounds,
        ),
        (
            "past the region's end",
            Box::new(move |id| result_then_body(id, b"", ShmRange { offset: 60, ..r })),
            ErrorCode::ShmBounds,
        ),
        (
            "the id of no request",
            Box::new(move |id| result_then_body(id + 1, b"", r)),
            ErrorCode::UnknownId,
        ),
    ];
    for (what, bytes, code) in cases {
        let (mut parent, mut worker, _, to_parent) = lane_pair();
        let mut wire = Vec::new();
        let id = parent.send_request(0, 0, 0, b"q", &mut wire).unwrap();
        worker.receive(&wire);
        wire.clear();
        worker.next_event().unwrap();
        worker.send_shm_region(64, &mut wire).unwrap();
        to_parent.lock().unwrap().push(Bytes::from(vec![0u8; 64]));
        parent.shm_descriptors_received(1);
        parent.receive(&wire);
        parent.receive(&bytes(id));
        let got = loop {
            match parent.next_event() {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("{what}: accepted"),
                Err(e) => break e.code,
            }
        };
        assert_eq!(got, code, "{what}");
    }
}

#[test]
fn a_region_needs_its_descriptor_and_a_mapper() {
    let (mut parent, mut worker, _, _) = lane_pair();
    let mut wire = Vec::new();
    parent.send_shm_region(64, &mut wire).unwrap();
    worker.receive(&wire);
    assert_eq!(
        worker.next_event().unwrap_err().code,
        ErrorCode::ShmBadDescriptor
    );
    // Nine descriptors waiting is one too many.
    let (_parent, mut worker, _, _) = lane_pair();
    worker.shm_descriptors_received(8);
    worker.shm_descriptors_received(1);
    assert_eq!(
        worker.next_event().unwrap_err().code,
        ErrorCode::ShmBadDescriptor
    );
}

#[test]
fn a_region_may_arrive_in_the_read_that_holds_the_welcome() {
    let mut worker = Connection::new_worker();
    let mut wire = Vec::new();
    worker.send_hello(&hello(Some(1 << 20)), &mut wire).unwrap();
    let mut parent = Connection::new_parent();
    parent.receive(&wire);
    wire.clear();
    let Some(Event::Hello(h)) = parent.next_event().unwrap() else {
        panic!()
    };
    let welcome = Welcome {
        extensions: WelcomeExtensions { shm: Some(BOTH) },
        ..Welcome::for_hello(&h, 1).unwrap()
    };
    parent.send_welcome(&welcome, &mut wire).unwrap();
    parent.send_shm_region(64, &mut wire).unwrap();
    let shelf: Shelf = Arc::new(Mutex::new(vec![Bytes::from(vec![1u8; 64])]));
    let maps = Arc::new(AtomicUsize::new(0));
    worker.set_shm_mapper(mapper(&shelf, &maps));
    worker.shm_descriptors_received(1); // before the WELCOME is decoded
    worker.receive(&wire);
    assert!(matches!(
        worker.next_event().unwrap(),
        Some(Event::Welcome(_))
    ));
    assert!(worker.next_event().unwrap().is_none());
    assert_eq!(maps.load(Ordering::SeqCst), 1);
}
