//! Fuzz the shared-memory extension's decoders and bookkeeping (PROTOCOL.md 20). Input: one
//! selector byte, then data.
//!
//! - selector % 3 == 0: the data is an extension block. No panic; a block with entries
//!   re-encodes to the same bytes; an shm entry decodes as an offer and an acceptance, or is
//!   ignored as too short.
//! - == 1: the data's first byte is a frame type, the rest a payload. No panic; a decoded frame
//!   re-encodes to the same payload.
//! - == 2: the data drives a lender and a borrower of one direction (announce, lend, release,
//!   retire, descriptors). No panic; whatever the borrower accepts stays within its window and
//!   64 live regions, and the two sides agree on lent and live bytes when both accept.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wirepool_proto::shm::{
    encode_extension, parse_extensions, Borrower, Lender, ShmAccept, ShmFrame, ShmOffer,
    ShmRange, TAG_SHM,
};

fn u64_from(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = bytes.len().min(8);
    b[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(b)
}

fuzz_target!(|input: &[u8]| {
    let Some((&selector, data)) = input.split_first() else { return };
    match selector % 3 {
        0 => {
            let entries = parse_extensions(data);
            let mut again = Vec::new();
            for e in &entries {
                encode_extension(&mut again, e.tag, e.data);
                if e.tag == TAG_SHM {
                    assert_eq!(ShmOffer::decode(e.data).is_some(), e.data.len() >= 8);
                    assert_eq!(ShmAccept::decode(e.data).is_some(), e.data.len() >= 16);
                }
            }
            if !entries.is_empty() {
                assert_eq!(again, data, "an extension block re-encodes to its bytes");
            }
        }
        1 => {
            let Some((&t, payload)) = data.split_first() else { return };
            if let Ok(frame) = ShmFrame::decode(t, 9, payload) {
                let mut wire = Vec::new();
                frame.encode(9, &mut wire);
                assert_eq!(&wire[16..], payload);
                assert_eq!(wire[4], t);
            }
        }
        _ => {
            let window = u64_from(data.get(..3).unwrap_or(&[])) + 1;
            let mut lender = Lender::new(window);
            let mut borrower = Borrower::new(window);
            // A peer's arbitrary frames go to another pair, so the agreeing pair stays agreed.
            let mut hostile = Borrower::new(window);
            let mut confused = Lender::new(window);
            for op in data.get(3..).unwrap_or(&[]).chunks(6) {
                if op.len() < 2 {
                    break;
                }
                let arg = u64_from(&op[1..]);
                let region = (arg % 70) as u32 + 1;
                let range = ShmRange { region, offset: arg >> 8 & 0xff, length: arg >> 16 & 0xffff };
                match op[0] % 6 {
                    0 => {
                        if let Ok(id) = lender.announce(arg & 0xffff) {
                            borrower.descriptors_received(1).unwrap();
                            borrower.region(id, arg & 0xffff).unwrap();
                        }
                    }
                    1 => {
                        if lender.lend(range).is_ok() {
                            borrower.body(1, range).unwrap();
                        }
                    }
                    2 => {
                        if borrower.release(range).is_ok() {
                            lender.released(range).unwrap();
                        }
                    }
                    3 => {
                        if lender.retire(region).is_ok() {
                            borrower.retire(region).unwrap();
                        }
                    }
                    4 => {
                        let _ = hostile.descriptors_received((arg % 3) as usize);
                        let _ = hostile.region(region, arg & 0xffff);
                        let _ = hostile.body(2, range);
                        let _ = hostile.retire(region);
                    }
                    _ => {
                        let _ = confused.announce(arg & 0xff);
                        let _ = confused.lend(range);
                        let _ = confused.released(range);
                        let _ = confused.retire(region);
                    }
                }
                for b in [&borrower, &hostile] {
                    assert!(b.live_bytes() <= window && b.held_bytes() <= window);
                    assert!(b.queued_descriptors() <= 8);
                }
                for l in [&lender, &confused] {
                    assert!(l.live_bytes() <= window && l.lent_bytes() <= window);
                }
                assert_eq!(lender.lent_bytes(), borrower.held_bytes());
                assert_eq!(lender.live_bytes(), borrower.live_bytes());
            }
        }
    }
});
