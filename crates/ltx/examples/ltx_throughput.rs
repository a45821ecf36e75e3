//! Encode and decode throughput of a 64 MiB database, next to raw LZ4 block
//! compression and decompression of the same pages measured in the same
//! run (the floor). Runs are interleaved (floor, ours, ours, floor, ...) and
//! medians reported, because the machine is small and noisy.
//!
//! `cargo run --release -p cellfleet-ltx --example ltx_throughput [-- MiB ROUNDS]`

use std::hint::black_box;
use std::time::{Duration, Instant};

use cellfleet_ltx::{Decoder, Encoder, Header, RollingChecksum, Txid};

const PAGE_SIZE: usize = 4096;

/// Pages that look like a database: row-like text, some repetition, some
/// incompressible blobs (about one page in eight).
fn database(mib: usize) -> Vec<Vec<u8>> {
    let pages = mib * 1024 * 1024 / PAGE_SIZE;
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..pages)
        .map(|p| {
            let mut page = vec![0u8; PAGE_SIZE];
            if p % 8 == 7 {
                for chunk in page.chunks_mut(8) {
                    chunk.copy_from_slice(&next().to_le_bytes()[..chunk.len()]);
                }
            } else {
                let mut at = 0;
                while at + 64 <= PAGE_SIZE {
                    let row = format!(
                        "row {:>8} name-{:>6} status=active v={:>12}|",
                        p * 50 + at,
                        next() % 1000,
                        next() % 100_000
                    );
                    let n = row.len().min(PAGE_SIZE - at);
                    page[at..at + n].copy_from_slice(&row.as_bytes()[..n]);
                    at += n;
                }
            }
            page
        })
        .collect()
}

fn plain_round(pages: &[Vec<u8>], commit: u32) -> (Duration, Duration) {
    let start = Instant::now();
    let mut header = Header::new(PAGE_SIZE as u32, commit, Txid(1), Txid(1));
    header.flags = cellfleet_ltx::HEADER_FLAG_NO_CHECKSUM;
    let mut encoder = Encoder::new(Vec::new(), header).unwrap();
    for (i, p) in pages.iter().enumerate() {
        encoder.encode_page(i as u32 + 1, p).unwrap();
    }
    let encoded = encoder.finish(cellfleet_ltx::Checksum::NONE).unwrap().0;
    let encode = start.elapsed();
    let start = Instant::now();
    let mut decoder = Decoder::new(&encoded[..]).unwrap();
    let mut page = Vec::new();
    while decoder.next_page(&mut page).unwrap().is_some() {
        black_box(&page);
    }
    decoder.finish().unwrap();
    (encode, start.elapsed())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn mbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / d.as_secs_f64()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let pages = database(mib);
    let bytes = pages.len() * PAGE_SIZE;
    let commit = pages.len() as u32;
    let mut rolling = RollingChecksum::new();
    for (i, p) in pages.iter().enumerate() {
        rolling.add_page(i as u32 + 1, p);
    }
    let post = rolling.value();

    let max = lz4_flex::block::get_maximum_output_size(PAGE_SIZE);
    // The floor's output is one contiguous buffer, as a file's would be.
    let mut compressed_all: Vec<u8> = Vec::new();
    let mut offsets: Vec<usize> = Vec::new();
    let mut encoded = Vec::new();
    let (mut lz4_c, mut lz4_d, mut enc, mut dec) = (vec![], vec![], vec![], vec![]);
    let (mut enc_plain, mut dec_plain) = (vec![], vec![]);
    for round in 0..rounds {
        let floor_first = round % 2 == 0;
        for pass in 0..2 {
            if (pass == 0) == floor_first {
                // Floor: raw LZ4 block compression then decompression.
                let start = Instant::now();
                let mut out = Vec::with_capacity(bytes);
                offsets.clear();
                offsets.push(0);
                let mut scratch = vec![0u8; max];
                // The strictest floor: one reused hash table, as the encoder uses.
                let mut table = lz4_flex::block::CompressTable::default();
                for p in &pages {
                    let n = lz4_flex::block::compress_into_with_table(p, &mut scratch, &mut table)
                        .unwrap();
                    out.extend_from_slice(&scratch[..n]);
                    offsets.push(out.len());
                }
                compressed_all = out;
                lz4_c.push(start.elapsed());
                let start = Instant::now();
                let mut page = vec![0u8; PAGE_SIZE];
                for w in offsets.windows(2) {
                    lz4_flex::block::decompress_into(&compressed_all[w[0]..w[1]], &mut page)
                        .unwrap();
                    black_box(&page);
                }
                lz4_d.push(start.elapsed());
            } else {
                let start = Instant::now();
                let header = Header::new(PAGE_SIZE as u32, commit, Txid(1), Txid(1));
                let mut encoder = Encoder::new(Vec::with_capacity(bytes), header).unwrap();
                for (i, p) in pages.iter().enumerate() {
                    encoder.encode_page(i as u32 + 1, p).unwrap();
                }
                encoded = encoder.finish(post).unwrap().0;
                enc.push(start.elapsed());
                let start = Instant::now();
                let mut decoder = Decoder::new(&encoded[..]).unwrap();
                let mut page = Vec::new();
                while decoder.next_page(&mut page).unwrap().is_some() {
                    black_box(&page);
                }
                decoder.finish().unwrap();
                dec.push(start.elapsed());
                // The same without checksum tracking (Litestream's mode):
                // no page checksums, only the file checksum.
                let (e, d) = plain_round(&pages, commit);
                enc_plain.push(e);
                dec_plain.push(d);
            }
        }
    }
    let compressed = compressed_all.len();
    let (c, d, e, f) = (median(lz4_c), median(lz4_d), median(enc), median(dec));
    let (ep, dp) = (median(enc_plain), median(dec_plain));
    println!("database: {mib} MiB, {} pages of {PAGE_SIZE} bytes; LTX file {} bytes (LZ4 payload {compressed}); {rounds} interleaved rounds, medians", pages.len(), encoded.len());
    println!("{:<36} {:>8} {:>8} {:>14}", "", "MB/s", "ms", "x floor");
    let row = |name: &str, took: Duration, floor: Duration| {
        println!(
            "{name:<36} {:>8.0} {:>8.1} {:>14.2}",
            mbps(bytes, took),
            took.as_secs_f64() * 1e3,
            took.as_secs_f64() / floor.as_secs_f64()
        );
    };
    row("floor: lz4 block compress", c, c);
    row("ltx encode (snapshot, checksums)", e, c);
    row("ltx encode (no checksum tracking)", ep, c);
    row("floor: lz4 block decompress", d, d);
    row("ltx decode (verify everything)", f, d);
    row("ltx decode (no checksum tracking)", dp, d);
}
