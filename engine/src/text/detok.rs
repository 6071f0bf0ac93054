//! Incremental detokenizer: turns a stream of token ids into text as it arrives, emitting only
//! complete UTF-8 (a character split across tokens is held until its last byte comes).
//!
//! Byte-level BPE tokens are byte strings, not text, so decoding token by token would print
//! broken characters for emoji and CJK. We keep the undecided tail bytes and apply exactly the
//! rule `String::from_utf8_lossy` applies to the whole sequence (one U+FFFD per maximal invalid
//! byte run), so the concatenated output always equals [`Tokenizer::decode`] of all ids.

use crate::text::tokenizer::{Tokenizer, TokenizerError};

/// Streaming decoder for one sequence. Holds at most 3 pending bytes between calls.
#[derive(Debug, Clone, Default)]
pub struct Detokenizer {
    pending: Vec<u8>,
    skip_special: bool,
}

impl Detokenizer {
    /// `skip_special` as in [`Tokenizer::decode`]: leave control tokens out of the text.
    pub fn new(skip_special: bool) -> Self {
        Self {
            pending: Vec::with_capacity(8),
            skip_special,
        }
    }

    /// Adds one token and returns the text that is now complete (often empty, never broken).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        let bytes = tokenizer.token_bytes_checked(id, self.skip_special)?;
        Ok(self.push_bytes(bytes))
    }

    /// Adds raw bytes and returns the text that is now complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is checked UTF-8 by construction; lossy conversion never alters it.
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        // A byte run that can never become valid: replace it now, exactly as
                        // from_utf8_lossy would on the whole sequence.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
        out
    }

    /// Whether bytes of an unfinished character are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the sequence: an unfinished character at the end becomes U+FFFD (as a full decode
    /// would show it). Leaves the detokenizer empty and reusable.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_multibyte_chars() {
        let mut d = Detokenizer::new(true);
        let euro = "€".as_bytes(); // 3 bytes
        assert_eq!(d.push_bytes(&euro[..1]), "");
        assert_eq!(d.push_bytes(&euro[1..2]), "");
        assert_eq!(d.push_bytes(&[euro[2], b'a']), "€a");
        assert!(!d.has_pending());
    }

    #[test]
    fn invalid_bytes_match_lossy() {
        let seqs: [&[u8]; 4] = [
            &[0xE2, 0x82, b'A'],
            &[0xFF, 0xE2],
            &[0xF0, 0x9F, 0x98],
            &[0xC0, 0x80, 0xED, 0xA0, 0x80],
        ];
        for seq in seqs {
            let mut d = Detokenizer::new(true);
            let mut out = String::new();
            for b in seq {
                out.push_str(&d.push_bytes(&[*b]));
            }
            out.push_str(&d.finish());
            assert_eq!(out, String::from_utf8_lossy(seq), "{seq:02x?}");
        }
    }
}
