//! How a model is split over GPUs ([`Parallel`]: tensor, pipeline and expert parallelism), as
//! data: what the roofline's predictions carry. What a split does to a model's shape (its
//! checks, each GPU's share) is `parallel.rs`'s, beside the pricing of its collectives.

use serde::Serialize;

/// How a model is split over GPUs: `tp · pp` GPUs; EP, when more than 1, spreads the experts
/// over the TP group's GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Parallel {
    pub tp: usize,
    pub pp: usize,
    pub ep: usize,
}

impl Parallel {
    /// One GPU.
    pub const NONE: Parallel = Parallel {
        tp: 1,
        pp: 1,
        ep: 1,
    };

    pub fn gpus(&self) -> usize {
        self.tp * self.pp
    }

    /// "TP4", "TP2 PP2", "TP8 EP8" ("1 GPU" alone).
    pub fn label(&self) -> String {
        let mut parts = Vec::new();
        if self.tp > 1 {
            parts.push(format!("TP{}", self.tp));
        }
        if self.pp > 1 {
            parts.push(format!("PP{}", self.pp));
        }
        if self.ep > 1 {
            parts.push(format!("EP{}", self.ep));
        }
        if parts.is_empty() {
            "1 GPU".into()
        } else {
            parts.join(" ")
        }
    }
}
