//! The state encoding: a VM's vCPU and device state as bytes that can
//! cross a wire or sit in a file, and be refused by name when damaged or
//! foreign.
//!
//! Layout (little endian):
//!
//! | field | bytes |
//! |---|---|
//! | magic `S2MMUSTA` | 8 |
//! | version | 4 |
//! | VM kind (whose state this is) | 4 |
//! | section count | 4 |
//! | per section: tag, length, bytes | 4 + 4 + length |
//! | XXH3-64 of everything before | 8 |
//!
//! Every count and length is checked against [`MAX_SECTIONS`],
//! [`MAX_SECTION_LEN`] and the bytes actually present before anything is
//! allocated, and the checksum is checked before any section is parsed,
//! so damage is reported as damage and not as a strange register value.

use std::fmt;

/// The first 8 bytes of every encoded state.
pub const MAGIC: [u8; 8] = *b"S2MMUSTA";
/// The encoding version this crate writes and reads.
pub const VERSION: u32 = 1;
/// Most sections in one state.
pub const MAX_SECTIONS: u32 = 256;
/// Most bytes in one section.
pub const MAX_SECTION_LEN: u32 = 1 << 20;
/// Most bytes of one encoded state (header, sections, checksum).
pub const MAX_STATE_LEN: usize = 16 << 20;
const HEADER_LEN: usize = 20;

/// Why an encoded state was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateError {
    /// The bytes end before `what`.
    Truncated {
        /// The field that is cut.
        what: String,
    },
    /// The first 8 bytes are not [`MAGIC`].
    BadMagic {
        /// What they are.
        found: [u8; 8],
    },
    /// A version this build does not read.
    Version {
        /// The version in the bytes.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The state of another kind of VM.
    ForeignKind {
        /// The kind in the bytes.
        found: u32,
        /// The kind the destination runs.
        expected: u32,
    },
    /// A count or length over its bound.
    TooLarge {
        /// What was counted.
        what: String,
        /// Its value.
        value: u64,
        /// The bound.
        max: u64,
    },
    /// The checksum does not match the bytes.
    Checksum {
        /// The checksum the bytes carry.
        stored: u64,
        /// The checksum of the bytes.
        computed: u64,
    },
    /// Bytes after the checksum.
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// A section the VM needs is absent.
    MissingSection {
        /// Its tag.
        tag: u32,
    },
    /// A section appears twice.
    DuplicateSection {
        /// Its tag.
        tag: u32,
    },
    /// A section's content is wrong (its size, or a value out of range).
    BadSection {
        /// Its tag.
        tag: u32,
        /// What is wrong.
        what: String,
    },
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::Truncated { what } => write!(f, "state truncated: it ends before {what}"),
            StateError::BadMagic { found } => {
                write!(
                    f,
                    "not an s2mmu state: magic {found:02x?}, want {MAGIC:02x?}"
                )
            }
            StateError::Version { found, supported } => write!(
                f,
                "state version {found}: this build reads version {supported} only"
            ),
            StateError::ForeignKind { found, expected } => write!(
                f,
                "state of VM kind {found:#x}, but the destination is kind {expected:#x}"
            ),
            StateError::TooLarge { what, value, max } => {
                write!(f, "state's {what} is {value}, more than the bound {max}")
            }
            StateError::Checksum { stored, computed } => write!(
                f,
                "state damaged: checksum {stored:#018x} stored, {computed:#018x} computed"
            ),
            StateError::TrailingBytes { extra } => {
                write!(f, "state has {extra} bytes after its checksum")
            }
            StateError::MissingSection { tag } => write!(f, "state lacks section {tag:#x}"),
            StateError::DuplicateSection { tag } => {
                write!(f, "state has section {tag:#x} twice")
            }
            StateError::BadSection { tag, what } => {
                write!(f, "state section {tag:#x}: {what}")
            }
        }
    }
}

impl std::error::Error for StateError {}

/// A VM's state as tagged sections, before encoding or after decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    kind: u32,
    sections: Vec<(u32, Vec<u8>)>,
}

impl State {
    /// An empty state of VM kind `kind` (a code each VM type picks, so
    /// that one kind's state is never loaded into another).
    pub fn new(kind: u32) -> State {
        State {
            kind,
            sections: Vec::new(),
        }
    }

    /// The VM kind.
    pub fn kind(&self) -> u32 {
        self.kind
    }

