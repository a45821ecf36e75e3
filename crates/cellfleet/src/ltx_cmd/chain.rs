//! Choosing and applying a restore chain from a Litestream file replica.
//!
//! A restore starts at the latest snapshot that verifies (a file whose min
//! TXID is 1) and then, at each position, applies the verified file that
//! extends it furthest (compactions before per-sync files), falling back to
//! shorter files when a longer one is damaged. Each file is verified in
//! full before any of its pages touch the database.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use cellfleet_ltx::{Position, Txid};

/// One LTX file found in a replica directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaFile {
    pub path: PathBuf,
    pub level: u32,
    pub min: Txid,
    pub max: Txid,
}

/// List every `DIR/ltx/<level>/<min>-<max>.ltx`. Other names are ignored.
pub fn scan_replica(dir: &Path) -> anyhow::Result<Vec<ReplicaFile>> {
    let ltx = dir.join("ltx");
    let levels = std::fs::read_dir(&ltx).with_context(|| {
        format!(
            "cannot read {}: not a Litestream file replica",
            ltx.display()
        )
    })?;
    let mut files = Vec::new();
    for level in levels {
        let level = level?;
        let Some(level_number) = level
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if !level.file_type()?.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(level.path())? {
            let entry = entry?;
            let name = entry.file_name();
            let Some((min, max)) = name.to_str().and_then(cellfleet_ltx::parse_file_name) else {
                continue;
            };
            files.push(ReplicaFile {
                path: entry.path(),
                level: level_number,
                min,
                max,
            });
        }
    }
    files.sort_by_key(|f| (f.min, f.max, f.level));
    Ok(files)
}

fn verify(file: &ReplicaFile) -> anyhow::Result<()> {
    let reader = BufReader::new(File::open(&file.path)?);
    let (header, _) = cellfleet_ltx::verify(reader)?;
    if (header.min_txid, header.max_txid) != (file.min, file.max) {
        bail!(
            "header says txid {}..={} but the name says {}..={}",
            header.min_txid.0,
            header.max_txid.0,
            file.min.0,
            file.max.0
        );
    }
    Ok(())
}

/// Files starting at `min`, longest reach first, at most `target`.
fn candidates(files: &[ReplicaFile], min: Txid, target: Option<Txid>) -> Vec<&ReplicaFile> {
    let mut found: Vec<&ReplicaFile> = files
        .iter()
        .filter(|f| f.min == min && target.is_none_or(|t| f.max <= t))
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse((f.max, f.level)));
    found
}

/// Apply the best chain to `db` (an empty scratch file). Returns the files
/// used, the final position and the page size.
pub fn choose_chain(
    files: &[ReplicaFile],
    target: Option<Txid>,
    db: &mut File,
) -> anyhow::Result<(Vec<ReplicaFile>, Position, u32)> {
    let mut problems = Vec::new();
    for snapshot in candidates(files, Txid(1), target) {
        db.set_len(0)?;
        match extend_from(snapshot, files, target, db, &mut problems) {
            Ok(done) => {
                if let Some(t) = target {
                    if done.1.txid != t {
                        problems.push(format!(
                            "the chain from {} stops at txid {}, before {}",
                            snapshot.path.display(),
                            done.1.txid.0,
                            t.0
                        ));
                        continue;
                    }
                }
                return Ok(done);
            }
            Err(e) => problems.push(format!("{}: {e:#}", snapshot.path.display())),
        }
    }
    if problems.is_empty() {
        bail!("no snapshot (a file starting at txid 1) in the replica");
    }
    bail!("no usable chain:\n  {}", problems.join("\n  "))
}

fn extend_from(
    snapshot: &ReplicaFile,
    files: &[ReplicaFile],
    target: Option<Txid>,
    db: &mut File,
    problems: &mut Vec<String>,
) -> anyhow::Result<(Vec<ReplicaFile>, Position, u32)> {
    verify(snapshot)?;
    let mut position = cellfleet_ltx::apply(
        db,
        BufReader::new(File::open(&snapshot.path)?),
        Position::EMPTY,
    )?;
    let page_size = {
        let mut header = [0u8; cellfleet_ltx::HEADER_SIZE];
        std::io::Read::read_exact(&mut File::open(&snapshot.path)?, &mut header)?;
        cellfleet_ltx::Header::decode(&header)?.page_size
    };
    let mut chain = vec![snapshot.clone()];
    'extend: while let Some(next_min) = position.txid.next() {
        for file in candidates(files, next_min, target) {
            if let Err(e) = verify(file) {
                problems.push(format!("{}: {e:#}", file.path.display()));
                continue;
            }
            position = cellfleet_ltx::apply(db, BufReader::new(File::open(&file.path)?), position)
                .with_context(|| format!("applying {}", file.path.display()))?;
            chain.push(file.clone());
            continue 'extend;
        }
        break;
    }
    Ok((chain, position, page_size))
}
