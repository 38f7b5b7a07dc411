//! Golden-file checks for builder output: JSON under `operator/tests/golden/`,
//! compared with a readable diff. `UPDATE_GOLDEN=1 cargo test` rewrites the files.
//!
//! Test code (`#[cfg(test)]`): owns the golden-file comparison; the builders under test
//! must not import it outside their tests.

use std::path::PathBuf;

/// Compares `value` as pretty JSON with the golden file `name`.
pub fn assert_golden<T: serde::Serialize>(name: &str, value: &T) {
    // At run time, not env!: a test binary a fresh clone reuses must compare that clone's
    // golden files (scripts/source-mtimes).
    let path = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR"),
    )
    .join("tests/golden")
    .join(name);
    let actual = serde_json::to_string_pretty(value).unwrap() + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing {}; run with UPDATE_GOLDEN=1", path.display()));
    pretty_assertions::assert_eq!(expected, actual, "{} differs", path.display());
}