    /// Adds section `tag`.
    ///
    /// # Errors
    /// [`StateError::DuplicateSection`], or [`StateError::TooLarge`] for a
    /// section over [`MAX_SECTION_LEN`] or one more than [`MAX_SECTIONS`].
    pub fn push(&mut self, tag: u32, bytes: Vec<u8>) -> Result<(), StateError> {
        if self.sections.iter().any(|(t, _)| *t == tag) {
            return Err(StateError::DuplicateSection { tag });
        }
        check_bound(
            "section count",
            self.sections.len() as u64 + 1,
            MAX_SECTIONS.into(),
        )?;
        check_bound(
            &format!("section {tag:#x}'s length"),
            bytes.len() as u64,
            MAX_SECTION_LEN.into(),
        )?;
        self.sections.push((tag, bytes));
        Ok(())
    }

    /// Section `tag`'s bytes.
    ///
    /// # Errors
    /// [`StateError::MissingSection`].
    pub fn section(&self, tag: u32) -> Result<&[u8], StateError> {
        self.sections
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|(_, b)| b.as_slice())
            .ok_or(StateError::MissingSection { tag })
    }

    /// The tags present, in order.
    pub fn tags(&self) -> Vec<u32> {
        self.sections.iter().map(|(t, _)| *t).collect()
    }

    /// The encoded bytes.
    pub fn encode(&self) -> Vec<u8> {
        let len = HEADER_LEN
            + self
                .sections
                .iter()
                .map(|(_, b)| 8 + b.len())
                .sum::<usize>()
            + 8;
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.kind.to_le_bytes());
        out.extend_from_slice(&(self.sections.len() as u32).to_le_bytes());
        for (tag, b) in &self.sections {
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes `bytes`, which must be a state of VM kind `expected_kind`.
    /// Checks, in this order: length bound, magic, version, checksum, kind,
    /// then each section's bounds.
    ///
    /// # Errors
    /// The [`StateError`] naming the first thing wrong.
    pub fn decode(bytes: &[u8], expected_kind: u32) -> Result<State, StateError> {
        check_bound("total length", bytes.len() as u64, MAX_STATE_LEN as u64)?;
        let mut r = Fields::new(bytes, "header");
        let magic: [u8; 8] = r.array("the magic")?;
        if magic != MAGIC {
            return Err(StateError::BadMagic { found: magic });
        }
        let version = r.u32("the version")?;
        if version != VERSION {
            return Err(StateError::Version {
                found: version,
                supported: VERSION,
            });
        }
        if bytes.len() < HEADER_LEN + 8 {
            return Err(StateError::Truncated {
                what: "the checksum".into(),
            });
        }
        let (body, tail) = bytes.split_at(bytes.len() - 8);
        let stored = u64::from_le_bytes(tail.try_into().expect("8 bytes"));
        let computed = xxhash_rust::xxh3::xxh3_64(body);
        if stored != computed {
            return Err(StateError::Checksum { stored, computed });
        }
        let mut r = Fields::new(body, "header");
        r.skip(12)?;
        let kind = r.u32("the VM kind")?;
        if kind != expected_kind {
            return Err(StateError::ForeignKind {
                found: kind,
                expected: expected_kind,
            });
        }
        let count = r.u32("the section count")?;
        check_bound("section count", count.into(), MAX_SECTIONS.into())?;
        let mut st = State::new(kind);
        for i in 0..count {
            let tag = r.u32(&format!("section {i}'s tag"))?;
            let len = r.u32(&format!("section {tag:#x}'s length"))?;
            check_bound(
                &format!("section {tag:#x}'s length"),
                len.into(),
                MAX_SECTION_LEN.into(),
            )?;
            let b = r.bytes(len as usize, &format!("section {tag:#x}'s bytes"))?;
            st.push(tag, b.to_vec())?;
        }
        if r.remaining() != 0 {
            return Err(StateError::TrailingBytes {
                extra: r.remaining(),
            });
        }
        Ok(st)
    }
}

fn check_bound(what: &str, value: u64, max: u64) -> Result<(), StateError> {
    if value > max {
        return Err(StateError::TooLarge {
            what: what.into(),
            value,
            max,
        });
    }
    Ok(())
}

/// Reads fixed-size little-endian fields from a section, naming the field
/// that is cut when the bytes end early.
#[derive(Debug)]
pub struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
    section: String,
}

