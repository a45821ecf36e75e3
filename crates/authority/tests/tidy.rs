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

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every crate with a `src/` directory: its name (its directory under
/// `crates/`), that directory and the sources below it.
fn crate_sources() -> Vec<(String, PathBuf, Vec<PathBuf>)> {
    let mut out = Vec::new();
    for krate in std::fs::read_dir(crates_dir()).unwrap() {
        let dir = krate.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let src = dir.join("src");
        if src.is_dir() {
            let mut files = Vec::new();
            sources(&src, &mut files);
            out.push((name, src, files));
        }
    }
    out
}

/// Every crate's name (its directory under `crates/`) and its library and
/// binary sources, unit-test modules cut off (by house style they close a
/// file), comments and doc comments dropped: `(crate, file, line number,
/// code)`.
fn code_lines() -> Vec<(String, PathBuf, usize, String)> {
    let mut out = Vec::new();
    for (name, _, files) in crate_sources() {
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (number, line) in text
                .lines()
                .take_while(|line| line.trim() != "#[cfg(test)]")
                .enumerate()
            {
                let trimmed = line.trim_start();
                if trimmed.starts_with("//") {
                    continue;
                }
                let code = line.split("//").next().unwrap_or_default().to_owned();
                out.push((name.clone(), file.clone(), number + 1, code));
            }
        }
    }
    assert!(out.len() > 10_000, "found only {} lines of code", out.len());
    out
}

fn report(what: &str, found: &[String]) {
    assert!(found.is_empty(), "{what}:\n{}", found.join("\n"));
}

/// "Errors the code must act on are typed, never matched by their text":
/// no production code decides on the text of an error, a status or a
/// message (`.contains("…")` on one). Reading a child process's output
/// line is not an error's text and is not caught by the spelling below.
#[test]
fn no_decision_reads_an_error_s_text() {
    let receivers = [
        "message",
        "error",
        "err.",
        "err)",
        "status",
        "reason",
        "msg",
        "to_string()",
        "what",
    ];
    let found: Vec<String> = code_lines()
        .into_iter()
        .filter(|(_, _, _, code)| {
            code.contains(".contains(\"") && receivers.iter().any(|r| code.contains(r))
        })
        .map(|(_, file, line, code)| format!("{}:{line}: {}", file.display(), code.trim()))
        .collect();
    report(
        "decisions on error text (match a typed error instead)",
        &found,
    );
}

/// The wall clock is read in one place per component: `authority::clock`
/// (behind the injected `Clock`), `streams::clock`, the client library's
/// `now_ms` (it runs in applications, without the runtime) and the binary.
#[test]
fn the_wall_clock_is_read_only_in_the_clock_modules() {
    let allowed = [
        "authority/src/clock.rs",
        "streams/src/clock.rs",
        "client/src/client.rs",
    ];
    let found: Vec<String> = code_lines()
        .into_iter()
        .filter(|(krate, file, _, code)| {
            code.contains("SystemTime::now")
                && krate != "cellfleet"
                && !allowed
                    .iter()
                    .any(|a| file.to_string_lossy().replace('\\', "/").ends_with(a))
        })
        .map(|(_, file, line, code)| format!("{}:{line}: {}", file.display(), code.trim()))
        .collect();
    report("SystemTime::now outside the clock modules", &found);
}

/// Tasks are owned by the async shells only: the pure crates (`ltx`,
/// `authority`, `cell`, `proto`, `client`) never spawn a task or a thread.
#[test]
fn the_pure_crates_spawn_nothing() {
    let pure = ["ltx", "authority", "cell", "proto", "client"];
    let spawns = [
        "tokio::spawn",
        "spawn_blocking",
        "JoinSet",
        "thread::spawn",
        "task::spawn",
    ];
    let found: Vec<String> = code_lines()
        .into_iter()
        .filter(|(krate, _, _, code)| {
            pure.contains(&krate.as_str()) && spawns.iter().any(|s| code.contains(s))
        })
        .map(|(_, file, line, code)| format!("{}:{line}: {}", file.display(), code.trim()))
        .collect();
    report("tasks spawned in a pure crate", &found);
}

/// The `[dependencies]` of `crates/{name}/Cargo.toml`: their names.
fn dependencies(name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(crates_dir().join(name).join("Cargo.toml")).unwrap();
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            let name = line
                .split(['=', '.', ' '])
                .next()
                .unwrap_or_default()
                .to_owned();
            out.push(name);
        }
    }
    out
}

