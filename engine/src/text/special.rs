//! Cutting special tokens out of text before tokenizing, as llama.cpp's
//! `tokenizer_st_partition` does: control, unknown and user-defined tokens, longest first, each
//! found left to right in the text the longer ones left; with `parse_special` off only
//! user-defined tokens are cut (control tokens written in user text stay text). A token with
//! the left-/right-strip attribute eats the whitespace beside it.
//!
//! llama.cpp scans the text once per special token; with a thousand user-defined tokens and a
//! megabyte prompt that is a billion comparisons, so an Aho-Corasick pass first finds which
//! special tokens occur at all, and only those are scanned for, in llama.cpp's order: the same
//! result, bounded work.
//!
//! A chat's messages are text even where they spell a control token: [`TEXT_MARK`] breaks each
//! such spelling in a message before the template renders it ([`SpecialMatcher::escape_control`]),
//! and the tokenizer drops the marks from the text pieces after cutting out the template's own
//! control tokens.

use std::borrow::Cow;

use aho_corasick::AhoCorasick;

use crate::text::vocab::{Vocab, attr};

/// A Unicode noncharacter (never interchanged as text) that breaks a control token's spelling
/// in a message so it is not cut out as the token; dropped before the text is tokenized.
pub const TEXT_MARK: char = '\u{FDD0}';

/// A piece of the text: raw text to tokenize (a byte range of the input) or a special token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// The special tokens of a vocabulary, ready to cut out of text.
#[derive(Debug)]
pub(crate) struct SpecialMatcher {
    /// Pattern `i` is the text of `order[i]`.
    ac: Option<AhoCorasick>,
    order: Vec<u32>,
}

impl SpecialMatcher {
    pub fn new(vocab: &Vocab) -> Result<Self, aho_corasick::BuildError> {
        let order = vocab.special_order.clone();
        let ac = if order.is_empty() {
            None
        } else {
            let patterns = order.iter().map(|&id| vocab.texts[id as usize].as_str());
            Some(AhoCorasick::new(patterns)?)
        };
        Ok(Self { ac, order })
    }

    /// `text` with [`TEXT_MARK`] after the first character of every spelling of a control (or
    /// unknown) token in it, overlapping ones included, so no such token is cut out of it. A
    /// one-character token cannot be broken and stays (no real vocabulary has one).
    pub fn escape_control<'a>(&self, vocab: &Vocab, text: &'a str) -> Cow<'a, str> {
        let Some(ac) = &self.ac else {
            return Cow::Borrowed(text);
        };
        let mut cuts: Vec<usize> = ac
            .find_overlapping_iter(text)
            .filter(|m| {
                let id = self.order[m.pattern().as_usize()];
                vocab.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0
            })
            .filter_map(|m| {
                let first = text[m.start()..].chars().next()?.len_utf8();
                (m.end() - m.start() > first).then_some(m.start() + first)
            })
            .collect();
        if cuts.is_empty() {
            return Cow::Borrowed(text);
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut out = String::with_capacity(text.len() + cuts.len() * TEXT_MARK.len_utf8());
        let mut at = 0;
        for c in cuts {
            out.push_str(&text[at..c]);
            out.push(TEXT_MARK);
            at = c;
        }
        out.push_str(&text[at..]);
        Cow::Owned(out)
    }

    /// Splits `text` into raw pieces and special tokens.
    pub fn partition(&self, vocab: &Vocab, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0, text.len()));
        let Some(ac) = &self.ac else {
            return frags;
        };
        let mut present = vec![false; self.order.len()];
        for m in ac.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
        }
        for (i, &id) in self.order.iter().enumerate() {
            let a = vocab.attr(id);
            if !present[i] || (!parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0) {
                continue;
            }
            let needle = vocab.texts[id as usize].as_str();
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                match f {
                    Fragment::Text(start, end) => {
                        split_one(text, start, end, needle, id, a, &mut next)
                    }
                    token => next.push(token),
                }
            }
            frags = next;
        }
        frags
    }
}

/// C's `isspace` in the "C" locale, which llama.cpp's strip uses.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Cuts every occurrence of `needle` out of `text[start..end]`, left to right.
fn split_one(
    text: &str,
    mut start: usize,
    end: usize,
    needle: &str,
    id: u32,
    a: u16,
    out: &mut Vec<Fragment>,
) {
    let bytes = text.as_bytes();
    while start < end {
        let Some(pos) = text[start..end].find(needle).map(|p| p + start) else {
            out.push(Fragment::Text(start, end));
            return;
        };
        let mut left_end = pos;
        if a & attr::LSTRIP != 0 {
            while left_end > start && is_c_space(bytes[left_end - 1]) {
                left_end -= 1;
            }
        }
        if left_end > start {
            out.push(Fragment::Text(start, left_end));
        }
        out.push(Fragment::Token(id));
        start = pos + needle.len();
        if a & attr::RSTRIP != 0 {
            while start < end && is_c_space(bytes[start]) {
                start += 1;
            }
        }
    }
}
