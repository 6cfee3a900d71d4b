//! Fuzz target: the frame decoder. Any bytes either fail `Frame::decode` cleanly or give
//! a frame whose canonical encoding round-trips (decode(encode(f)) == f, a stable
//! encoding of `encoded_len` bytes), and `encode_batch` of the raw bytes decodes back to a
//! `Batch` of the same frames.

#![no_main]

use im_proto::{Body, Frame, Message as _};
use libfuzzer_sys::fuzz_target;

/// Batch nesting depth of a frame (prost refuses messages nested past 100 levels).
fn depth(f: &Frame) -> usize {
    match &f.body {
        Some(Body::Batch(b)) => 1 + b.frames.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(f) = Frame::decode(data) else {
        return;
    };
    let bytes = im_proto::encode(&f);
    assert_eq!(
        bytes.len(),
        f.encoded_len(),
        "encoded_len matches the encoding"
    );
    let g = Frame::decode(bytes.as_ref()).expect("a re-encoded frame decodes");
    assert_eq!(f, g, "decode(encode(f)) == f");
    assert_eq!(im_proto::encode(&g), bytes, "the encoding is stable");
    // Two levels deeper inside a batch (Frame -> Batch -> Frame): only when that stays
    // under prost's recursion limit, which the server's own batches always do.
    if depth(&f) < 40 {
        let batch = im_proto::encode_batch([data, bytes.as_ref()]);
        let b = Frame::decode(batch.as_ref()).expect("a batch of decodable frames decodes");
        assert_eq!(b.req_id, 0);
        match b.body {
            Some(Body::Batch(b)) => assert_eq!(b.frames, vec![f.clone(), f]),
            other => panic!("encode_batch gave {other:?}"),
        }
    }
});
