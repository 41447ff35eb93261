//! The little-endian encoder and the bounded decoder of record bodies.

use crate::stream_error::MigrateError;

/// Little-endian encoder.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
}

/// Bounds-checked little-endian decoder of one record's body.
pub struct Dec<'a> {
    body: &'a [u8],
    record: &'static str,
    at_byte: u64,
}

impl<'a> Dec<'a> {
    pub fn new(body: &'a [u8], record: &'static str, at_byte: u64) -> Self {
        Dec {
            body,
            record,
            at_byte,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], MigrateError> {
        if self.body.len() < n {
            return Err(self.malformed(format!("needs {n} more bytes, has {}", self.body.len())));
        }
        let (a, b) = self.body.split_at(n);
        self.body = b;
        Ok(a)
    }

    pub fn malformed(&self, why: String) -> MigrateError {
        MigrateError::Malformed {
            record: self.record,
            at_byte: self.at_byte,
            why,
        }
    }

    pub fn u8(&mut self) -> Result<u8, MigrateError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, MigrateError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    pub fn u32(&mut self) -> Result<u32, MigrateError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub fn u64(&mut self) -> Result<u64, MigrateError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], MigrateError> {
        self.take(n)
    }
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.body)
    }
    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<(), MigrateError> {
        if self.body.is_empty() {
            Ok(())
        } else {
            Err(self.malformed(format!("{} trailing bytes", self.body.len())))
        }
    }
}
