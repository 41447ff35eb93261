//! The destination's read of one page's data at a time, raw or
//! compressed: the path a record with compressed pages takes, and the
//! callers that check each page themselves.

use super::{MigrateError, WireReader, PAGE_SIZE};
use crate::wire::compress::{decompress_page, MAX_COMPRESSED};
use crate::wire::Entry;
use std::io::Read;

impl<R: Read> WireReader<R> {
    /// Reads the next page's data of the last PAGES record into `dst`
    /// (one page), decompressing a compressed one; the caller checks its
    /// hash.
    ///
    /// # Errors
    /// [`MigrateError::Truncated`], [`MigrateError::Io`],
    /// [`MigrateError::Timeout`]; [`MigrateError::BadCompressedPage`]
    /// for a compressed page whose length is out of bounds (refused
    /// before it is read) or whose bytes do not decode to exactly a page
    /// (`dst` may then hold part of it); [`MigrateError::Setup`] when
    /// `dst` is not a page or every page of the record was read.
    pub fn read_page(&mut self, dst: &mut [u8]) -> Result<(), MigrateError> {
        let e = self.next_data_entry()?;
        if dst.len() != PAGE_SIZE {
            return Err(MigrateError::Setup(format!(
                "a buffer of {} bytes for a page of {PAGE_SIZE}",
                dst.len()
            )));
        }
        if e.compressed {
            self.read_compressed(e.gpa, dst)
        } else {
            self.fill(dst, "a PAGES record's data")
        }
    }

    /// The next entry of the last PAGES record that carries data.
    fn next_data_entry(&mut self) -> Result<Entry, MigrateError> {
        while let Some(e) = self.entries.get(self.cursor) {
            self.cursor += 1;
            if !e.zero {
                return Ok(*e);
            }
        }
        Err(MigrateError::Setup(
            "a page read past the last data page of a PAGES record".into(),
        ))
    }

    /// A compressed page's length and bytes, decompressed into `dst`.
    fn read_compressed(&mut self, gpa: u64, dst: &mut [u8]) -> Result<(), MigrateError> {
        let at_byte = self.record_at;
        let mut l = [0u8; 2];
        self.fill(&mut l, "a compressed page's length")?;
        let len = usize::from(u16::from_le_bytes(l));
        if len == 0 || len > MAX_COMPRESSED {
            return Err(MigrateError::BadCompressedPage {
                gpa,
                at_byte,
                why: format!("a length of {len} bytes (1 to {MAX_COMPRESSED})"),
            });
        }
        let mut buf = std::mem::take(&mut self.lz4);
        if buf.len() < MAX_COMPRESSED {
            buf = vec![0u8; MAX_COMPRESSED];
        }
        let r = self.fill(&mut buf[..len], "a compressed page");
        let r = r.and_then(|()| {
            decompress_page(&buf[..len], dst).map_err(|why| MigrateError::BadCompressedPage {
                gpa,
                at_byte,
                why,
            })
        });
        self.lz4 = buf;
        r
    }
}
