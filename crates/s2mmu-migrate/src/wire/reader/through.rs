//! The destination's checked read of a PAGES record's data over a
//! connection that does not authenticate it: through a buffer in the
//! cache, each page hashed there before it is copied into place.

use super::{MigrateError, WireReader, PAGE_SIZE};
use crate::hash::page_hash;
use crate::stages::{RecvStages, StageObserver};
use crate::stream_store::{copy_streaming, fence_streaming};
use std::io::{IoSliceMut, Read};

impl<R: Read> WireReader<R> {
    /// The data of the record's pages read through `buf` (the reader's own
    /// buffer, reused): each read brings what the socket holds of them,
    /// each page it completes is hashed there, while the read's copy is
    /// still in the cache, and only a page whose hash matches is copied
    /// into its place, with streaming stores. Reading straight into guest
    /// memory and hashing the pages there read each page back from
    /// memory; the same copy with ordinary stores cost more than that
    /// (each cold line of guest memory is read before it is written).
    /// `obs` is told where each read begins and ends.
    pub(super) fn read_through(
        &mut self,
        buf: &mut [u8],
        pages: &mut [&mut [u8]],
        at_byte: u64,
        obs: &mut impl StageObserver<RecvStages>,
    ) -> Result<(), MigrateError> {
        let total = pages.len() * PAGE_SIZE;
        // The next entry to look at for a data page's hash.
        let mut want = 0usize;
        // Bytes read, and pages of them checked and copied into place.
        let (mut got, mut done) = (0usize, 0usize);
        while done < pages.len() {
            got += self.read_page_data(&mut [IoSliceMut::new(&mut buf[got..total])], obs)?;
            let complete = got / PAGE_SIZE;
            for (k, page) in pages.iter_mut().enumerate().take(complete).skip(done) {
                while self.entries[want].zero {
                    want += 1;
                }
                let e = self.entries[want];
                want += 1;
                let data = &buf[k * PAGE_SIZE..(k + 1) * PAGE_SIZE];
                if page_hash(data, e.gpa) != e.hash {
                    fence_streaming();
                    return Err(MigrateError::PageChecksum {
                        gpa: e.gpa,
                        at_byte,
                    });
                }
                copy_streaming(page, data);
            }
            fence_streaming();
            done = complete;
        }
        Ok(())
    }

    /// The data of a record with compressed pages, page by page: each
    /// page (its bytes read, decompressed when compressed) lands in the
    /// reader's page buffer, is hashed there (over any connection: a
    /// corrupt compressed page fails as a raw one does) and only then is
    /// copied into place with streaming stores. A page that fails leaves
    /// its place as it was. `obs` is told where each page's read begins
    /// and ends (the decompression inside it).
    pub(super) fn read_mixed(
        &mut self,
        pages: &mut [&mut [u8]],
        at_byte: u64,
        obs: &mut impl StageObserver<RecvStages>,
    ) -> Result<(), MigrateError> {
        let mut bounce = std::mem::take(&mut self.bounce);
        bounce.resize(PAGE_SIZE, 0);
        let mut r = Ok(());
        for page in pages.iter_mut() {
            let e = self
                .entries
                .iter()
                .skip(self.cursor)
                .find(|e| !e.zero)
                .copied();
            obs.inner_begin();
            let got = self.read_page(&mut bounce);
            obs.inner_end();
            if let Err(err) = got {
                r = Err(err);
                break;
            }
            let Some(e) = e else { break };
            if page_hash(&bounce, e.gpa) != e.hash {
                r = Err(MigrateError::PageChecksum {
                    gpa: e.gpa,
                    at_byte,
                });
                break;
            }
            copy_streaming(page, &bounce);
        }
        fence_streaming();
        self.bounce = bounce;
        r
    }
}
