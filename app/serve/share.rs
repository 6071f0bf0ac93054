//! Each client's share of what the server holds in flight: its sequences (a request's `n`) and
//! its tokens (`n × (prompt + max_tokens)`, an omitted `max_tokens` counting as the rest of
//! the context), reserved when a request is admitted and given back when its answer ends
//! (whole, streamed, or dropped by a client that hung up). Past either share that client gets a
//! 429 and nobody else does: one client cannot fill the waiting queue or the KV pool for all.
//! Who a client is: [`super::state::client_of`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tpslab_engine::sched::ClientId;

use super::errors::ApiError;

/// What every client holds now.
#[derive(Debug, Default)]
pub struct Shares {
    held: Mutex<HashMap<ClientId, (usize, usize)>>,
}

/// A client's share: the most sequences and tokens it may hold in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub seqs: usize,
    pub tokens: usize,
}

/// One request's reservation, given back on drop.
#[derive(Debug)]
pub struct Held {
    shares: Arc<Shares>,
    client: ClientId,
    seqs: usize,
    tokens: usize,
}

impl Shares {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ClientId, (usize, usize)>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reserves `seqs` sequences and `tokens` tokens for `client`, or says (429) which of its
    /// `share` it would pass. A request larger than a whole share alone is still let through
    /// when the client holds nothing else (its own limits, `n` and the context, bound it).
    pub fn reserve(
        self: &Arc<Self>,
        client: ClientId,
        seqs: usize,
        tokens: usize,
        share: Share,
    ) -> Result<Held, ApiError> {
        let mut held = self.lock();
        let (s, t) = held.get(&client).copied().unwrap_or((0, 0));
        let idle = s == 0;
        if !idle && s + seqs > share.seqs {
            return Err(ApiError::busy(format!(
                "this client has {s} sequences in flight; {seqs} more would pass its share of \
                 {} (--client-max-seqs): wait for some to finish",
                share.seqs
            )));
        }
        if !idle && t.saturating_add(tokens) > share.tokens {
            return Err(ApiError::busy(format!(
                "this client has {t} tokens in flight (choices x (prompt + max_tokens)); {tokens} \
                 more would pass its share of {} (--client-max-tokens): set max_tokens, or wait \
                 for some to finish",
                share.tokens
            )));
        }
        held.insert(client, (s + seqs, t.saturating_add(tokens)));
        Ok(Held {
            shares: Arc::clone(self),
            client,
            seqs,
            tokens,
        })
    }

    /// What `client` holds now: (sequences, tokens).
    pub fn held(&self, client: ClientId) -> (usize, usize) {
        self.lock().get(&client).copied().unwrap_or((0, 0))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.shares.lock();
        if let Some((s, t)) = held.get_mut(&self.client) {
            *s = s.saturating_sub(self.seqs);
            *t = t.saturating_sub(self.tokens);
            if *s == 0 {
                held.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_past_its_share_is_refused_alone_and_gets_it_back() {
        let s = Arc::new(Shares::default());
        let share = Share {
            seqs: 4,
            tokens: 100,
        };
        let (a, b) = (ClientId(1), ClientId(2));
        let first = s.reserve(a, 3, 60, share).expect("within");
        assert!(
            s.reserve(a, 2, 10, share).is_err(),
            "sequences past the share"
        );
        assert!(s.reserve(a, 1, 50, share).is_err(), "tokens past the share");
        let other = s
            .reserve(b, 4, 100, share)
            .expect("another client is not affected");
        // One request larger than a share goes through when its client holds nothing.
        drop(other);
        let big = s.reserve(b, 16, 10_000, share).expect("alone");
        drop(first);
        assert_eq!(s.held(a), (0, 0));
        assert!(s.reserve(a, 4, 100, share).is_ok());
        drop(big);
        assert_eq!(s.held(b), (0, 0));
    }
}
