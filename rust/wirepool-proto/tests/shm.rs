//! The shared-memory extension's sans-IO state (PROTOCOL.md section 20): the extension block,
//! the frames' bytes (against the spec's own example), and every check of the lender and the
//! borrower with its code, in the spec's order.

use std::path::PathBuf;

use wirepool_proto::shm::{
    encode_extension, frame_type, parse_extensions, Borrower, Lender, ShmAccept, ShmFrame,
    ShmOffer, ShmRange, MAX_LIVE_REGIONS, MAX_QUEUED_DESCRIPTORS, TAG_SHM,
};
use wirepool_proto::ErrorCode;

fn code<T: std::fmt::Debug>(r: Result<T, wirepool_proto::ProtocolError>) -> ErrorCode {
    r.expect_err("refused").code
}

#[test]
fn extension_blocks() {
    assert!(parse_extensions(&[]).is_empty());
    let mut block = Vec::new();
    ShmOffer { window: 1 << 30 }.encode(&mut block);
    encode_extension(&mut block, 0x8001, b"private");
    let entries = parse_extensions(&block);
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].tag, TAG_SHM);
    assert_eq!(
        ShmOffer::decode(entries[0].data),
        Some(ShmOffer { window: 1 << 30 })
    );
    assert_eq!((entries[1].tag, entries[1].data), (0x8001, &b"private"[..]));
    // An entry running past the end, or a header cut short: not an extension block, so no
    // entries at all (a v1 reader ignores trailing bytes; 20.1).
    for cut in 1..block.len() {
        let want = if cut == 12 { 1 } else { 0 }; // 12: exactly the first entry
        assert_eq!(parse_extensions(&block[..cut]).len(), want, "{cut}");
    }
    // A tag twice: ignored as a whole too.
    let mut twice = block.clone();
    ShmOffer { window: 1 }.encode(&mut twice);
    assert!(parse_extensions(&twice).is_empty());
    // Entries grow at their end: a longer shm entry is read, the rest ignored; a shorter one is
    // ignored (not offered, not accepted).
    let mut longer = Vec::new();
    encode_extension(&mut longer, TAG_SHM, &[7, 0, 0, 0, 0, 0, 0, 0, 0xAA, 0xBB]);
    let e = parse_extensions(&longer);
    assert_eq!(ShmOffer::decode(e[0].data).unwrap().window, 7);
    assert_eq!(ShmOffer::decode(&[0; 7]), None);
    assert_eq!(ShmAccept::decode(&[0; 15]), None);
}

#[test]
fn the_welcome_is_checked_against_the_hello() {
    let offer = ShmOffer { window: 1000 };
    let accept = |to_worker_window| ShmAccept {
        to_worker_window,
        to_parent_window: 5,
    };
    assert!(accept(1000).check(Some(offer)).is_ok());
    assert!(accept(0).check(Some(offer)).is_ok());
    assert_eq!(
        code(accept(1001).check(Some(offer))),
        ErrorCode::BadHandshake
    );
    assert_eq!(code(accept(1).check(None)), ErrorCode::BadHandshake);
    let mut bytes = Vec::new();
    accept(9).encode(&mut bytes);
    let e = parse_extensions(&bytes);
    assert_eq!(ShmAccept::decode(e[0].data), Some(accept(9)));
}

/// The hex digits of the example block in section 20.3 (`#` starts a comment).
fn spec_example() -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/PROTOCOL.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let section = doc.split("### 20.3 Frames").nth(1).expect("section 20.3");
    let block = section.split("```").nth(1).expect("the example block");
    let hex: String = block
        .lines()
        .map(|l| l.split('#').next().unwrap())
        .collect::<Vec<_>>()
        .join(" ");
    hex.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect()
}

#[test]
fn frames_match_the_spec_example() {
    // RESULT with MORE and an empty payload, then its SHM_BODY, then the parent's release.
    let range = ShmRange {
        region: 1,
        offset: 0,
        length: 256 << 20,
    };
    let mut ours = vec![0, 0, 0, 0, 0x12, 0x01, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0];
    ShmFrame::Body(range).encode(5, &mut ours);
    ShmFrame::Release(range).encode(0, &mut ours);
    assert_eq!(ours, spec_example());
    // And back.
    let body = &ours[16..56];
    assert_eq!(body[4], frame_type::SHM_BODY);
    assert_eq!(
        ShmFrame::decode(body[4], 5, &body[16..]).unwrap(),
        ShmFrame::Body(range)
    );
}

