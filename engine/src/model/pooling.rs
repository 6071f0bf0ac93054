//! Embeddings: how one vector is made from a prompt's final hidden states (after the output
//! norm, llama.cpp's `result_norm`), by the rules of llama.cpp's `--pooling` and a GGUF file's
//! `{arch}.pooling_type`: the mean of every token's state, the first token's (`cls`) or the
//! last one's (`last`, the rule of Qwen3-Embedding and other decoder embedding models).

use std::fmt;
use std::str::FromStr;

/// A pooling rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    Mean,
    Cls,
    Last,
}

impl Pooling {
    /// Every rule, in llama.cpp's order of ids.
    pub const ALL: [Pooling; 3] = [Pooling::Mean, Pooling::Cls, Pooling::Last];

    /// The name `--pooling` takes (llama.cpp's).
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// The rule of a GGUF `pooling_type` (llama.cpp's `llama_pooling_type`): 1 mean, 2 cls,
    /// 3 last. 0 (none) and 4 (rank, a reranker's score) make no embedding vector: `None`.
    pub fn from_gguf(id: u64) -> Option<Pooling> {
        match id {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    /// The GGUF `pooling_type` id of the rule.
    pub fn gguf_id(self) -> u32 {
        match self {
            Pooling::Mean => 1,
            Pooling::Cls => 2,
            Pooling::Last => 3,
        }
    }

    /// Whether every prompt token's state is needed (so none may come from the prefix cache).
    pub fn needs_every_token(self) -> bool {
        self != Pooling::Last
    }

    /// Whether the state of the token at `pos` of a prompt of `len` tokens goes into the
    /// vector.
    pub fn takes(self, pos: usize, len: usize) -> bool {
        match self {
            Pooling::Mean => pos < len,
            Pooling::Cls => pos == 0,
            Pooling::Last => pos + 1 == len,
        }
    }
}

impl fmt::Display for Pooling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Pooling {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Pooling::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown pooling '{s}' (expected mean, cls or last)"))
    }
}

/// One prompt's vector being made: the states taken so far, summed in position order.
#[derive(Debug, Clone)]
pub struct Pooled {
    rule: Pooling,
    len: usize,
    sum: Vec<f64>,
    /// The next position expected: a state seen twice (a prompt computed again after a
    /// preemption) is counted once.
    next: usize,
}

impl Pooled {
    /// A vector of `width` for a prompt of `len` tokens.
    pub fn new(rule: Pooling, len: usize, width: usize) -> Self {
        Pooled {
            rule,
            len,
            sum: vec![0.0; width],
            next: 0,
        }
    }

    /// The positions whose states are wanted among `start..start + n`.
    pub fn wanted(&self, start: usize, n: usize) -> impl Iterator<Item = usize> + '_ {
        (start..start + n).filter(|&p| self.rule.takes(p, self.len))
    }

    /// The state of the token at `pos`. States come in position order; one at a position
    /// already past (computed again) is skipped.
    pub fn push(&mut self, pos: usize, state: &[f32]) {
        if pos < self.next || !self.rule.takes(pos, self.len) {
            return;
        }
        self.next = pos + 1;
        for (s, &x) in self.sum.iter_mut().zip(state) {
            *s += f64::from(x);
        }
    }

    /// Whether the last state the rule takes has come.
    pub fn done(&self) -> bool {
        match self.rule {
            Pooling::Cls => self.next >= 1,
            Pooling::Mean | Pooling::Last => self.next >= self.len,
        }
    }

    /// The vector, scaled to unit length (OpenAI's and llama-server's embeddings are; a zero
    /// vector stays zero).
    pub fn finish(self) -> Vec<f32> {
        let n = match self.rule {
            Pooling::Mean => self.len.max(1) as f64,
            Pooling::Cls | Pooling::Last => 1.0,
        };
        let norm = self
            .sum
            .iter()
            .map(|s| (s / n) * (s / n))
            .sum::<f64>()
            .sqrt();
        let scale = if norm > 0.0 { 1.0 / (n * norm) } else { 0.0 };
        self.sum.iter().map(|s| (s * scale) as f32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_round_trip() {
        for p in Pooling::ALL {
            assert_eq!(p.name().parse::<Pooling>(), Ok(p));
            assert_eq!(Pooling::from_gguf(u64::from(p.gguf_id())), Some(p));
        }
        assert_eq!(Pooling::from_gguf(0), None);
        assert_eq!(Pooling::from_gguf(4), None);
        assert!("rank".parse::<Pooling>().is_err());
    }

    #[test]
    fn each_rule_takes_its_tokens_once_and_normalizes() {
        let states = [[1.0f32, 0.0], [0.0, 3.0], [4.0, 4.0]];
        let run = |rule, pushes: &[usize]| {
            let mut p = Pooled::new(rule, 3, 2);
            for &pos in pushes {
                p.push(pos, &states[pos]);
            }
            (p.done(), p.finish())
        };
        // Mean of (1,0), (0,3), (4,4) = (5/3, 7/3), unit length (5, 7) / sqrt(74).
        let (done, v) = run(Pooling::Mean, &[0, 1, 2]);
        let n = 74f32.sqrt();
        assert!(done);
        assert!(
            (v[0] - 5.0 / n).abs() < 1e-6 && (v[1] - 7.0 / n).abs() < 1e-6,
            "{v:?}"
        );
        // A preempted prompt computed again from position 1 counts each state once.
        assert_eq!(run(Pooling::Mean, &[0, 1, 1, 2]).1, v);
        let (done, v) = run(Pooling::Cls, &[0]);
        assert!(done);
        assert_eq!(v, vec![1.0, 0.0]);
        let (done, v) = run(Pooling::Last, &[0, 1]);
        assert!(!done);
        assert_eq!(v, vec![0.0, 0.0]);
        let (done, v) = run(Pooling::Last, &[2]);
        assert!(done);
        let h = 0.5f32.sqrt();
        assert!((v[0] - h).abs() < 1e-6 && (v[1] - h).abs() < 1e-6, "{v:?}");
        let p = Pooled::new(Pooling::Mean, 4, 2);
        assert_eq!(p.wanted(2, 5).collect::<Vec<_>>(), vec![2, 3]);
        let p = Pooled::new(Pooling::Last, 4, 2);
        assert_eq!(p.wanted(0, 4).collect::<Vec<_>>(), vec![3]);
    }
}
