//! Architecture invariant: `store_sm::machine` is pure. It names nothing of tokio,
//! openraft, RocksDB, the clock, the file system or a random source, and nothing in it
//! is async.

use std::fs;
use std::path::Path;

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
];

#[test]
fn the_machine_module_uses_no_io_clock_randomness_or_async() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/machine");
    let mut checked = 0;
    for entry in fs::read_dir(&dir).expect("src/machine exists") {
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
        checked >= 3,
        "expected the machine's source files, found {checked}"
    );
}