#[test]
fn every_frame_round_trips_and_bad_payloads_are_refused() {
    let frames = [
        ShmFrame::Region {
            region: 3,
            size: 1 << 33,
        },
        ShmFrame::Release(ShmRange {
            region: 9,
            offset: 4096,
            length: 1,
        }),
        ShmFrame::Retire { region: u32::MAX },
        ShmFrame::Body(ShmRange {
            region: 1,
            offset: u64::MAX,
            length: u64::MAX,
        }),
    ];
    for f in frames {
        let mut out = Vec::new();
        f.encode(7, &mut out);
        let len = ShmFrame::payload_len(f.type_byte()).unwrap();
        assert_eq!(out.len(), 16 + len);
        assert_eq!(&out[..4], &(len as u32).to_le_bytes());
        assert_eq!(&out[5..8], &[0, 0, 0], "flags and reserved");
        assert_eq!(ShmFrame::decode(out[4], 7, &out[16..]).unwrap(), f);
        // One byte short or long: BAD_PAYLOAD; the reserved field set: RESERVED_NONZERO.
        assert_eq!(
            code(ShmFrame::decode(out[4], 7, &out[16..out.len() - 1])),
            ErrorCode::BadPayload
        );
        let mut long = out[16..].to_vec();
        long.push(0);
        assert_eq!(
            code(ShmFrame::decode(out[4], 7, &long)),
            ErrorCode::BadPayload
        );
        let mut reserved = out[16..].to_vec();
        reserved[6] = 1;
        assert_eq!(
            code(ShmFrame::decode(out[4], 7, &reserved)),
            ErrorCode::ReservedNonzero
        );
    }
    assert_eq!(
        code(ShmFrame::decode(0x53, 0, &[0; 8])),
        ErrorCode::UnknownFrameType
    );
}

#[test]
fn the_borrower_checks_regions_in_the_spec_order() {
    let mut b = Borrower::new(10_000);
    // No descriptor yet: the frame's own checks come first, then the descriptor.
    assert_eq!(code(b.region(1, 0)), ErrorCode::ShmBadRegion);
    assert_eq!(code(b.region(1, 10_001)), ErrorCode::ShmBadRegion);
    assert_eq!(code(b.region(1, 100)), ErrorCode::ShmBadDescriptor);
    b.descriptors_received(2).unwrap();
    b.region(1, 6_000).unwrap();
    assert_eq!(b.queued_descriptors(), 1);
    assert_eq!(
        code(b.region(1, 10)),
        ErrorCode::ShmBadRegion,
        "id not above"
    );
    assert_eq!(code(b.region(2, 4_001)), ErrorCode::ShmBadRegion, "window");
    b.region(3, 4_000).unwrap();
    assert_eq!(b.live_bytes(), 10_000);
    // Descriptors waiting: at most 8.
    b.descriptors_received(MAX_QUEUED_DESCRIPTORS).unwrap();
    assert_eq!(code(b.descriptors_received(1)), ErrorCode::ShmBadDescriptor);
    // At most 64 live regions, whatever the window.
    let mut many = Borrower::new(u64::MAX);
    for region in 1..=MAX_LIVE_REGIONS as u32 {
        many.descriptors_received(1).unwrap();
        many.region(region, 1).unwrap();
    }
    many.descriptors_received(1).unwrap();
    assert_eq!(code(many.region(100, 1)), ErrorCode::ShmBadRegion);
    many.retire(1).unwrap();
    many.region(100, 1).unwrap();
}

#[test]
fn the_borrower_checks_bodies_releases_and_retires() {
    let mut b = Borrower::new(10_000);
    b.descriptors_received(1).unwrap();
    b.region(1, 8_000).unwrap();
    let r = |offset, length| ShmRange {
        region: 1,
        offset,
        length,
    };
    for bad in [
        r(0, 0),
        r(0, 8_001),
        r(8_000, 1),
        r(u64::MAX, 2),
        ShmRange {
            region: 2,
            offset: 0,
            length: 1,
        },
    ] {
        assert_eq!(code(b.body(4, bad)), ErrorCode::ShmBounds, "{bad:?}");
    }
    let e = b.body(4, r(0, 0)).unwrap_err();
    assert_eq!(e.id, 4, "the error names the request");
    b.body(4, r(0, 8_000)).unwrap();
    b.body(5, r(0, 2_000)).unwrap(); // the same bytes twice: held twice
    assert_eq!(b.held_bytes(), 10_000);
    assert_eq!(code(b.body(6, r(0, 1))), ErrorCode::ShmBounds, "window");
    // A retire while held is the owner's violation.
    assert_eq!(code(b.retire(1)), ErrorCode::ShmBadRelease);
    assert_eq!(code(b.release(r(1, 5))), ErrorCode::ShmBadRelease);
    b.release(r(0, 8_000)).unwrap();
    b.release(r(0, 2_000)).unwrap();
    assert_eq!(
        code(b.release(r(0, 2_000))),
        ErrorCode::ShmBadRelease,
        "twice"
    );
    b.retire(1).unwrap();
    assert_eq!(b.live_bytes(), 0);
    assert_eq!(code(b.retire(1)), ErrorCode::ShmBadRelease, "not live");
    assert_eq!(code(b.body(7, r(0, 1))), ErrorCode::ShmBounds, "retired");
}

