//! What each page compression costs and saves on real pages: every page of
//! the LTX files given (files, or directories searched for `*.ltx`; node
//! log segments are not LTX files and are skipped) is compressed again as
//! one LZ4 block by a full LZ4 search and by runs of one byte only, and the bytes
//! and the time are summed. Time is the median of interleaved rounds
//! (`Lz4`, `Runs`, `Runs`, `Lz4`, ...), because the machine is
//! small and noisy.
//!
//! `cargo run --release -p cellfleet-ltx --example ltx_compression -- PATH...`

use std::path::{Path, PathBuf};
use std::time::Instant;

use cellfleet_ltx::{
    decode_all, Checksum, Compression, Encoder, Header, Txid, HEADER_FLAG_NO_CHECKSUM,
};

fn ltx_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let Ok(entries) = std::fs::read_dir(path) else {
            return;
        };
        for entry in entries.flatten() {
            ltx_files(&entry.path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "ltx") {
        out.push(path.to_path_buf());
    }
}

/// Encode `pages` as `compression`, one delta file per page size (pages
/// numbered from 1 in the order given); returns the files' bytes. Both
/// compressions write the same header, index and trailer.
fn encode(pages: &[Vec<u8>], compression: Compression) -> u64 {
    let mut sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut total = 0u64;
    for size in sizes {
        let of_size: Vec<&Vec<u8>> = pages.iter().filter(|p| p.len() == size).collect();
        let mut header = Header::new(size as u32, of_size.len() as u32, Txid(2), Txid(2));
        header.flags = HEADER_FLAG_NO_CHECKSUM;
        let mut encoder = Encoder::with_compression(Vec::new(), header, compression).unwrap();
        for (i, page) in of_size.iter().enumerate() {
            encoder.encode_page(i as u32 + 1, page).unwrap();
        }
        let (bytes, _) = encoder.finish(Checksum::NONE).unwrap();
        total += bytes.len() as u64;
    }
    total
}

fn main() {
    let mut files = Vec::new();
    for arg in std::env::args().skip(1) {
        ltx_files(Path::new(&arg), &mut files);
    }
    let mut pages = Vec::new();
    for file in &files {
        let Ok(bytes) = std::fs::read(file) else {
            continue;
        };
        if let Ok(decoded) = decode_all(&bytes) {
            pages.extend(decoded.pages.into_iter().map(|(_, page)| page));
        }
    }
    if pages.is_empty() {
        eprintln!("no LTX pages found under the paths given; pass LTX files or directories");
        std::process::exit(2);
    }
    let raw: u64 = pages.iter().map(|p| p.len() as u64).sum();
    let mut times = [Vec::new(), Vec::new()];
    let mut sizes = [0u64, 0u64];
    let order = [
        Compression::Lz4,
        Compression::Runs,
        Compression::Runs,
        Compression::Lz4,
    ];
    for _ in 0..3 {
        for &compression in &order {
            let at = Instant::now();
            let size = encode(&pages, compression);
            let slot = usize::from(compression == Compression::Runs);
            times[slot].push(at.elapsed().as_secs_f64());
            sizes[slot] = size;
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let lz4 = median(&mut times[0]);
    let runs = median(&mut times[1]);
    println!(
        "{} files, {} pages, {} raw page bytes",
        files.len(),
        pages.len(),
        raw
    );
    for (name, size, time) in [("Lz4", sizes[0], lz4), ("Runs", sizes[1], runs)] {
        println!(
            "{name:>9}: {size:>12} bytes encoded ({:.3} of raw), {:.2} us per page",
            size as f64 / raw as f64,
            time * 1e6 / pages.len() as f64
        );
    }
    println!(
        "Runs / Lz4: {:.3} bytes, {:.3} time",
        sizes[1] as f64 / sizes[0] as f64,
        runs / lz4
    );
}
