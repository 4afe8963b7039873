//! The mixture-of-experts MLP (Qwen3-MoE): per token, a router picks `n_used` of the layer's
//! experts, each a gated MLP of its own, and their outputs add up weighted by the router.
//!
//! Routing as llama.cpp routes Qwen3-MoE: a softmax over all the router's logits, the `n_used`
//! most probable experts, and their probabilities renormalised to sum to 1.
//!
//! A batch is grouped by expert: the rows routed to an expert are gathered, go through its
//! three matrices in one product each (so each expert's weights are read once per batch, not
//! once per token), and the results are added, weighted, into their tokens' rows. A token's
//! result depends on its own row only: its experts' outputs are added in the order of the
//! experts' indices, whatever else shares the batch (with two experts per token, the order of
//! llama.cpp's sum too).

use crate::error::ModelError;
use crate::forward::{Net, Scratch};
use crate::weights::Experts;

/// The buffers of [`Net::moe_mlp`], reused from layer to layer and pass to pass.
#[derive(Default)]
pub(crate) struct MoeScratch {
    /// The router's logits, then probabilities: a row of `n_experts` per token.
    probs: Vec<f32>,
    /// Per token, its `n_used` picks: (expert, weight).
    picks: Vec<(usize, f32)>,
    /// The picks grouped by expert: (token, weight), tokens in batch order.
    routed: Vec<(usize, f32)>,
    /// Where each expert's group starts in `routed`, and one past the last (`n_experts + 1`).
    starts: Vec<usize>,
    /// Where the next pick of each expert goes, while grouping.
    next: Vec<usize>,
    /// One expert's gathered rows, then its results.
    rows: Vec<f32>,
    /// Every token's weighted sum of its experts.
    sum: Vec<f32>,
}

/// Llama.cpp's floor on the sum of the chosen probabilities (2⁻¹⁴, the smallest normal f16),
/// which keeps the division finite.
const MIN_WEIGHT_SUM: f32 = 1.0 / 16384.0;

/// Fill `picks` with the `picks.len()` largest of the probabilities `p` (the lower index first
/// among equals), each with its probability over the sum of those chosen.
pub(crate) fn route(p: &[f32], picks: &mut [(usize, f32)]) {
    for slot in 0..picks.len() {
        let mut best: Option<usize> = None;
        for (e, &v) in p.iter().enumerate() {
            if picks[..slot].iter().any(|&(chosen, _)| chosen == e) {
                continue;
            }
            if best.is_none_or(|b| v > p[b]) {
                best = Some(e);
            }
        }
        let e = best.expect("no more experts used than there are");
        picks[slot] = (e, p[e]);
    }
    // Summed wider, as ggml sums rows.
    let sum = picks.iter().map(|&(_, w)| w as f64).sum::<f64>() as f32;
    let sum = sum.max(MIN_WEIGHT_SUM);
    picks.iter_mut().for_each(|(_, w)| *w /= sum);
}

impl Net<'_> {
    /// The normed rows `sc.xn[..n]` through the layer's experts, written over them.
    pub(crate) fn moe_mlp(&self, ex: &Experts, sc: &mut Scratch, n: usize) -> Result<(), ModelError> {
        let c = self.config;
        let m = c.moe.expect("experts only in a mixture-of-experts model");
        let (h, ne, k) = (c.hidden, m.n_experts, m.n_used);
        let xn = &mut sc.xn[..n * h];
        let ms = &mut sc.moe;

        // Route every token.
        ms.probs.resize(n * ne, 0.0);
        self.project(xn, h, &[&self.mat(&ex.router)], &mut [&mut ms.probs[..n * ne]], &mut sc.acts)?;
        ms.picks.resize(n * k, (0, 0.0));
        for (p, picks) in ms.probs[..n * ne].chunks_exact_mut(ne).zip(ms.picks.chunks_exact_mut(k)) {
            self.kernels.softmax(p);
            route(p, picks);
        }

        // Group the picks by expert (a counting sort: tokens stay in batch order).
        ms.starts.clear();
        ms.starts.resize(ne + 1, 0);
        for &(e, _) in &ms.picks[..n * k] {
            ms.starts[e + 1] += 1;
        }
        for e in 0..ne {
            ms.starts[e + 1] += ms.starts[e];
        }
        ms.next.clear();
        ms.next.extend_from_slice(&ms.starts[..ne]);
        ms.routed.resize(n * k, (0, 0.0));
        for (t, picks) in ms.picks[..n * k].chunks_exact(k).enumerate() {
            for &(e, w) in picks {
                ms.routed[ms.next[e]] = (t, w);
                ms.next[e] += 1;
            }
        }

        // Each expert once over the rows routed to it; its results added into their tokens'.
        ms.sum.clear();
        ms.sum.resize(n * h, 0.0);
        for e in 0..ne {
            let group = &ms.routed[ms.starts[e]..ms.starts[e + 1]];
            if group.is_empty() {
                continue;
            }
            ms.rows.resize(group.len() * h, 0.0);
            let rows = &mut ms.rows[..group.len() * h];
            for (row, &(t, _)) in rows.chunks_exact_mut(h).zip(group) {
                row.copy_from_slice(&xn[t * h..(t + 1) * h]);
            }
            let mats = [&self.mat(&ex.gate[e]), &self.mat(&ex.up[e]), &self.mat(&ex.down[e])];
            self.gated_mlp(mats, rows, &mut sc.acts, &mut sc.mlp)?;
            for (row, &(t, w)) in rows.chunks_exact(h).zip(group) {
                // Weighted, then added: ggml's two operations, rounded as they round.
                for (s, &y) in ms.sum[t * h..(t + 1) * h].iter_mut().zip(row) {
                    *s += y * w;
                }
            }
        }
        xn.copy_from_slice(&ms.sum[..n * h]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_pick_the_most_probable_and_renormalise() {
        let p = [0.1, 0.4, 0.05, 0.3, 0.15];
        let mut picks = [(0, 0.0); 2];
        route(&p, &mut picks);
        assert_eq!(picks[0].0, 1);
        assert_eq!(picks[1].0, 3);
        assert!((picks[0].1 - 0.4 / 0.7).abs() < 1e-6 && (picks[1].1 - 0.3 / 0.7).abs() < 1e-6);
        assert!((picks[0].1 + picks[1].1 - 1.0).abs() < 1e-6);
    }

    #[test]
    fn ties_go_to_the_lower_index() {
        let p = [0.25; 4];
        let mut picks = [(9, 0.0); 3];
        route(&p, &mut picks);
        assert_eq!(picks.map(|p| p.0), [0, 1, 2]);
        assert!(picks.iter().all(|&(_, w)| (w - 1.0 / 3.0).abs() < 1e-7));
    }

    #[test]
    fn a_vanishing_sum_is_floored() {
        let p = [0.0, 0.0, 1.0];
        let mut picks = [(0, 0.0); 2];
        route(&p[..2], &mut picks);
        assert_eq!(picks, [(0, 0.0), (1, 0.0)]);
    }
}
