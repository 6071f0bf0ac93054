//! [`WeightBytes`]: a matrix's bytes, alone or as its slice of a model's arena (`arena`).

use std::ops::Deref;
use std::sync::Arc;

/// A matrix's bytes: its own buffer, or its slice of a model's arena. Cloning shares them.
#[derive(Clone, Default)]
pub struct WeightBytes {
    pub(super) buf: Arc<Vec<u8>>,
    pub(super) start: usize,
    pub(super) len: usize,
}

impl WeightBytes {
    /// The bytes of one matrix, alone in `v`.
    pub fn new(v: Vec<u8>) -> Self {
        let len = v.len();
        Self {
            buf: Arc::new(v),
            start: 0,
            len,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for WeightBytes {
    fn from(v: Vec<u8>) -> Self {
        Self::new(v)
    }
}

impl Deref for WeightBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

/// Equal bytes, wherever they live.
impl PartialEq for WeightBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for WeightBytes {}

impl std::fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeightBytes({} bytes", self.len)?;
        if self.len != self.buf.len() {
            write!(f, " at {} of a {}-byte arena", self.start, self.buf.len())?;
        }
        write!(f, ")")
    }
}
