//! Tidy checks of ARCHITECTURE.md's rules that the compiler cannot see, by reading the workspace's sources.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// "`layout.rs` is the only place that builds or parses bucket keys": no
/// other library or binary source spells a key's fixed parts.
#[test]
fn only_layout_spells_bucket_keys() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let layout = crates
        .join("authority/src/layout.rs")
        .canonicalize()
        .unwrap();
    let mut files = Vec::new();
    for krate in std::fs::read_dir(&crates).unwrap() {
        let src = krate.unwrap().path().join("src");
        if src.is_dir() {
            sources(&src, &mut files);
        }
    }
    assert!(files.len() > 50, "found only {} sources", files.len());
    let spellings = [
        "root.json",
        "\"cells/",
        "/ltx/",
        "\"nodes/",
        "\"logs/",
        ".seg\"",
        "cluster.json\"",
    ];
    let mut found = Vec::new();
    for file in files {
        if file.canonicalize().unwrap() == layout {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // Unit tests (at the end of a file, by house style) build fixtures.
        let code_lines = text
            .lines()
            .take_while(|line| line.trim() != "#[cfg(test)]");
        for (number, line) in code_lines.enumerate() {
            // Another system's layout (Litestream's file replicas) says so.
            if line.contains("tidy: not a bucket key") {
                continue;
            }
            let code = line.split("//").next().unwrap_or_default();
            for spelling in spellings {
                if code.contains(spelling) {
                    found.push(format!(
                        "{}:{}: {}",
                        file.display(),
                        number + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "bucket keys spelled outside authority/src/layout.rs:\n{}",
        found.join("\n")
    );
}
