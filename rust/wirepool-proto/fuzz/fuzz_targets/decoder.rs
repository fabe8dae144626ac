//! Fuzz the stateless decoder. Input: one config byte, then the byte stream.
//! Config bit 7: limit 65,536 (else 1 MiB); bits 0-6: chunk size - 1.
//!
//! Checks: no panic; the same frames and error whatever the chunking; every decoded frame
//! re-encodes to bytes that decode to the same frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wirepool_proto::{decode_frame, Frame, FrameDecoder};

fn decode(data: &[u8], chunk: usize, limit: u32) -> (Vec<Frame>, Option<wirepool_proto::ErrorCode>) {
    let mut dec = FrameDecoder::new(limit);
    let mut frames = Vec::new();
    for piece in data.chunks(chunk.max(1)) {
        dec.receive(piece);
        loop {
            match dec.next_frame() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(e) => return (frames, Some(e.code)),
            }
        }
    }
    (frames, dec.end_of_input().err().map(|e| e.code))
}

fuzz_target!(|input: &[u8]| {
    let Some((&config, data)) = input.split_first() else { return };
    let limit = if config & 0x80 != 0 { 65_536 } else { 1 << 20 };
    let chunk = usize::from(config & 0x7f) + 1;

    let whole = decode(data, data.len(), limit);
    let chunked = decode(data, chunk, limit);
    assert_eq!(whole, chunked, "chunking changed the result");

    for frame in &whole.0 {
        let mut wire = Vec::new();
        frame.encode(&mut wire).expect("a decoded frame encodes");
        assert_eq!(wire.len(), frame.encoded_len());
        let again = decode_frame(&wire, limit).expect("a re-encoded frame decodes");
        assert_eq!(&again, frame, "round trip changed the frame");
    }
});
