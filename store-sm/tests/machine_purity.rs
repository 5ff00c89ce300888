//! Architecture invariant: the task machine (`store-sm/machine`, crate `task-machine`,
//! re-exported as `store_sm::machine`) is pure. Its only dependencies are serde and imbl,
//! so it cannot link tokio, openraft, RocksDB or a random source; its source names
//! nothing of the clock, the file system, threads or the environment, and nothing in it
//! is async.

use std::fs;
use std::path::PathBuf;

/// The only crates the machine may depend on (dev-dependencies aside).
const ALLOWED_DEPENDENCIES: &[&str] = &["serde", "imbl"];

const FORBIDDEN: &[&str] = &[
    "tokio",
    "openraft",
    "rocksdb",
    "std::time",
    "SystemTime",
    "Instant",
    "std::fs",
    "std::net",
    "rand",
    "getrandom",
    "async ",
    ".await",
    "thread",
    "env::var",
    "planted",
];

/// This package's directory as `cargo test` names it when it runs the test, so that a
/// test binary built from a clone at another path (a shared target directory keeps it
/// when the sources are the same) reads this clone's files; the path it was built at
/// otherwise.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}

fn machine_dir() -> PathBuf {
    manifest_dir().join("machine")
}

#[test]
fn the_machine_crate_uses_no_io_clock_randomness_or_async() {
    let dir = machine_dir().join("src");
    let mut checked = 0;
    for entry in fs::read_dir(&dir).expect("machine/src exists") {
        let path = entry.expect("directory entry").path();
        let source = fs::read_to_string(&path).expect("readable source");
        for (number, line) in source.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in FORBIDDEN {
                assert!(
                    !code.contains(word),
                    "{}:{}: the pure machine must not use `{word}`: {line}",
                    path.display(),
                    number + 1
                );
            }
        }
        checked += 1;
    }
    assert!(
        checked >= 4,
        "expected the machine's source files, found {checked}"
    );
}

#[test]
fn the_machine_crate_depends_on_nothing_but_serde_and_imbl() {
    let manifest = fs::read_to_string(machine_dir().join("Cargo.toml")).expect("machine manifest");
    let dependencies = dependency_names(&manifest);
    assert!(
        dependencies.iter().any(|name| name == "serde"),
        "the dependency list was not found in {manifest}"
    );
    for name in &dependencies {
        assert!(
            ALLOWED_DEPENDENCIES.contains(&name.as_str()),
            "store-sm/machine/Cargo.toml: the pure machine must not depend on `{name}`; \
             it may depend on {ALLOWED_DEPENDENCIES:?} only"
        );
    }
}

/// Names of the non-dev dependencies in a Cargo manifest: keys of every
/// `[dependencies]`, `[build-dependencies]` and `[target.*.dependencies]` table, and the
/// names of `[dependencies.NAME]` tables.
fn dependency_names(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_dependencies = false;
    for line in manifest.lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if let Some(table) = line.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            let table = table.trim_matches(['[', ']']).trim();
            let is_dependency_table = table.split('.').any(|part| {
                part.trim_matches('"') == "dependencies" || part == "build-dependencies"
            });
            in_dependencies = false;
            if is_dependency_table {
                match table.rsplit_once("dependencies.") {
                    Some((_, name)) => names.push(name.trim_matches('"').to_string()),
                    None => in_dependencies = true,
                }
            }
            continue;
        }
        if in_dependencies && let Some((key, _)) = line.split_once('=') {
            let key = key.trim().trim_matches('"');
            names.push(key.split('.').next().unwrap_or(key).to_string());
        }
    }
    names
}

#[test]
fn dependency_names_sees_every_kind_of_dependency_table() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\nserde.workspace = true\n\
                    imbl = \"7\"\n[dev-dependencies]\nproptest = \"1\"\n\
                    [target.'cfg(unix)'.dependencies]\nlibc = \"0.2\"\n\
                    [build-dependencies]\ncc = \"1\"\n[dependencies.tokio]\nversion = \"1\"\n";
    assert_eq!(
        dependency_names(manifest),
        ["serde", "imbl", "libc", "cc", "tokio"]
    );
}