#[test]
fn the_lender_keeps_within_its_window() {
    let mut l = Lender::new(1 << 20);
    assert_eq!(code(l.announce(0)), ErrorCode::ShmBadRegion);
    assert_eq!(code(l.announce((1 << 20) + 1)), ErrorCode::ShmBadRegion);
    let a = l.announce(1 << 19).unwrap();
    let b = l.announce(1 << 19).unwrap();
    assert_eq!((a, b), (1, 2));
    assert!(!l.can_announce(1));
    let whole = |region| ShmRange {
        region,
        offset: 0,
        length: 1 << 19,
    };
    l.lend(whole(a)).unwrap();
    l.lend(whole(b)).unwrap();
    assert_eq!(l.lent_bytes(), 1 << 20);
    assert_eq!(
        code(l.lend(ShmRange {
            region: a,
            offset: 0,
            length: 1
        })),
        ErrorCode::ShmBounds
    );
    assert!(l.is_lent(a));
    assert_eq!(code(l.retire(a)), ErrorCode::ShmBadRelease, "still lent");
    assert_eq!(
        code(l.released(ShmRange {
            region: a,
            offset: 1,
            length: 1
        })),
        ErrorCode::ShmBadRelease
    );
    l.released(whole(a)).unwrap();
    assert_eq!(l.retire(a).unwrap(), 1 << 19);
    assert_eq!(code(l.retire(a)), ErrorCode::ShmBadRelease, "not live");
    // Region ids keep rising after a retire.
    assert_eq!(l.announce(1 << 19).unwrap(), 3);
    assert_eq!(l.live_bytes(), 1 << 20);
}

#[test]
fn a_lender_and_a_borrower_agree_over_many_lends() {
    let window = 64 << 20;
    let mut owner = Lender::new(window);
    let mut receiver = Borrower::new(window);
    let mut held = Vec::new();
    let mut regions = Vec::new();
    for step in 0u64..2_000 {
        if regions.len() < 4 {
            let size = (4 + step % 5) << 20;
            let region = owner.announce(size).unwrap();
            receiver.descriptors_received(1).unwrap();
            receiver.region(region, size).unwrap();
            regions.push((region, size));
        }
        let (region, size) = regions[(step % regions.len() as u64) as usize];
        let range = ShmRange {
            region,
            offset: step % 1000,
            length: 1 + (step * 7919) % (size - 1000),
        };
        if owner.lend(range).is_ok() {
            receiver.body(step + 1, range).unwrap();
            held.push(range);
        }
        // Release the oldest now and then; retire an idle region.
        if step % 3 == 0 && !held.is_empty() {
            let r = held.remove(0);
            receiver.release(r).unwrap();
            owner.released(r).unwrap();
        }
        if step % 50 == 49 {
            if let Some(i) = regions.iter().position(|(r, _)| !owner.is_lent(*r)) {
                let (r, _) = regions.remove(i);
                owner.retire(r).unwrap();
                receiver.retire(r).unwrap();
            }
        }
        assert_eq!(owner.lent_bytes(), receiver.held_bytes());
        assert_eq!(owner.live_bytes(), receiver.live_bytes());
        assert!(owner.lent_bytes() <= window && owner.live_bytes() <= window);
    }
}

