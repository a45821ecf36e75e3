//! Fuzz the streaming LTX decoder: any bytes give a typed result, never a
//! panic or an allocation sized by the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(decoded) = cellfleet_ltx::decode_all(data) {
        // Anything that decodes re-encodes to a file that decodes the same.
        let mut pages: Vec<(u32, &[u8])> =
            decoded.pages.iter().map(|(p, d)| (*p, d.as_slice())).collect();
        let (bytes, _) = cellfleet_ltx::encode_to_vec(
            decoded.header,
            &mut pages,
            decoded.trailer.post_apply_checksum,
        )
        .expect("a decoded file re-encodes");
        let again = cellfleet_ltx::decode_all(&bytes).expect("re-encoded file decodes");
        assert_eq!(again.pages, decoded.pages);
        assert_eq!(again.header, decoded.header);
    }
});
