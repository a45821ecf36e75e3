//! Fuzz random page access through the page index.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(mut reader) = cellfleet_ltx::PageReader::open(Cursor::new(data)) {
        let mut page = Vec::new();
        for at in 0..reader.index().len() {
            let _ = reader.read_entry(at, &mut page);
        }
        let _ = reader.verify();
    }
});
