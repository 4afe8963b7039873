//! The arithmetic of one scored position: its negative log-likelihood, its row of log
//! probabilities as llama-perplexity stores them for `--kl-divergence-base`, and its comparison
//! with such a stored row (KL divergence, top-1 agreement, change of the token's probability).
//!
//! Logits are normalized with the kernels' vectorized softmax; everything after that sums in
//! f64, as llama-perplexity does.

use std::cell::RefCell;

use onebit_kernels::Kernels;

/// Base log probabilities below this are left out of the KL divergence (llama-perplexity's
/// cut-off: they are stored at the resolution floor, `max - 16`, anyway).
const LOG_P_FLOOR: f32 = -16.0;

thread_local! {
    /// A row's copy that the softmax works on, one per pool thread, reused from row to row.
    static SOFTMAX: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A row of logits, normalized: the first of its largest logits, and `ln Σ exp(x − max)`.
#[derive(Clone, Copy, Debug)]
pub struct Norm {
    pub imax: usize,
    pub max: f32,
    pub lse: f64,
}

impl Norm {
    /// `ln p(tok)` under this row's distribution, negated.
    pub fn nll(&self, logits: &[f32], tok: usize) -> f64 {
        self.max as f64 + self.lse - logits[tok] as f64
    }
}

/// Normalize `logits`. The vectorized softmax leaves `exp(0) · (1 / Σ) = 1 / Σ` at the largest
/// logit, so one softmax gives the log of the sum; a row it cannot handle (infinite or
/// non-finite values) is summed exactly instead.
pub fn normalize(kernels: Kernels, logits: &[f32]) -> Norm {
    let mut imax = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[imax] {
            imax = i;
        }
    }
    let max = logits[imax];
    let p_max = SOFTMAX.with_borrow_mut(|buf| {
        buf.clear();
        buf.extend_from_slice(logits);
        kernels.softmax(buf);
        buf[imax]
    });
    let lse = if p_max.is_finite() && p_max > 0.0 {
        -(p_max as f64).ln()
    } else {
        logits.iter().map(|&v| ((v - max) as f64).exp()).sum::<f64>().ln()
    };
    Norm { imax, max, lse }
}

/// u16s per stored row: two f32 (scale, lowest log probability), then one u16 per token,
/// padded to an even count (llama-perplexity's `2*((n_vocab + 1)/2) + 4`).
pub fn record_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Store a row's log probabilities in 16 bits over the top 16 nats below its maximum:
/// `ln p_i = scale · q_i + lowest`, `q_i = 0` for everything at or below the floor.
pub fn quantize_row(logits: &[f32], norm: &Norm, out: &mut [u16]) {
    let lowest_logit = logits.iter().copied().fold(norm.max, f32::min).max(norm.max - 16.0);
    let scale = (norm.max - lowest_logit) / 65535.0;
    let lowest = lowest_logit - norm.max - norm.lse as f32;
    let (head, q) = out.split_at_mut(4);
    for (pair, v) in head.chunks_mut(2).zip([scale, lowest]) {
        let bits = v.to_bits();
        pair[0] = bits as u16;
        pair[1] = (bits >> 16) as u16;
    }
    q.fill(0);
    if scale > 0.0 {
        let inv = 1.0 / scale;
        for (o, &v) in q.iter_mut().zip(logits) {
            if v > lowest_logit {
                // A saturating cast: the largest rounds to 65535 (or a hair above it).
                *o = (inv * (v - lowest_logit)).round_ties_even() as u16;
            }
        }
    }
}

/// How one position of the model under test compares with the stored base.
#[derive(Clone, Copy, Debug, Default)]
pub struct Compared {
    pub nll: f64,
    pub nll_base: f64,
    pub kld: f64,
    /// p(tok) − p_base(tok).
    pub p_diff: f32,
    pub same_top: bool,
}