/// Every crate but `vfs` inherits the workspace lints, which forbid
/// `unsafe`; `vfs` (SQLite's C interface) sets its own.
#[test]
fn only_the_vfs_crate_may_use_unsafe() {
    let mut found = Vec::new();
    for krate in std::fs::read_dir(crates_dir()).unwrap() {
        let dir = krate.unwrap().path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let inherits = manifest.contains("[lints]\nworkspace = true");
        if name == "vfs" {
            if inherits || !manifest.contains("unsafe_op_in_unsafe_fn = \"deny\"") {
                found
                    .push("vfs: must set its own lints, with unsafe_op_in_unsafe_fn denied".into());
            }
        } else if !inherits {
            found.push(format!(
                "{name}: does not inherit the workspace lints (unsafe_code forbidden)"
            ));
        }
    }
    let workspace = std::fs::read_to_string(crates_dir().join("../Cargo.toml")).unwrap();
    if !workspace.contains("unsafe_code = \"forbid\"") {
        found.push("the workspace no longer forbids unsafe_code".into());
    }
    report(
        "crates outside the rule that only crates/vfs uses unsafe",
        &found,
    );
}

/// "Dependencies point down this tree only" (ARCHITECTURE.md's crate
/// tree): each crate has a layer, and may depend only on crates of lower
/// layers; `ltx` depends on no other crate of ours and on nothing async,
/// networked or SQLite; `client` links no SQLite and no S3 SDK.
#[test]
fn crate_dependencies_point_down() {
    let layers: &[(&str, u32)] = &[
        ("ltx", 0),
        ("proto", 0),
        ("store", 0),
        ("vfs", 0),
        ("authority", 1),
        ("cell", 1),
        ("client", 1),
        ("nodelog", 2),
        ("runtime", 3),
        ("router", 4),
        ("streams", 4),
        ("bench", 5),
        ("cellfleet", 6),
    ];
    let mut on_disk: Vec<String> = std::fs::read_dir(crates_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| crates_dir().join(name).join("Cargo.toml").is_file())
        .collect();
    on_disk.sort();
    let mut known: Vec<String> = layers.iter().map(|(n, _)| (*n).to_owned()).collect();
    known.sort();
    assert_eq!(on_disk, known, "every crate has a layer here");
    let layer = |name: &str| layers.iter().find(|(n, _)| *n == name).map(|(_, l)| *l);
    let mut found = Vec::new();
    for (name, own) in layers {
        for dependency in dependencies(name) {
            let Some(ours) = dependency.strip_prefix("cellfleet-") else {
                continue;
            };
            let Some(theirs) = layer(ours) else {
                found.push(format!("{name} depends on unknown crate {dependency}"));
                continue;
            };
            if theirs >= *own {
                found.push(format!(
                    "{name} (layer {own}) depends on {ours} (layer {theirs})"
                ));
            }
        }
    }
    for dependency in dependencies("ltx") {
        if dependency.starts_with("cellfleet-")
            || ["tokio", "rusqlite", "aws-sdk-s3", "hyper", "tonic"].contains(&dependency.as_str())
        {
            found.push(format!("ltx depends on {dependency}"));
        }
    }
    for dependency in dependencies("client") {
        if ["rusqlite", "aws-sdk-s3", "aws-config"].contains(&dependency.as_str()) {
            found.push(format!("client depends on {dependency}"));
        }
    }
    report("dependencies that do not point down", &found);
}

/// The modules of `crates/{krate}/src` (by file: `bench/report.rs` is
/// `bench::report`, `actor/mod.rs` is `actor`; the crate root is left out)
/// and, for each, the other modules its code names through `crate::`.
fn module_graph(
    krate: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    let src = crates_dir().join(krate).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut modules: BTreeMap<String, PathBuf> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap().with_extension("");
        let mut parts: Vec<String> = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        if parts == ["lib"] || parts == ["main"] {
            continue;
        }
        modules.insert(parts.join("::"), file);
    }
    let related = |a: &str, b: &str| {
        a == b || a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap();
        let code: Vec<&str> = text
            .lines()
            .take_while(|line| line.trim() != "#[cfg(test)]")
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect();
        let code = code.join("\n");
        let mut paths: Vec<String> = Vec::new();
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                paths.extend(group.split(',').map(|item| item.trim().to_owned()));
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(rest.len());
                paths.push(rest[..end].to_owned());
            }
        }
        let edges = graph.entry(module.clone()).or_default();
        for path in paths {
            let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
            let target = (1..=parts.len())
                .rev()
                .map(|n| parts[..n].join("::"))
                .find(|candidate| modules.contains_key(candidate));
            if let Some(target) = target {
                if !related(module, &target) {
                    edges.insert(target);
                }
            }
        }
    }
    graph
}

