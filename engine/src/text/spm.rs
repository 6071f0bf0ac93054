//! SentencePiece tokenization as llama.cpp's `llm_tokenizer_spm` runs it over a GGUF vocabulary
//! (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral v0.1, Phi-3, Gemma): start from single
//! characters, repeatedly merge the adjacent pair whose merged text is the highest-scoring token
//! (leftmost on ties), and spell any character left outside the vocabulary as `<0xXX>` byte
//! tokens.
//!
//! The caller has already replaced spaces by `▁` and added the leading space where the model
//! wants one. llama.cpp also keeps a map from merged text back to its two halves, to split a
//! symbol that is not a token; every merged symbol is a token by construction and a single
//! character is never a merged text, so that path never runs and is left out here.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::text::vocab::Vocab;

/// One symbol of the text being merged: a byte range, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of `left` and its right neighbour into a token of `score`.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// The heap's top is the highest score, then the leftmost pair (llama.cpp's comparator).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Tokenizes `text` (already escaped) into `out`. `unk` stands in for a byte that has no
/// token of its own, where llama.cpp would throw.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, unk: Option<u32>, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (start, c) in text.char_indices() {
        let i = symbols.len();
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: None,
        });
        if i > 0 {
            symbols[i - 1].next = Some(i);
        }
    }
    let mut queue = BinaryHeap::new();
    let try_add = |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: usize| {
        let Some(right) = symbols[left].next else {
            return;
        };
        let (l, r) = (symbols[left], symbols[right]);
        let merged = &text[l.start..r.start + r.len];
        if let Some(&id) = vocab.ids.get(merged) {
            queue.push(Bigram {
                left,
                right,
                score: vocab.scores[id as usize],
                len: merged.len(),
            });
        }
    };
    for i in 0..symbols.len().saturating_sub(1) {
        try_add(&symbols, &mut queue, i);
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        // Stale: one side was merged into something else since this pair was queued.
        if l.len == 0 || r.len == 0 || l.len + r.len != b.len {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(b.left);
        }
        if let Some(p) = l.prev {
            try_add(&symbols, &mut queue, p);
        }
        try_add(&symbols, &mut queue, b.left);
    }
    let mut i = if symbols.is_empty() { None } else { Some(0) };
    while let Some(s) = i {
        let sym = symbols[s];
        let piece = &text[sym.start..sym.start + sym.len];
        match vocab.ids.get(piece) {
            Some(&id) => out.push(id),
            None => out.extend(
                piece
                    .bytes()
                    .filter_map(|b| vocab.spm_byte_token(b).or(unk)),
            ),
        }
        i = sym.next;
    }
}
