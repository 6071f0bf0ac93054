//! Prompt-lookup (n-gram) proposals, as vLLM's `ngram` method and llama.cpp's lookup decoding:
//! find the longest recent n-gram of the request's own tokens (prompt and output) that occurred
//! before, and propose the tokens that followed it. No weights, no model call: copy-heavy work
//! (editing a given text, code completion, quoting) is where it pays.

/// Proposes up to `k` tokens continuing `tokens`: for `n` from `max_n` down to `min_n`, the
/// last `n` tokens are looked up earlier in `tokens` (the most recent occurrence wins) and the
/// tokens after the first match are proposed. Empty when nothing matches.
///
/// Cost: O(len · max_n) comparisons per call; `tokens` is bounded by the context length.
pub fn propose(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    let min_n = min_n.max(1);
    if k == 0 || len < min_n + 1 {
        return Vec::new();
    }
    for n in (min_n..=max_n.min(len - 1)).rev() {
        let pattern = &tokens[len - n..];
        // Occurrences ending before the suffix itself, most recent first.
        let found = (0..len - n)
            .rev()
            .find(|&start| &tokens[start..start + n] == pattern);
        if let Some(start) = found {
            let from = start + n;
            let to = (from + k).min(len);
            return tokens[from..to].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::propose;

    #[test]
    fn longest_most_recent_match_wins() {
        // "1 2 3" occurred before followed by 4 5; "3" alone occurred later followed by 9.
        let t = [1, 2, 3, 4, 5, 3, 9, 1, 2, 3];
        assert_eq!(propose(&t, 1, 3, 2), vec![4, 5]);
        // With n capped at 1, the most recent "3" (followed by 9) wins.
        assert_eq!(propose(&t, 1, 1, 2), vec![9, 1]);
    }

    #[test]
    fn nothing_to_copy() {
        assert!(propose(&[1, 2, 3, 4], 1, 3, 4).is_empty());
        assert!(propose(&[7], 1, 3, 4).is_empty());
        assert!(propose(&[], 1, 3, 4).is_empty());
        assert!(propose(&[5, 5, 5], 1, 3, 0).is_empty());
    }

    #[test]
    fn proposal_stops_at_the_end() {
        // The match is right before the suffix: only what follows it exists.
        let t = [8, 1, 2, 1, 2];
        assert_eq!(propose(&t, 2, 2, 5), vec![1, 2]);
    }
}