/// The groups of modules that depend on each other in a circle.
fn cycles(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    // Two modules are in one cycle when each reaches the other.
    let reach = |from: &str| {
        let mut seen = std::collections::BTreeSet::new();
        let mut pending = vec![from.to_owned()];
        while let Some(module) = pending.pop() {
            for next in graph.get(&module).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    pending.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: std::collections::BTreeMap<&String, _> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut found: Vec<Vec<String>> = Vec::new();
    for module in graph.keys() {
        let mut group: Vec<String> = graph
            .keys()
            .filter(|other| reaches[module].contains(*other) && reaches[other].contains(module))
            .cloned()
            .collect();
        if group.len() > 1 {
            group.sort();
            if !found.contains(&group) {
                found.push(group);
            }
        }
    }
    found
}

/// No two modules of a crate need each other: the code map reads as a
/// tree.
#[test]
fn no_module_cycles() {
    let mut found = Vec::new();
    for krate in std::fs::read_dir(crates_dir()).unwrap() {
        let name = krate.unwrap().file_name().to_string_lossy().into_owned();
        if !crates_dir().join(&name).join("src").is_dir() {
            continue;
        }
        for cycle in cycles(&module_graph(&name)) {
            found.push(format!("{name}: {}", cycle.join(" <-> ")));
        }
    }
    report("modules that depend on each other", &found);
    // The check sees real edges: the bench's report names the workloads
    // module.
    assert!(module_graph("bench")["report"].contains("workloads"));
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters (the only wildcard the code map uses).
fn matches_wildcard(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.starts_with(head)
                && (head.len()..=name.len())
                    .any(|at| name.is_char_boundary(at) && matches_wildcard(tail, &name[at..]))
        }
    }
}

/// "ARCHITECTURE.md's code map matches the tree": every library and binary
/// source file of every crate is named there (by its file name, its path
/// under `src/`, or, for a `mod.rs`, its directory), and every `*.rs` file
/// the document names in backticks exists. A file added, renamed or
/// removed without the map following fails here.
#[test]
fn the_code_map_names_every_source_file_and_only_those() {
    let root = crates_dir().join("..");
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let named = |text: &str| map.contains(&format!("`{text}`"));
    let mut every_file = Vec::new();
    for krate in std::fs::read_dir(crates_dir()).unwrap() {
        let dir = krate.unwrap().path();
        for sub in ["src", "tests", "examples", "benches"] {
            if dir.join(sub).is_dir() {
                sources(&dir.join(sub), &mut every_file);
            }
        }
    }
    let mut unnamed = Vec::new();
    for (_, src, files) in crate_sources() {
        for file in files {
            let relative = file
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            let known = match name.as_str() {
                // A crate's root, and unit tests split out of a module.
                "lib.rs" | "main.rs" | "tests.rs" => true,
                "mod.rs" => {
                    let parent = relative.trim_end_matches("mod.rs");
                    named(parent) || named(&relative)
                }
                _ => named(&name) || named(&relative),
            };
            if !known {
                let shown = file.strip_prefix(crates_dir()).unwrap_or(&file);
                unnamed.push(format!("crates/{}", shown.display()));
            }
        }
    }
    report(
        "source files ARCHITECTURE.md's code map does not name (add a line saying what each is for)",
        &unnamed,
    );
    let every_file: Vec<String> = every_file
        .iter()
        .map(|f| {
            f.canonicalize()
                .unwrap()
                .strip_prefix(root.canonicalize().unwrap())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let mut absent = Vec::new();
    for mention in map.split('`').skip(1).step_by(2) {
        if !mention.ends_with(".rs") || mention.contains(char::is_whitespace) {
            continue;
        }
        let exists = every_file.iter().any(|file| {
            matches_wildcard(mention, file)
                || file
                    .rsplit_once('/')
                    .is_some_and(|_| matches_wildcard(&format!("*/{mention}"), file))
        });
        if !exists {
            absent.push(mention.to_owned());
        }
    }
    report(
        "files ARCHITECTURE.md names that are not in the tree (rename or remove the mention)",
        &absent,
    );
}
