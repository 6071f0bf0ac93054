//! Long text cut into pieces that tokenize alone exactly as they do together, so that a
//! tokenizer's working memory follows the piece and not the prompt: the Hugging Face BPE
//! pipeline holds ~130-150 bytes per byte of text it encodes at once (alignments and a
//! normalized copy per pre-token), SentencePiece's merge ~70. A 16 MiB prompt encoded whole
//! took over 2 GB.
//!
//! A cut is made only where every pre-tokenizer this engine runs would split anyway, and where
//! no merge can reach across:
//! - byte-level BPE: before a space between two ASCII letters (`"word| word"`: every regex
//!   ends a letter run at the space and starts the next pre-token at it, optionally with the
//!   space), and before CJK punctuation that follows a CJK ideograph (`"字|。"`: the ideograph
//!   run ends there, and a punctuation run starts). Merges never cross pre-tokens.
//! - SentencePiece: before a `▁` between two ASCII letters, when no token of the vocabulary
//!   has a `▁` after another character (then no merge can join the two sides; Llama 2's and
//!   Mistral's vocabularies hold none).
//!
//! Text with no such place (a megabyte of digits, or of ideographs without punctuation) stays
//! one piece; the few pieces over [`BIG_PIECE`] are encoded one at a time across the process
//! ([`one_at_a_time`]), so concurrent hostile prompts cannot multiply that memory.

use std::sync::Mutex;

/// The longest piece encoded at once where a cut can be found (about 5 MB of working memory).
pub(crate) const PIECE_BYTES: usize = 32 << 10;

/// Pieces longer than this are encoded one at a time across the whole process.
pub(crate) const BIG_PIECE: usize = 1 << 20;

/// Where a tokenizer may cut its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cuts {
    /// Byte-level BPE: `"a| b"` (ASCII) and `"字|。"` (CJK punctuation after an ideograph).
    ByteLevel,
    /// SentencePiece escaped text: `"a|▁b"` (ASCII letters both sides).
    Spm,
    /// Nowhere (a vocabulary with tokens spanning `▁`).
    None,
}

/// `▁` (U+2581) in UTF-8.
const SPM_SPACE: [u8; 3] = [0xE2, 0x96, 0x81];

/// The CJK punctuation a cut may precede: `。，、！？；：` (each a pre-token of its own, or the
/// start of a punctuation run, in every byte-level split).
const CJK_PUNCT: &[char] = &[
    '\u{3002}', '\u{FF0C}', '\u{3001}', '\u{FF01}', '\u{FF1F}', '\u{FF1B}', '\u{FF1A}',
];

impl Cuts {
    /// Whether `text` may be cut before byte `i` (0 < i < len).
    fn at(self, text: &str, i: usize) -> bool {
        let b = text.as_bytes();
        let alpha = |j: usize| b.get(j).is_some_and(u8::is_ascii_alphabetic);
        match self {
            Cuts::None => false,
            Cuts::ByteLevel => {
                if b[i] == b' ' {
                    return alpha(i - 1) && alpha(i + 1);
                }
                if !text.is_char_boundary(i) || i < 3 || !text.is_char_boundary(i - 3) {
                    return false;
                }
                let next = text[i..].chars().next();
                let prev = text[i - 3..i].chars().next();
                next.is_some_and(|c| CJK_PUNCT.contains(&c))
                    && prev.is_some_and(|c| ('\u{4E00}'..='\u{9FFF}').contains(&c))
            }
            Cuts::Spm => b[i..].starts_with(&SPM_SPACE) && alpha(i - 1) && alpha(i + 3),
        }
    }
}

/// `text` in pieces of at most `max` bytes where a cut can be found: each piece ends at the
/// last cut within `max` bytes, or, where there is none, at the first one after.
pub(crate) fn pieces(text: &str, max: usize, cuts: Cuts) -> impl Iterator<Item = &str> {
    let max = max.max(1);
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = if rest.len() <= max || cuts == Cuts::None {
            rest.len()
        } else {
            let back = (1..=max.min(rest.len() - 1))
                .rev()
                .find(|&i| cuts.at(rest, i));
            back.or_else(|| (max + 1..rest.len()).find(|&i| cuts.at(rest, i)))
                .unwrap_or(rest.len())
        };
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

/// Runs `encode` on `piece`, one big piece at a time across the process.
pub(crate) fn one_at_a_time<T>(piece: &str, encode: impl FnOnce(&str) -> T) -> T {
    static BIG: Mutex<()> = Mutex::new(());
    if piece.len() <= BIG_PIECE {
        return encode(piece);
    }
    let _turn = BIG.lock().unwrap_or_else(|e| e.into_inner());
    encode(piece)
}

/// Whether a SentencePiece vocabulary lets text be cut at spaces: no token holds a `▁` after
/// another character (`"a▁"`, `"a▁b"`), so no merge joins a word to the space after it.
pub(crate) fn spm_cuts<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Cuts {
    let spans = tokens.into_iter().any(|t| {
        let mut prev: Option<char> = None;
        t.chars().any(|c| {
            let joined = c == '\u{2581}' && prev.is_some_and(|p| p != '\u{2581}');
            prev = Some(c);
            joined
        })
    });
    if spans { Cuts::None } else { Cuts::Spm }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(text: &str, max: usize, cuts: Cuts) -> Vec<&str> {
        pieces(text, max, cuts).collect()
    }

    #[test]
    fn prose_is_cut_before_the_space_between_letters_only() {
        assert_eq!(
            cut("one two  three 4 five six", 5, Cuts::ByteLevel),
            ["one", " two  three 4 five", " six"]
        );
        assert_eq!(cut("abc", 1, Cuts::ByteLevel), ["abc"]);
        assert_eq!(cut("", 4, Cuts::ByteLevel), Vec::<&str>::new());
    }

    #[test]
    fn cjk_is_cut_before_punctuation_after_an_ideograph() {
        let text = "我们运行。模型，速度";
        assert_eq!(
            cut(text, 13, Cuts::ByteLevel),
            ["我们运行", "。模型", "，速度"]
        );
        // After punctuation, or before a letter, no cut.
        assert_eq!(cut("。。模型", 3, Cuts::ByteLevel), ["。。模型"]);
    }

    #[test]
    fn sentencepiece_text_is_cut_before_a_space_between_letters() {
        let text = "▁one▁two▁▁3▁four▁five";
        assert_eq!(cut(text, 6, Cuts::Spm), ["▁one", "▁two▁▁3▁four", "▁five"]);
        assert_eq!(cut(text, 6, Cuts::None), [text]);
    }

    #[test]
    fn a_vocabulary_with_a_space_inside_a_token_is_not_cut() {
        assert_eq!(spm_cuts(["▁the", "▁▁", "s"]), Cuts::Spm);
        assert_eq!(spm_cuts(["▁the", "of▁the"]), Cuts::None);
        assert_eq!(spm_cuts(["▁the", "a▁"]), Cuts::None);
    }

    #[test]
    fn the_pieces_are_the_text() {
        let text = "lorem ipsum dolor 字。 sit amet, consectetur ".repeat(50);
        for max in [1, 7, 64, 1000, 10_000] {
            let p = cut(&text, max, Cuts::ByteLevel);
            assert_eq!(p.concat(), text);
            assert!(p.iter().all(|s| !s.is_empty()));
            if max >= 64 {
                assert!(p.iter().all(|s| s.len() <= max), "{max}");
            }
        }
    }
}
