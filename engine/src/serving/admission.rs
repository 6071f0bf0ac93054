//! Admission: the one check a [`Request`] passes before the engine takes it (prompt, context,
//! `max_tokens`, vocabulary, sampling, KV pool), the typed [`Refusal`] every front end shows
//! (the window, the CLI, the server's 4xx/5xx), and the `max_tokens` the request then runs under.
//!
//! The engine thread calls [`Admission::check`] once per submitted request; what it admits the
//! scheduler trusts. A front end that must size something before there is an engine (the
//! single-request path sizes its KV pool) asks [`Admission::for_model`] the same question.

pub use crate::kv::{KvNeverFits, KvPool};
pub use crate::serving::refusal::{Refusal, RefusalKind};

use crate::model::config::ModelConfig;
use crate::serving::request::Request;

/// What a request is checked against: the model's context and vocabulary, and the KV pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub context_len: usize,
    /// Rows of the embedding: the token ids the model can take.
    pub vocab: usize,
    /// `None` before a pool is sized (to size one for a request).
    pub pool: Option<KvPool>,
    /// Whether the last token sampled counts against the context.
    pub rule: ContextRule,
}

/// How many positions of the context a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextRule {
    /// What the model computes: the prompt and every generated token but the last, which is
    /// sampled and never fed back, so it needs no position (nor a KV slot, as [`KvPool::fit`]
    /// counts). A prompt as long as the context still gets its one token, as llama-bench's
    /// prefill test and vLLM's offline engine allow.
    Positions,
    /// The OpenAI API's contract, which vLLM's server keeps: prompt + `max_tokens` ≤ context.
    /// The server asks it before submitting, so its clients see vLLM's boundary.
    Api,
}

impl ContextRule {
    /// Context positions a request of `prompt` tokens generating `max_tokens` takes.
    pub fn positions(self, prompt: usize, max_tokens: usize) -> usize {
        match self {
            Self::Positions => prompt.saturating_add(max_tokens.saturating_sub(1)),
            Self::Api => prompt.saturating_add(max_tokens),
        }
    }

    /// The most tokens a prompt of `prompt` tokens may generate in a context of `ctx` (0 when
    /// not even one fits).
    fn room(self, prompt: usize, ctx: usize) -> usize {
        match self {
            Self::Positions => (ctx + 1).saturating_sub(prompt),
            Self::Api => ctx.saturating_sub(prompt),
        }
    }
}

/// An admitted request's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// Generated tokens after which it ends with `FinishReason::Length`: the request's own, or
    /// when it gave none as many as fit the context and the KV pool.
    pub max_tokens: usize,
}

impl Admission {
    /// The model's limits alone (no KV pool yet), counted in positions.
    pub fn for_model(cfg: &ModelConfig) -> Self {
        Self {
            context_len: cfg.context_len,
            vocab: cfg.vocab,
            pool: None,
            rule: ContextRule::Positions,
        }
    }

    /// The model's limits as the OpenAI API counts them ([`ContextRule::Api`]).
    pub fn for_api(cfg: &ModelConfig) -> Self {
        Self {
            rule: ContextRule::Api,
            ..Self::for_model(cfg)
        }
    }

    /// The model's limits and a KV pool.
    pub fn with_pool(cfg: &ModelConfig, pool: KvPool) -> Self {
        Self {
            pool: Some(pool),
            ..Self::for_model(cfg)
        }
    }

