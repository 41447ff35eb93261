//! The control bodies that describe a guest: HEADER (what the destination
//! builds) and the opening of a connection.

use super::codec::{Dec, Enc};
use super::limits::{MAX_CHANNELS, MAX_MEM, MAX_SLOTS, MAX_VCPUS, PAGE_SIZE, SESSION_LEN};
use crate::stream_error::MigrateError;
use s2mmu::format::FormatId;

/// What the destination needs to build the same guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Bytes of guest memory.
    pub mem_size: u64,
    /// Memslots it is divided into.
    pub slots: u32,
    /// Guest-physical address of the first slot.
    pub gpa_base: u64,
    /// vCPUs the guest has (STATE must carry exactly these).
    pub vcpus: u32,
    /// Connections the stream is spread over (this one included).
    pub channels: u16,
    /// Backing name (selftests' names).
    pub backing: String,
    /// The source will send all of its memory again after the resume for
    /// a byte-for-byte comparison (the destination keeps a snapshot).
    pub verify_full: bool,
    /// Post-copy: two more connections than `channels` counts as data
    /// channels join, for page requests and their answers.
    pub postcopy: bool,
    /// The stage-2 format of the source's tables: the destination builds
    /// its guest on the same one, or refuses the stream.
    pub format: FormatId,
    /// The guest image's identity (a digest of its kernel and initramfs,
    /// say), when the guest has one: a destination told to expect one
    /// refuses any other.
    pub image: Option<[u8; IMAGE_ID_LEN]>,
}

/// Bytes of [`Header::image`].
pub const IMAGE_ID_LEN: usize = 32;

/// How a connection opens: the main one with the guest's header, a
/// further channel by joining the session the main one was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Opening {
    /// The main connection.
    Main(Header),
    /// Channel `channel` of the session `session`.
    Join {
        session: [u8; SESSION_LEN],
        channel: u16,
    },
}

impl Header {
    /// The HEADER record's body.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        let name = self.backing.as_bytes();
        e.u64(self.mem_size)
            .u32(PAGE_SIZE as u32)
            .u32(self.slots)
            .u64(self.gpa_base)
            .u32(self.vcpus)
            .u16(self.channels)
            .u8(name.len().min(255) as u8)
            .bytes(&name[..name.len().min(255)])
            .u8(u8::from(self.verify_full)
                | (u8::from(self.postcopy) << 1)
                | (u8::from(self.image.is_some()) << 2))
            .u8(self.format.code());
        if let Some(id) = &self.image {
            e.bytes(id);
        }
        e.0
    }

    /// Parses and checks a HEADER body against this build's bounds (the
    /// destination then checks it against its own limits).
    ///
    /// # Errors
    /// [`MigrateError::Malformed`].
    pub fn decode(body: &[u8], at_byte: u64) -> Result<Self, MigrateError> {
        let mut d = Dec::new(body, "HEADER", at_byte);
        let mem_size = d.u64()?;
        let page_size = d.u32()?;
        if page_size as usize != PAGE_SIZE {
            return Err(d.malformed(format!("page size {page_size}, expected {PAGE_SIZE}")));
        }
        let slots = d.u32()?;
        let gpa_base = d.u64()?;
        let vcpus = d.u32()?;
        let channels = d.u16()?;
        let n = d.u8()? as usize;
        let backing = String::from_utf8(d.bytes(n)?.to_vec())
            .map_err(|_| d.malformed("backing name is not UTF-8".into()))?;
        // The name reaches the destination's log in its errors: printable
        // ASCII only, so a peer cannot forge lines or drive a terminal.
        if !backing.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(d.malformed(format!("backing name {:?} is not printable ASCII", backing)));
        }
        let flags = d.u8()?;
        if flags > 7 {
            return Err(d.malformed(format!("unknown flags {flags:#04x}")));
        }
        let code = d.u8()?;
        let format = FormatId::from_code(code).ok_or_else(|| {
            let known = super::format::known_codes();
            d.malformed(format!("unknown stage-2 format {code} ({known})"))
        })?;
        let image = match flags & 4 {
            0 => None,
            _ => {
                let mut id = [0u8; IMAGE_ID_LEN];
                id.copy_from_slice(d.bytes(IMAGE_ID_LEN)?);
                Some(id)
            }
        };
        d.finish()?;
        if mem_size == 0 || !mem_size.is_multiple_of(PAGE_SIZE as u64) || mem_size > MAX_MEM {
            return Err(d.malformed(format!(
                "guest memory of {mem_size} bytes (whole pages, at most {MAX_MEM})"
            )));
        }
        if slots == 0 || slots > MAX_SLOTS {
            return Err(d.malformed(format!("{slots} memslots (1 to {MAX_SLOTS})")));
        }
        if vcpus == 0 || vcpus > MAX_VCPUS {
            return Err(d.malformed(format!("{vcpus} vCPUs (1 to {MAX_VCPUS})")));
        }
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(d.malformed(format!("{channels} channels (1 to {MAX_CHANNELS})")));
        }
        if gpa_base.checked_add(mem_size).is_none() || !gpa_base.is_multiple_of(PAGE_SIZE as u64) {
            return Err(d.malformed(format!(
                "guest memory at {gpa_base:#x} (page-aligned, below 2^64)"
            )));
        }
        Ok(Header {
            mem_size,
            slots,
            gpa_base,
            vcpus,
            channels,
            backing,
            verify_full: flags & 1 != 0,
            postcopy: flags & 2 != 0,
            format,
            image,
        })
    }
}
