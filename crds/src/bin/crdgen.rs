//! `crdgen`: writes the CacheCluster and CacheInvalidation CRDs into the Helm chart and the CRD reference into
//! `docs/`, or with `--check` fails when the committed files differ from what it would
//! write (the CI drift check).
//!
//! ```text
//! cargo run -p crds --bin crdgen            # regenerate both files
//! cargo run -p crds --bin crdgen -- --check # exit 1 if either is stale
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crds::generate;

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!("crdgen: unknown argument '{other}'; usage: crdgen [--check]");
            return ExitCode::from(2);
        }
    };
    match run(check) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(message) => {
            eprintln!("crdgen: {message}");
            ExitCode::from(2)
        }
    }
}

/// Generates both files; returns whether everything is up to date (always true when
/// writing).
fn run(check: bool) -> Result<bool, String> {
    // At run time, not env!: a binary reused by a fresh clone must write into that clone.
    let root = Path::new(
        &std::env::var_os("CARGO_MANIFEST_DIR")
            .ok_or("CARGO_MANIFEST_DIR is not set: run it as `cargo run -p crds --bin crdgen`")?,
    )
    .join("..");
    let crd = generate::crd_json().map_err(|e| e.to_string())?;
    let outputs = [
        (
            generate::CRD_PATH,
            generate::crd_yaml().map_err(|e| e.to_string())?,
        ),
        (
            generate::INVALIDATION_CRD_PATH,
            generate::invalidation_crd_yaml().map_err(|e| e.to_string())?,
        ),
        (
            generate::REFERENCE_PATH,
            generate::reference::reference(&crd).map_err(|e| e.to_string())?,
        ),
    ];
    let mut fresh = true;
    for (relative, text) in outputs {
        let path: PathBuf = root.join(relative);
        let current = std::fs::read_to_string(&path).ok();
        if current.as_deref() == Some(text.as_str()) {
            println!("crdgen: {relative} is up to date");
            continue;
        }
        if check {
            eprintln!(
                "crdgen: {relative} differs from the generated version; run `cargo run -p crds --bin crdgen` and commit the result"
            );
            fresh = false;
            continue;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("crdgen: wrote {relative}");
    }
    Ok(fresh)
}
