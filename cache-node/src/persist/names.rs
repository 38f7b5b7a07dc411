//! The names of the disk tier's entry files: the key's HMAC-SHA256 under a secret of
//! the volume (`<root>/name-key`), so a client cannot choose a key whose file lands on
//! another key's. The secret is made from the system's randomness when the volume is
//! first used, written readable by the node's user alone, and read again at every
//! start, so a restarted node finds its files. Pure but for that one file; must not
//! import anything of the crate.

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use ring::hmac;
use ring::rand::{SecureRandom as _, SystemRandom};

/// The file holding the volume's naming secret.
pub const NAME_KEY_FILE: &str = "name-key";
/// Bytes of the secret (HMAC-SHA256's block-sized key: 256 bits).
const NAME_KEY_BYTES: usize = 32;
/// Bytes of the tag kept in a file name (128 bits: no collision by chance either).
const NAME_BYTES: usize = 16;

/// Names files by their keys under the volume's secret.
pub struct FileNames {
    key: hmac::Key,
    shards: u32,
}

impl FileNames {
    /// Reads the volume's secret under `root`, making it first if there is none (or the
    /// one there is not a secret this tier wrote: the files it named are then found
    /// misnamed at reload and removed, as damaged files are).
    ///
    /// # Errors
    /// The I/O error if the secret can be neither read nor written.
    pub fn open(root: &Path, shards: u32) -> io::Result<Self> {
        let path = root.join(NAME_KEY_FILE);
        let secret = match fs::read(&path) {
            Ok(secret) if secret.len() == NAME_KEY_BYTES => secret,
            Ok(other) => {
                tracing::warn!(path = %path.display(), bytes = other.len(), "the file-name secret is not one this node wrote: making a new one (the files it named are removed at reload)");
                make_secret(root, &path)?
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => make_secret(root, &path)?,
            Err(err) => return Err(err),
        };
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &secret),
            shards: shards.max(1),
        })
    }

    /// The shard and file name of `key`.
    pub fn of(&self, key: &[u8]) -> (u32, String) {
        let tag = hmac::sign(&self.key, key);
        let tag = &tag.as_ref()[..NAME_BYTES];
        let first = u32::from_le_bytes([tag[0], tag[1], tag[2], tag[3]]);
        let name = tag.iter().map(|byte| format!("{byte:02x}")).collect();
        (first % self.shards, name)
    }
}

/// Whether `name` is an entry file's keyed name.
pub fn is_entry_name(name: &str) -> bool {
    name.len() == NAME_BYTES * 2 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `name` is an entry file's name from before the keyed names (the key's ring
/// hash, 64 bits in hex).
pub fn is_legacy_name(name: &str) -> bool {
    name.len() == 16 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Makes a secret and writes it to `path` (mode 0600, synced, renamed into place).
fn make_secret(root: &Path, path: &Path) -> io::Result<Vec<u8>> {
    let mut secret = vec![0u8; NAME_KEY_BYTES];
    SystemRandom::new()
        .fill(&mut secret)
        .map_err(|_| io::Error::other("the system's randomness is unavailable"))?;
    let temporary = root.join(format!(".tmp-{NAME_KEY_FILE}"));
    let written = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)?;
        file.write_all(&secret)?;
        file.sync_all()?;
        fs::rename(&temporary, path)?;
        fs::File::open(root)?.sync_all()
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written?;
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn names_are_stable_across_opens_and_differ_between_volumes() {
        let one = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let first = FileNames::open(one.path(), 16).unwrap();
        let again = FileNames::open(one.path(), 16).unwrap();
        let elsewhere = FileNames::open(other.path(), 16).unwrap();
        let (shard, name) = first.of(b"orders/2026");
        assert_eq!(again.of(b"orders/2026"), (shard, name.clone()));
        assert_ne!(
            elsewhere.of(b"orders/2026").1,
            name,
            "the secret is the volume's"
        );
        assert!(shard < 16);
        assert!(is_entry_name(&name), "{name}");
        assert!(!is_legacy_name(&name));
        assert!(is_legacy_name("00000000deadbeef"));
        let mode = fs::metadata(one.path().join(NAME_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "readable by the node alone");
    }

    #[test]
    fn a_damaged_secret_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let before = FileNames::open(dir.path(), 4).unwrap().of(b"k");
        fs::write(dir.path().join(NAME_KEY_FILE), b"short").unwrap();
        let after = FileNames::open(dir.path(), 4).unwrap().of(b"k");
        assert_ne!(before.1, after.1);
        assert_eq!(
            fs::read(dir.path().join(NAME_KEY_FILE)).unwrap().len(),
            NAME_KEY_BYTES
        );
    }
}
