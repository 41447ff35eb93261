//! A writer for the initramfs format: a gzip'd "newc" cpio archive
//! (Documentation/driver-api/early-userspace/buffer-format.rst).

use std::io::{self, Write};

use flate2::write::GzEncoder;
use flate2::Compression;

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

/// One archive member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory (mode bits).
    Dir(&'static str, u32),
    /// A regular file (mode bits, contents).
    File(String, u32, Vec<u8>),
    /// A symbolic link (target).
    Symlink(String, String),
    /// A character device (major, minor).
    CharDev(&'static str, u32, u32),
}

/// Writes `entries` (paths without a leading slash) as a gzip'd newc cpio.
///
/// # Errors
/// The writer's I/O errors; [`io::ErrorKind::InvalidInput`] for a member
/// over 4 GiB or a path that holds a NUL.
pub fn write_gz(entries: &[Entry], out: impl Write) -> io::Result<()> {
    let mut gz = GzEncoder::new(out, Compression::default());
    for (i, e) in entries.iter().enumerate() {
        let ino = i as u32 + 1;
        match e {
            Entry::Dir(p, m) => member(&mut gz, ino, p, S_IFDIR | m, 0, &[])?,
            Entry::File(p, m, d) => member(&mut gz, ino, p, S_IFREG | m, 0, d)?,
            Entry::Symlink(p, t) => member(&mut gz, ino, p, S_IFLNK | 0o777, 0, t.as_bytes())?,
            Entry::CharDev(p, maj, min) => {
                member(&mut gz, ino, p, S_IFCHR | 0o600, (*maj << 8) | *min, &[])?
            }
        }
    }
    member(&mut gz, 0, "TRAILER!!!", 0, 0, &[])?;
    gz.finish()?.flush()
}

fn pad4(w: &mut impl Write, len: usize) -> io::Result<()> {
    w.write_all(&[0u8; 3][..(4 - len % 4) % 4])
}

fn member(
    w: &mut impl Write,
    ino: u32,
    path: &str,
    mode: u32,
    rdev: u32,
    data: &[u8],
) -> io::Result<()> {
    let invalid =
        |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("cpio: {path}: {what}"));
    let size = u32::try_from(data.len()).map_err(|_| invalid("over 4 GiB"))?;
    if path.contains('\0') {
        return Err(invalid("path holds a NUL"));
    }
    let nlink = if mode & S_IFDIR != 0 { 2 } else { 1 };
    let namesize = path.len() as u32 + 1;
    let fields = [
        ino,
        mode,
        0,
        0,
        nlink,
        0,
        size,
        0,
        0,
        rdev >> 8,
        rdev & 0xff,
        namesize,
        0,
    ];
    let mut hdr = String::with_capacity(110);
    hdr.push_str("070701");
    for f in fields {
        hdr.push_str(&format!("{f:08x}"));
    }
    w.write_all(hdr.as_bytes())?;
    w.write_all(path.as_bytes())?;
    w.write_all(&[0])?;
    pad4(w, 110 + path.len() + 1)?;
    w.write_all(data)?;
    pad4(w, data.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Checked against GNU cpio where it is installed; otherwise against
    /// the format's fixed layout.
    #[test]
    fn writes_a_newc_archive() {
        let mut out = Vec::new();
        let entries = [
            Entry::Dir("dev", 0o755),
            Entry::CharDev("dev/console", 5, 1),
            Entry::File("init".into(), 0o755, b"#!/bin/sh\n".to_vec()),
            Entry::Symlink("bin/sh".into(), "busybox".into()),
        ];
        write_gz(&entries, &mut out).unwrap();
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&out[..])
            .read_to_end(&mut raw)
            .unwrap();
        assert_eq!(&raw[..6], b"070701");
        assert_eq!(raw.len() % 4, 0);
        let text = String::from_utf8_lossy(&raw);
        assert!(text.contains("dev/console\0"));
        assert!(text.contains("TRAILER!!!\0"));
        // The console: mode 020600, rdev major 5 minor 1.
        let at = text.find("dev/console").unwrap() - 110;
        let field = |i: usize| &text[at + 6 + 8 * i..at + 14 + 8 * i];
        assert_eq!(field(1), "00002180");
        assert_eq!((field(9), field(10)), ("00000005", "00000001"));
        let init = text.find("init\0").unwrap();
        let data_at = (init + 5).next_multiple_of(4);
        assert_eq!(&raw[data_at..data_at + 10], b"#!/bin/sh\n");
        let bad = [Entry::File("a\0b".into(), 0o644, vec![])];
        assert!(write_gz(&bad, Vec::new()).is_err());
    }
}