impl<'a> Fields<'a> {
    /// Fields of `bytes`, in error texts called `section`.
    pub fn new(bytes: &'a [u8], section: &str) -> Fields<'a> {
        Fields {
            bytes,
            at: 0,
            section: section.into(),
        }
    }

    /// The next `n` bytes.
    ///
    /// # Errors
    /// [`StateError::Truncated`] naming `what`.
    pub fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], StateError> {
        if self.remaining() < n {
            return Err(StateError::Truncated {
                what: format!("{what} ({}, offset {})", self.section, self.at),
            });
        }
        let b = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(b)
    }

    fn skip(&mut self, n: usize) -> Result<(), StateError> {
        self.bytes(n, "the header").map(|_| ())
    }

    /// The next `N` bytes as an array.
    ///
    /// # Errors
    /// As [`Fields::bytes`].
    pub fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], StateError> {
        Ok(self.bytes(N, what)?.try_into().expect("N bytes"))
    }

    /// The next u32.
    ///
    /// # Errors
    /// As [`Fields::bytes`].
    pub fn u32(&mut self, what: &str) -> Result<u32, StateError> {
        self.array(what).map(u32::from_le_bytes)
    }

    /// The next u64.
    ///
    /// # Errors
    /// As [`Fields::bytes`].
    pub fn u64(&mut self, what: &str) -> Result<u64, StateError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// Checks that every byte was read.
    ///
    /// # Errors
    /// [`StateError::BadSection`] for bytes left over (section `tag`).
    pub fn finish(&self, tag: u32) -> Result<(), StateError> {
        if self.remaining() != 0 {
            return Err(StateError::BadSection {
                tag,
                what: format!("{} bytes left after its last field", self.remaining()),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> State {
        let mut s = State::new(0x4c58);
        s.push(1, vec![1, 2, 3]).unwrap();
        s.push(2, vec![9; 100]).unwrap();
        s
    }

    #[test]
    fn round_trip() {
        let s = sample();
        assert_eq!(State::decode(&s.encode(), 0x4c58).unwrap(), s);
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let b = sample().encode();
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x40;
            assert!(
                State::decode(&d, 0x4c58).is_err(),
                "byte {i} flipped was accepted"
            );
        }
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let b = sample().encode();
        assert!(matches!(
            State::decode(&b, 7),
            Err(StateError::ForeignKind {
                found: 0x4c58,
                expected: 7
            })
        ));
        let mut v = b.clone();
        v[8] = 2;
        assert!(matches!(
            State::decode(&v, 0x4c58),
            Err(StateError::Version { found: 2, .. })
        ));
        let mut m = b.clone();
        m[0] = b'X';
        assert!(matches!(
            State::decode(&m, 0x4c58),
            Err(StateError::BadMagic { .. })
        ));
        assert!(matches!(
            State::decode(&b[..b.len() - 1], 0x4c58),
            Err(StateError::Checksum { .. })
        ));
        assert!(matches!(
            State::decode(&b[..10], 0x4c58),
            Err(StateError::Truncated { .. })
        ));
        let mut t = b.clone();
        t.push(0);
        assert!(matches!(
            State::decode(&t, 0x4c58),
            Err(StateError::Checksum { .. })
        ));
    }

    /// A length field that claims more than is present, with a valid
    /// checksum (a crafted state), is refused before any allocation.
    #[test]
    fn crafted_lengths_are_bounded() {
        let mut body = Vec::new();
        body.extend_from_slice(&MAGIC);
        body.extend_from_slice(&VERSION.to_le_bytes());
        body.extend_from_slice(&5u32.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        let sum = xxhash_rust::xxh3::xxh3_64(&body);
        body.extend_from_slice(&sum.to_le_bytes());
        assert!(matches!(
            State::decode(&body, 5),
            Err(StateError::TooLarge { .. })
        ));
        let mut c = body[..16].to_vec();
        c.extend_from_slice(&(MAX_SECTIONS + 1).to_le_bytes());
        let sum = xxhash_rust::xxh3::xxh3_64(&c);
        c.extend_from_slice(&sum.to_le_bytes());
        assert!(matches!(
            State::decode(&c, 5),
            Err(StateError::TooLarge { .. })
        ));
    }

    #[test]
    fn duplicate_and_missing_sections() {
        let mut s = sample();
        assert_eq!(
            s.push(1, vec![]),
            Err(StateError::DuplicateSection { tag: 1 })
        );
        assert_eq!(s.section(3), Err(StateError::MissingSection { tag: 3 }));
        let mut f = Fields::new(&[1, 0, 0, 0], "t");
        assert_eq!(f.u32("x").unwrap(), 1);
        assert!(matches!(f.u64("y"), Err(StateError::Truncated { .. })));
    }
}