    /// Admits `req` with the `max_tokens` it will run under, or says why not. A `max_tokens`
    /// that does not fit the context is refused, never cut short (as vLLM and OpenAI do).
    pub fn check(&self, req: &Request) -> Result<Admitted, Refusal> {
        let (prompt, ctx) = (req.prompt.len(), self.context_len);
        if prompt == 0 {
            return Err(Refusal::EmptyPrompt);
        }
        let asked = req.stop.max_tokens;
        if asked == Some(0) {
            return Err(Refusal::ZeroMaxTokens);
        }
        // At least one token must fit after the prompt.
        let wanted = asked.unwrap_or(1);
        if self.rule.positions(prompt, wanted) > ctx {
            return Err(Refusal::PastContext {
                prompt,
                max_tokens: wanted,
                context: ctx,
            });
        }
        if let Some((index, &id)) = req
            .prompt
            .iter()
            .enumerate()
            .find(|&(_, &t)| t as usize >= self.vocab)
        {
            return Err(Refusal::OutOfVocab {
                index,
                id,
                vocab: self.vocab,
            });
        }
        req.sampling.validate()?;
        let room = self.rule.room(prompt, ctx);
        let max_tokens = match (asked, self.pool) {
            (Some(m), _) => m,
            (None, None) => room,
            // Omitted: as much as fits the context and the pool (the last token sampled needs
            // no slot). A context larger than the pool is no reason to refuse; a prompt larger
            // than the pool still is, below.
            (None, Some(pool)) => room.min(pool.tokens().saturating_sub(prompt) + 1),
        };
        if let Some(pool) = self.pool {
            pool.fit(prompt, max_tokens)?;
        }
        Ok(Admitted { max_tokens })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::stop::StopCriteria;
    use crate::serving::sampler::SamplingParams;

    fn admission(pool: Option<KvPool>) -> Admission {
        Admission {
            context_len: 100,
            vocab: 50,
            pool,
            rule: ContextRule::Positions,
        }
    }

    fn api() -> Admission {
        Admission {
            rule: ContextRule::Api,
            ..admission(None)
        }
    }

    fn req(prompt: Vec<u32>, max_tokens: Option<usize>) -> Request {
        Request {
            prompt,
            stop: StopCriteria::new(max_tokens, Vec::new()),
            ..Request::default()
        }
    }

    #[test]
    fn each_refusal_with_its_kind() {
        let pool = KvPool {
            num_blocks: 4,
            block_size: 4,
        };
        let a = admission(Some(pool));
        let cases = [
            (
                req(vec![], Some(4)),
                Refusal::EmptyPrompt,
                RefusalKind::Invalid,
            ),
            (
                req(vec![1], Some(0)),
                Refusal::ZeroMaxTokens,
                RefusalKind::Invalid,
            ),
            (
                req(vec![1; 101], None),
                Refusal::PastContext {
                    prompt: 101,
                    max_tokens: 1,
                    context: 100,
                },
                RefusalKind::TooLong,
            ),
            (
                req(vec![1; 10], Some(92)),
                Refusal::PastContext {
                    prompt: 10,
                    max_tokens: 92,
                    context: 100,
                },
                RefusalKind::TooLong,
            ),
            (
                req(vec![1, 2, 50, 60], Some(2)),
                Refusal::OutOfVocab {
                    index: 2,
                    id: 50,
                    vocab: 50,
                },
                RefusalKind::Invalid,
            ),
            (
                req(vec![1; 10], Some(8)),
                Refusal::KvNeverFits(KvNeverFits {
                    tokens: 17,
                    needed_blocks: 5,
                    num_blocks: 4,
                }),
                RefusalKind::TooLong,
            ),
            (
                req(vec![1; 17], None),
                Refusal::KvNeverFits(KvNeverFits {
                    tokens: 17,
                    needed_blocks: 5,
                    num_blocks: 4,
                }),
                RefusalKind::TooLong,
            ),
        ];
        for (r, refusal, kind) in cases {
            let got = a.check(&r).expect_err("refused");
            assert_eq!(got, refusal, "{got}");
            assert_eq!(got.kind(), kind, "{got}");
        }
        let hot = Request {
            sampling: SamplingParams {
                temperature: -1.0,
                ..SamplingParams::default()
            },
            ..req(vec![1], Some(1))
        };
        let e = a.check(&hot).expect_err("bad temperature");
        assert!(
            matches!(&e, Refusal::Sampling(s) if s.name == "temperature"),
            "{e}"
        );
        assert_eq!(e.kind(), RefusalKind::Invalid);
    }

    #[test]
    fn max_tokens_is_decided_here() {
        let pool = KvPool {
            num_blocks: 4,
            block_size: 4,
        };
        // Exactly the pool: 10 + 7 - 1 = 16 slots.
        let a = admission(Some(pool));
        assert_eq!(
            a.check(&req(vec![1; 10], Some(7))).map(|x| x.max_tokens),
            Ok(7)
        );
        // Omitted: what the pool holds, plus the last token sampled.
        assert_eq!(
            a.check(&req(vec![1; 10], None)).map(|x| x.max_tokens),
            Ok(7)
        );
        // Omitted with no pool, or a pool past the context: the context's room.
        // (the last token sampled takes no position).
        let none = admission(None);
        assert_eq!(
            none.check(&req(vec![1; 10], None)).map(|x| x.max_tokens),
            Ok(91)
        );
        let big = admission(Some(KvPool {
            num_blocks: 1000,
            block_size: 16,
        }));
        assert_eq!(
            big.check(&req(vec![1; 10], None)).map(|x| x.max_tokens),
            Ok(91)
        );
        // The whole context, exactly: 10 + 91 - 1 positions; a prompt as long as the context
        // gets its one token.
        assert_eq!(
            none.check(&req(vec![1; 10], Some(91)))
                .map(|x| x.max_tokens),
            Ok(91)
        );
        assert_eq!(
            none.check(&req(vec![1; 100], Some(1)))
                .map(|x| x.max_tokens),
            Ok(1)
        );
    }

    #[test]
    fn the_api_counts_the_last_token_against_the_context() {
        let a = api();
        assert_eq!(
            a.check(&req(vec![1; 10], None)).map(|x| x.max_tokens),
            Ok(90)
        );
        assert_eq!(
            a.check(&req(vec![1; 10], Some(90))).map(|x| x.max_tokens),
            Ok(90)
        );
        for (prompt, max) in [(10, Some(91)), (100, None), (100, Some(1))] {
            assert_eq!(
                a.check(&req(vec![1; prompt], max)),
                Err(Refusal::PastContext {
                    prompt,
                    max_tokens: max.unwrap_or(1),
                    context: 100,
                })
            );
        }
    }

    #[test]
    fn messages_name_the_numbers() {
        let e = Refusal::PastContext {
            prompt: 10,
            max_tokens: 95,
            context: 100,
        };
        let m = e.to_string();
        assert!(m.contains("maximum context length is 100 tokens"), "{m}");
        assert!(
            m.contains("you requested 105 tokens (10 in the prompt, 95 for"),
            "{m}"
        );
        let m = Refusal::OutOfVocab {
            index: 2,
            id: 77,
            vocab: 50,
        }
        .to_string();
        assert!(m.contains("outside the model's vocabulary of 50"), "{m}");
    }
}