/// Compare a row of logits with a stored base row (`record_len` u16s) at target `tok`.
pub fn compare_row(logits: &[f32], norm: &Norm, base: &[u16], tok: usize) -> Compared {
    let f = |i: usize| f32::from_bits(base[i] as u32 | (base[i + 1] as u32) << 16);
    let (scale, lowest) = (f(0), f(2));
    let q = &base[4..4 + logits.len()];
    let log_z = norm.max + norm.lse as f32;
    let mut kld = 0.0f64;
    let (mut imax_base, mut top_base) = (0, f32::NEG_INFINITY);
    for (i, (&qi, &x)) in q.iter().zip(logits).enumerate() {
        let lp_base = scale * qi as f32 + lowest;
        if lp_base > top_base {
            (imax_base, top_base) = (i, lp_base);
        }
        if lp_base > LOG_P_FLOOR {
            kld += (lp_base.exp() * (lp_base - (x - log_z))) as f64;
        }
    }
    let nll = norm.nll(logits, tok);
    let nll_base = -((scale * q[tok] as f32 + lowest) as f64);
    let p_diff = (-nll).exp() as f32 - (-nll_base).exp() as f32;
    Compared { nll, nll_base, kld, p_diff, same_top: imax_base == norm.imax }
}

/// Running sums of the negative log-likelihood, for `[k]ppl` and the final estimate.
#[derive(Clone, Debug, Default)]
pub struct PplSums {
    nll: f64,
    nll2: f64,
    pub count: usize,
}

impl PplSums {
    pub fn add(&mut self, nll: f64) {
        self.nll += nll;
        self.nll2 += nll * nll;
        self.count += 1;
    }

    pub fn ppl(&self) -> f64 {
        (self.nll / self.count as f64).exp()
    }

    /// The perplexity and its standard error (of the mean log-likelihood, carried through
    /// `exp`), or `None` while the spread is not positive.
    pub fn estimate(&self) -> Option<(f64, f64)> {
        let n = self.count as f64;
        let mean = self.nll / n;
        let var = self.nll2 / n - mean * mean;
        (var > 0.0 && self.count > 1).then(|| {
            let ppl = mean.exp();
            (ppl, (var / (n - 1.0)).sqrt() * ppl)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onebit_kernels::KernelTier;

    fn logits(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 30.0 - 15.0
            })
            .collect()
    }

    fn exact_lse(x: &[f32]) -> f64 {
        let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
    }

    #[test]
    fn normalize_matches_an_exact_sum_on_every_tier() {
        let mut tiers = vec![Kernels::best()];
        tiers.extend(Kernels::new(KernelTier::Scalar).ok());
        for k in tiers {
            for (n, seed) in [(49_152, 1), (151_936, 2), (17, 3), (1, 4)] {
                let x = logits(n, seed);
                let norm = normalize(k, &x);
                assert_eq!(x[norm.imax], x.iter().copied().fold(f32::NEG_INFINITY, f32::max));
                let got = norm.max as f64 + norm.lse;
                assert!((got - exact_lse(&x)).abs() < 2e-5, "{}: n {n}: {got} vs {}", k.tier(), exact_lse(&x));
            }
        }
    }

    #[test]
    fn a_stored_row_compared_with_itself_diverges_by_almost_nothing() {
        let k = Kernels::best();
        let x = logits(1000, 7);
        let norm = normalize(k, &x);
        let mut rec = vec![0u16; record_len(x.len())];
        quantize_row(&x, &norm, &mut rec);
        let c = compare_row(&x, &norm, &rec, 3);
        assert!(c.same_top);
        assert!(c.kld.abs() < 1e-6, "{}", c.kld);
        assert!((c.nll - c.nll_base).abs() < 1e-3 && c.p_diff.abs() < 1e-5, "{c:?}");
    }

    #[test]
    fn record_length_is_even_with_room_for_the_header() {
        assert_eq!(record_len(49_152), 49_156);
        assert_eq!(record_len(5), 10);
    }
}
