//! Which waiting request starts next, and whom a full batch preempts for it: the policy's order
//! (queue order under FCFS, priority then arrival under [`Policy::Priority`]), and within it
//! each client's fair share of the batch (see the module docs of [`crate::sched`]).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{Policy, RequestId, Scheduler, SchedulerOutput};

/// Who sent a request, for fair shares of the batch: the server derives one per API key (or
/// per address without a key); [`ClientId::LOCAL`] is the machine's own user (the window, the
/// command line, and every caller that names no client).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct ClientId(pub u64);

impl ClientId {
    pub const LOCAL: Self = Self(0);
}

impl Scheduler {
    /// The policy's class of a request: its priority under [`Policy::Priority`], one class for
    /// all under FCFS. A lower class is more urgent.
    fn class(&self, id: RequestId) -> i32 {
        self.order_key(id).0
    }

    fn client(&self, id: RequestId) -> ClientId {
        self.reqs.get(&id).map_or(ClientId::LOCAL, |r| r.client)
    }

    /// Running sequences per client.
    fn running_per_client(&self) -> HashMap<ClientId, usize> {
        let mut n = HashMap::new();
        for &id in &self.running {
            *n.entry(self.client(id)).or_insert(0) += 1;
        }
        n
    }

    /// Index in `waiting` of the next request to start: the most urgent class first, then the
    /// client running the fewest sequences, then the policy's order (the queue's under FCFS,
    /// arrival under Priority).
    pub(super) fn next_waiting(&self) -> Option<usize> {
        if self.waiting.is_empty() {
            return None;
        }
        self.next_waiting_of(&self.running_per_client())
    }

    /// [`Self::next_waiting`] with the running sequences per client already counted.
    fn next_waiting_of(&self, running: &HashMap<ClientId, usize>) -> Option<usize> {
        (0..self.waiting.len()).min_by_key(|&i| {
            let id = self.waiting[i];
            let (class, arrival) = self.order_key(id);
            let share = running.get(&self.client(id)).copied().unwrap_or(0);
            match self.config.policy {
                Policy::Fcfs => (class, share, 0, i),
                Policy::Priority => (class, share, arrival, i),
            }
        })
    }

    /// With every batch slot taken, makes room (one request per step) for the next waiting
    /// request: under [`Policy::Priority`] by preempting the worst running request when the
    /// waiting one is strictly more urgent; otherwise, when its client runs at least two fewer
    /// sequences than the client running the most, by preempting that client's newest request
    /// of a class no more urgent than the waiting one's. Neither can thrash: equal priorities
    /// never preempt each other, and a share moved leaves the preempted client running at least
    /// as many as the one it made room for.
    pub(super) fn preempt_for_waiting(&mut self, out: &mut SchedulerOutput) {
        if self.running.len() < self.config.max_num_seqs {
            return;
        }
        let running = self.running_per_client();
        let (Some(idx), Some(&worst)) = (self.next_waiting_of(&running), self.running.last())
        else {
            return;
        };
        let next = self.waiting[idx];
        let class = self.class(next);
        if self.config.policy == Policy::Priority && class < self.class(worst) {
            self.running.pop();
            self.preempt(worst, out);
            return;
        }
        let mine = running.get(&self.client(next)).copied().unwrap_or(0);
        let Some((&hog, &most)) = running.iter().max_by_key(|&(c, n)| (*n, *c)) else {
            return;
        };
        if most < mine + 2 {
            return;
        }
        // `running` is in service order: the hog's last one is its newest (or least urgent).
        let victim = (0..self.running.len()).rev().find(|&i| {
            let id = self.running[i];
            self.client(id) == hog && self.class(id) >= class
        });
        if let Some(i) = victim {
            let id = self.running.remove(i);
            self.preempt(id, out);
        }
    }

    /// Whom to preempt for KV blocks while scheduling `running[at]`: among the requests after
    /// it (not scheduled yet in this step), those of the least urgent class, of those the
    /// newest of the client running the most sequences. `None` when it is the last.
    pub(super) fn kv_victim(&self, at: usize) -> Option<usize> {
        let after = at + 1..self.running.len();
        let worst = after.clone().map(|i| self.class(self.running[i])).max()?;
        let running = self.running_per_client();
        after
            .filter(|&i| self.class(self.running[i]) == worst)
            .max_by_key(|&i| {
                let n = running.get(&self.client(self.running[i])).copied();
                (n.unwrap_or(0), i)
            })
    }
}