/// Every case of `spec/vectors/shm.json` (generated by `spec/vectors/shm_cases.py`).
#[test]
fn the_spec_vectors() {
    use serde_json::Value;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/vectors/shm.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let hex = |v: &Value| -> Vec<u8> {
        let s = v.as_str().unwrap();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    let int = |v: &Value| v.as_u64().unwrap();
    let want = |case: &Value| case["error"]["name"].as_str().map(str::to_owned);
    let got =
        |r: Result<(), wirepool_proto::ProtocolError>| r.err().map(|e| e.code.name().to_owned());
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 30);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let outcome = match case["kind"].as_str().unwrap() {
            "block" => {
                let data = hex(&case["hex"]);
                let entries = parse_extensions(&data);
                let listed: Vec<(u64, Vec<u8>)> = case["entries"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| (int(&e["tag"]), hex(&e["data"])))
                    .collect();
                let ours: Vec<(u64, Vec<u8>)> = entries
                    .iter()
                    .map(|e| (e.tag as u64, e.data.to_vec()))
                    .collect();
                assert_eq!(ours, listed, "{name}");
                let shm = entries.iter().find(|e| e.tag == TAG_SHM);
                let s = &case["shm"];
                if case["side"] == "hello" {
                    let offer = shm.and_then(|e| ShmOffer::decode(e.data));
                    assert_eq!(offer.map(|o| o.window), s["window"].as_u64(), "{name}");
                } else {
                    let a = shm.and_then(|e| ShmAccept::decode(e.data));
                    let want = (!s.is_null()).then(|| ShmAccept {
                        to_worker_window: int(&s["to_worker_window"]),
                        to_parent_window: int(&s["to_parent_window"]),
                    });
                    assert_eq!(a, want, "{name}");
                }
                None
            }
            "welcome_check" => {
                let offer = (!case["hello"].is_null()).then(|| ShmOffer {
                    window: int(&case["hello"]["window"]),
                });
                match case["welcome"].is_null() {
                    true => None,
                    false => got(ShmAccept {
                        to_worker_window: int(&case["welcome"]["to_worker_window"]),
                        to_parent_window: int(&case["welcome"]["to_parent_window"]),
                    }
                    .check(offer)),
                }
            }
            "frame" => {
                let data = hex(&case["hex"]);
                let id = u64::from_le_bytes(data[8..16].try_into().unwrap());
                match ShmFrame::decode(data[4], id, &data[16..]) {
                    Err(e) => Some(e.code.name().to_owned()),
                    Ok(frame) => {
                        let f = &case["frame"];
                        let range = || ShmRange {
                            region: int(&f["region"]) as u32,
                            offset: int(&f["offset"]),
                            length: int(&f["length"]),
                        };
                        let expected = match f["type"].as_str().unwrap() {
                            "SHM_REGION" => ShmFrame::Region {
                                region: int(&f["region"]) as u32,
                                size: int(&f["size"]),
                            },
                            "SHM_RELEASE" => ShmFrame::Release(range()),
                            "SHM_RETIRE" => ShmFrame::Retire {
                                region: int(&f["region"]) as u32,
                            },
                            _ => ShmFrame::Body(range()),
                        };
                        assert_eq!(frame, expected, "{name}");
                        assert_eq!(id, int(&f["id"]), "{name}");
                        let mut wire = Vec::new();
                        frame.encode(id, &mut wire);
                        assert_eq!(wire, data, "{name}: re-encoding");
                        None
                    }
                }
            }
            "borrower" => {
                let mut b = Borrower::new(int(&case["window"]));
                let steps = case["steps"].as_array().unwrap();
                let mut last = None;
                for (i, s) in steps.iter().enumerate() {
                    let r = || ShmRange {
                        region: int(&s["region"]) as u32,
                        offset: int(&s["offset"]),
                        length: int(&s["length"]),
                    };
                    let result = match s["op"].as_str().unwrap() {
                        "descriptors" => b.descriptors_received(int(&s["n"]) as usize),
                        "region" => b.region(int(&s["region"]) as u32, int(&s["size"])),
                        "body" => b.body(1, r()),
                        "release" => b.release(r()),
                        "retire" => b.retire(int(&s["region"]) as u32),
                        op => panic!("{name}: unknown op {op}"),
                    };
                    last = got(result);
                    if i + 1 < steps.len() {
                        assert_eq!(last, None, "{name}: step {i}");
                    }
                }
                last
            }
            kind => panic!("{name}: unknown kind {kind}"),
        };
        assert_eq!(outcome, want(case), "{name}");
    }
}

#[test]
fn a_lender_holds_what_keeps_a_lent_range_until_its_release() {
    use std::sync::Arc;
    let mut owner = Lender::new(1 << 30);
    let region = owner.announce(1 << 20).unwrap();
    let r = ShmRange {
        region,
        offset: 0,
        length: 10,
    };
    let keep = Arc::new(());
    let view = || bytes::Bytes::from_owner(Owner(keep.clone()));
    // Not lent: handed back.
    assert!(owner.hold(r, view()).is_err());
    owner.lend(r).unwrap();
    owner.lend(r).unwrap();
    owner.hold(r, view()).unwrap();
    owner.hold(r, view()).unwrap();
    assert!(owner.hold(r, view()).is_err(), "one hold per loan");
    assert_eq!(Arc::strong_count(&keep), 3);
    owner.released(r).unwrap();
    assert_eq!(Arc::strong_count(&keep), 2, "a release drops one hold");
    owner.drop_holds();
    assert_eq!(
        Arc::strong_count(&keep),
        1,
        "the peer is gone: nothing is held"
    );

    // Holds its `Arc` only to be counted.
    struct Owner(#[allow(dead_code)] Arc<()>);
    impl AsRef<[u8]> for Owner {
        fn as_ref(&self) -> &[u8] {
            b"0123456789"
        }
    }
}
