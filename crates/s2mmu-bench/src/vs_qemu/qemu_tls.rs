//! TLS with a pre-shared key for QEMU's own migration, so that QEMU's
//! connection is secured as ours is where ours runs two processes with
//! `--psk`: both QEMU processes get a `tls-creds-psk` object over a
//! directory holding `keys.psk` (GnuTLS's `identity:hexkey` lines), and
//! the migration parameter `tls-creds` names it on both sides before the
//! source connects.

use super::qmp::Qmp;
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::json;
use std::path::{Path, PathBuf};

/// The object id both QEMU processes give their credentials.
pub const CREDS_ID: &str = "s2mmu-psk";
/// The PSK identity (QEMU's default `username`).
const IDENTITY: &str = "qemu";
/// Bytes of a generated key.
const KEY_BYTES: usize = 32;

/// A directory holding one `keys.psk`, the credentials of one side.
#[derive(Clone, Debug)]
pub struct PskDir(PathBuf);

impl PskDir {
    /// Writes `dir/keys.psk` with `key` (hex digits) for QEMU's identity.
    ///
    /// # Errors
    /// A key that is not an even number of hex digits, or the directory or
    /// file could not be written.
    pub fn write(dir: &Path, key_hex: &str) -> Result<PskDir, String> {
        if key_hex.is_empty()
            || !key_hex.len().is_multiple_of(2)
            || !key_hex.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(format!(
                "QEMU PSK: {key_hex:?} is not an even number of hex digits"
            ));
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let file = dir.join("keys.psk");
        std::fs::write(&file, format!("{IDENTITY}:{key_hex}\n"))
            .map_err(|e| format!("{}: {e}", file.display()))?;
        Ok(PskDir(dir.into()))
    }

    /// Writes `dir/keys.psk` with a fresh random key.
    ///
    /// # Errors
    /// As [`PskDir::write`], or no random bytes from the system.
    pub fn random(dir: &Path) -> Result<PskDir, String> {
        let mut key = [0u8; KEY_BYTES];
        SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| "QEMU PSK: no random bytes from the system".to_string())?;
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        Self::write(dir, &hex)
    }

    /// The `-object` argument of one side: `server` on the destination
    /// (it listens; QEMU refuses a username there), `client` with the
    /// identity on the source.
    pub fn object(&self, server: bool) -> String {
        let dir = self.0.display();
        match server {
            true => format!("tls-creds-psk,id={CREDS_ID},endpoint=server,dir={dir}"),
            false => {
                format!("tls-creds-psk,id={CREDS_ID},endpoint=client,dir={dir},username={IDENTITY}")
            }
        }
    }
}

/// Tells one QEMU's migration to use the credentials (`tls-creds`).
///
/// # Errors
/// QMP refused the parameter.
pub fn use_creds(q: &mut Qmp) -> Result<(), String> {
    q.cmd("migrate-set-parameters", json!({ "tls-creds": CREDS_ID }))
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_file_and_objects_name_the_identity_and_each_end() {
        let dir = std::env::temp_dir().join(format!("s2mmu-psk-test-{}", std::process::id()));
        let p = PskDir::write(&dir, "00ff").expect("written");
        let text = std::fs::read_to_string(dir.join("keys.psk")).expect("read");
        assert_eq!(text, "qemu:00ff\n");
        assert!(p.object(true).contains("endpoint=server"));
        assert!(!p.object(true).contains("username"));
        assert!(p.object(false).contains("username=qemu"));
        assert!(p.object(false).contains("endpoint=client"));
        assert!(p.object(false).contains(&format!("dir={}", dir.display())));
        let r = PskDir::random(&dir).expect("random");
        let line = std::fs::read_to_string(dir.join("keys.psk")).expect("read");
        assert_eq!(line.trim_end().len(), "qemu:".len() + 2 * KEY_BYTES);
        assert_ne!(line, text);
        drop(r);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_key_that_is_not_hex_is_refused() {
        let dir = std::env::temp_dir().join("s2mmu-psk-test-refused");
        for bad in ["", "abc", "zz", "qemu:00"] {
            let e = PskDir::write(&dir, bad).unwrap_err();
            assert!(e.contains("hex digits"), "{bad}: {e}");
        }
        assert!(!dir.join("keys.psk").exists());
    }
}
