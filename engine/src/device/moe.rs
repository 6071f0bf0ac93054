//! Mixture-of-experts work every device shares: each token's routes from its router logits
//! ([`route_rows`]), the count of what a step chose and read ([`ExpertLoad`]'s counting), and
//! experts run on the host ([`HostExperts`]): the CPU backend's, and a GPU's layers whose experts
//! stay in host memory (`--n-cpu-moe`, as llama.cpp's).

use tpslab_kernels::ThreadPool;
use tpslab_kernels::moe::{MoeScratch, Route, Router, moe_ffn, route};

use crate::device::ExpertLoad;
use crate::device::rowops::{self, FFN_ROWS, sized};
use crate::model::ops::Activation;
use crate::model::weights::Linear;

/// Each of the `logits.len() / n_expert` tokens' routes under `rule`, token-major, best first,
/// into `routes` (`rule.n_used` per token).
pub fn route_rows(
    logits: &[f32],
    n_expert: usize,
    rule: &Router,
    probs: &mut Vec<f32>,
    routes: &mut Vec<Route>,
) {
    let used = rule.n_used;
    routes.resize(logits.len() / n_expert.max(1) * used, Route::default());
    for (row, r) in logits
        .chunks_exact(n_expert)
        .zip(routes.chunks_exact_mut(used))
    {
        route(row, rule, probs, r);
    }
}

impl ExpertLoad {
    /// One more layer's routes: the tokens that chose each of its `n_expert` experts.
    pub fn count_routes(&mut self, routes: &[Route], n_expert: usize) {
        self.tokens_per_expert.resize(n_expert, 0);
        self.layers += 1;
        for r in routes {
            if let Some(n) = self.tokens_per_expert.get_mut(r.expert as usize) {
                *n += 1;
            }
        }
    }

    /// One more group of tokens run through a layer's experts: the bytes of the experts it ran
    /// (`ran`, by index) against the bytes of all of them.
    pub fn count_bytes(&mut self, expert_bytes: &[usize], ran: impl IntoIterator<Item = usize>) {
        self.bytes_total += expert_bytes.iter().sum::<usize>();
        self.bytes_read += ran
            .into_iter()
            .filter_map(|e| expert_bytes.get(e))
            .sum::<usize>();
    }
}

/// One expert's matrices on the host: its fused gate|up and its down projection.
pub type HostExpert<'w> = (&'w Linear, &'w Linear);

/// The host's buffers for running experts, grown to the largest group seen.
#[derive(Default)]
pub struct HostExperts {
    gu: Vec<f32>,
    act: Vec<f32>,
    bytes: Vec<usize>,
    moe: MoeScratch,
}

impl HostExperts {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        (self.gu.capacity() + self.act.capacity()) * 4
            + self.bytes.capacity() * std::mem::size_of::<usize>()
            + self.moe.bytes()
    }

    /// `out` (`n * width` floats) = each of the `n` rows of `h` (`k` floats each) through its
    /// `routes` (`n_used` per token, from [`route_rows`]), the experts' outputs weighted and
    /// summed in rank order; [`FFN_ROWS`] tokens at a time, each expert's tokens grouped so its
    /// weights are read once per group. The bytes read are counted into `load`.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        pool: &ThreadPool,
        experts: &[HostExpert<'_>],
        act: Activation,
        h: &[f32],
        k: usize,
        routes: &[Route],
        n_used: usize,
        width: usize,
        out: &mut [f32],
        load: &mut ExpertLoad,
    ) {
        let n = h.len() / k.max(1);
        self.bytes.clear();
        (self.bytes).extend(experts.iter().map(|(gu, d)| gu.bytes() + d.bytes()));
        let (gu, a) = (&mut self.gu, &mut self.act);
        for r0 in (0..n).step_by(FFN_ROWS) {
            let m = (n - r0).min(FFN_ROWS);
            let ran = moe_ffn(
                &h[r0 * k..(r0 + m) * k],
                k,
                &routes[r0 * n_used..(r0 + m) * n_used],
                n_used,
                experts.len(),
                width,
                &mut out[r0 * width..(r0 + m) * width],
                &mut self.moe,
                |e, xs, rows, ys| {
                    let (gate_up, down) = experts[e];
                    let ffn = gate_up.n / 2;
                    let g = sized(gu, rows * 2 * ffn);
                    gate_up.forward(pool, xs, rows, g);
                    let a = sized(a, rows * ffn);
                    rowops::gated(pool, act, g, ffn, a);
                    down.forward(pool, a, rows, ys);
                },
            );
            load.count_bytes(&self.bytes, ran.iter().map(|&e| e as usize));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpslab_kernels::moe::Gating;

    #[test]
    fn the_load_counts_each_tokens_experts_and_the_bytes_of_those_run() {
        let rule = Router {
            n_used: 2,
            gating: Gating::Softmax,
            norm: true,
            scale: 0.0,
        };
        // Three tokens over four experts: each row's two largest logits win.
        let logits = [
            4.0, 3.0, 0.0, 0.0, //
            0.0, 5.0, 0.0, 6.0, //
            0.0, 0.0, 1.0, 9.0,
        ];
        let (mut probs, mut routes) = (Vec::new(), Vec::new());
        route_rows(&logits, 4, &rule, &mut probs, &mut routes);
        let chosen: Vec<u32> = routes.iter().map(|r| r.expert).collect();
        assert_eq!(chosen, [0, 1, 3, 1, 3, 2]);
        let mut load = ExpertLoad::default();
        load.count_routes(&routes, 4);
        assert_eq!(
            (load.tokens_per_expert.as_slice(), load.layers),
            ([1, 2, 1, 2].as_slice(), 1)
        );
        load.count_bytes(&[10, 20, 30, 40], [1, 3]);
        assert_eq!((load.bytes_read, load.bytes_total), (60, 100));
        assert_eq!(load.share(), Some(0.6));
    }
}
