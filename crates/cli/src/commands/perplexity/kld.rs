//! Running sums of a `--kl-divergence` comparison and llama-perplexity's report of them: a
//! line per chunk (PPL, ln(PPL(Q)/PPL(base)), KL divergence, Δp RMS, same top token), then the
//! perplexity, KL divergence and token probability statistics with their percentiles.
//!
//! Uncertainties are standard errors of means; the ln ratio's takes the covariance of the two
//! models' log-likelihoods into account, since they score the same tokens.

use std::fmt::Write;

use super::score::Compared;

#[derive(Clone, Debug, Default)]
pub struct KldSums {
    nll: f64,
    nll2: f64,
    nll_base: f64,
    nll_base2: f64,
    nll_nll_base: f64,
    kld: f64,
    kld2: f64,
    p_diff: f64,
    p_diff2: f64,
    p_diff4: f64,
    same_top: usize,
    pub count: usize,
    /// Every position's KL divergence and Δp, for the percentiles.
    klds: Vec<f32>,
    p_diffs: Vec<f32>,
}

/// The mean of `count` values from their sum and sum of squares, and its standard error
/// (0 for ten values or fewer).
fn mean_err(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count == 0 {
        return (0.0, 0.0);
    }
    let n = count as f64;
    let mean = sum / n;
    let var = sum2 / n - mean * mean;
    (mean, if var > 0.0 && count > 10 { (var / (n - 1.0)).sqrt() } else { 0.0 })
}

/// The covariance of two means (0 for fewer than ten values).
fn cov(sum_a: f64, sum_b: f64, sum_ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (sum_ab / n - (sum_a / n) * (sum_b / n)) / (n - 1.0)
}

/// Linear interpolation between the two nearest of sorted `v`.
fn percentile(v: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return v[0];
    }
    if fraction >= 1.0 {
        return v[v.len() - 1];
    }
    let p = fraction * (v.len() - 1) as f32;
    let i = p as usize;
    let t = p - i as f32;
    (1.0 - t) * v[i] + t * v[(i + 1).min(v.len() - 1)]
}

fn median(v: &[f32]) -> f32 {
    let n = v.len();
    if n.is_multiple_of(2) { 0.5 * (v[n / 2] + v[n / 2 - 1]) } else { v[n / 2] }
}

/// Mean ln PPL of the two models, their standard errors and the ln ratio's.
struct LogPpl {
    q: (f64, f64),
    base: (f64, f64),
    cov: f64,
}

impl LogPpl {
    fn ratio(&self) -> (f64, f64) {
        let var = self.q.1 * self.q.1 + self.base.1 * self.base.1 - 2.0 * self.cov;
        (self.q.0 - self.base.0, var.max(0.0).sqrt())
    }
}

impl KldSums {
    pub fn add(&mut self, c: &Compared) {
        self.nll += c.nll;
        self.nll2 += c.nll * c.nll;
        self.nll_base += c.nll_base;
        self.nll_base2 += c.nll_base * c.nll_base;
        self.nll_nll_base += c.nll * c.nll_base;
        self.kld += c.kld;
        self.kld2 += c.kld * c.kld;
        let d = c.p_diff as f64;
        self.p_diff += d;
        self.p_diff2 += d * d;
        self.p_diff4 += d * d * d * d;
        self.same_top += usize::from(c.same_top);
        self.count += 1;
        self.klds.push(c.kld as f32);
        self.p_diffs.push(c.p_diff);
    }

    fn log_ppl(&self) -> LogPpl {
        LogPpl {
            q: mean_err(self.nll, self.nll2, self.count),
            base: mean_err(self.nll_base, self.nll_base2, self.count),
            cov: cov(self.nll, self.nll_base, self.nll_nll_base, self.count),
        }
    }

    pub fn mean_kld(&self) -> (f64, f64) {
        mean_err(self.kld, self.kld2, self.count)
    }

    /// The fraction of positions where both models put the same token first, and its error.
    pub fn same_top(&self) -> (f64, f64) {
        let p = self.same_top as f64 / self.count as f64;
        (p, (p * (1.0 - p) / (self.count as f64 - 1.0)).sqrt())
    }

    fn rms_p_diff(&self) -> (f64, f64) {
        let (mse, mse_err) = mean_err(self.p_diff2, self.p_diff4, self.count);
        let rms = mse.sqrt();
        (rms, if rms > 0.0 { 0.5 / rms * mse_err } else { 0.0 })
    }

    pub const HEADER: &str = "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p";

    /// The line after chunk `chunk` (1-based), over every position so far.
    pub fn chunk_line(&self, chunk: usize) -> String {
        let lp = self.log_ppl();
        let ppl = lp.q.0.exp();
        let ratio = lp.ratio();
        let kld = self.mean_kld();
        let rms = self.rms_p_diff();
        let top = self.same_top();
        format!(
            "{chunk:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
            ppl,
            ppl * lp.q.1,
            ratio.0,
            ratio.1,
            kld.0,
            kld.1,
            100.0 * rms.0,
            100.0 * rms.1,
            100.0 * top.0,
            100.0 * top.1
        )
    }

    /// The closing statistics, or `None` for fewer than 100 positions (too few to say much).
    pub fn report(&mut self) -> Option<String> {
        if self.count < 100 {
            return None;
        }
        self.klds.sort_by(f32::total_cmp);
        self.p_diffs.sort_by(f32::total_cmp);
        let mut s = String::new();
        let lp = self.log_ppl();
        let (ppl, ppl_err) = (lp.q.0.exp(), lp.q.0.exp() * lp.q.1);
        let (base, base_err) = (lp.base.0.exp(), lp.base.0.exp() * lp.base.1);
        let ratio = lp.ratio();
        let w = &mut s;
        // Writing to a String cannot fail.
        let _ = writeln!(w, "====== Perplexity statistics ======");
        let _ = writeln!(w, "Mean PPL(Q)                   : {ppl:10.6} ± {ppl_err:10.6}");
        let _ = writeln!(w, "Mean PPL(base)                : {base:10.6} ± {base_err:10.6}");
        let _ = writeln!(w, "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%", 100.0 * lp.cov / (lp.q.1 * lp.base.1));
        let _ = writeln!(w, "Mean ln(PPL(Q)/PPL(base))     : {:10.6} ± {:10.6}", ratio.0, ratio.1);
        let r = ratio.0.exp();
        let _ = writeln!(w, "Mean PPL(Q)/PPL(base)         : {r:10.6} ± {:10.6}", r * ratio.1);
        let diff_var = ppl_err * ppl_err + base_err * base_err - 2.0 * ppl * base * lp.cov;
        let _ = writeln!(w, "Mean PPL(Q)-PPL(base)         : {:10.6} ± {:10.6}", ppl - base, diff_var.max(0.0).sqrt());
        let _ = writeln!(w);
        let _ = writeln!(w, "====== KL divergence statistics ======");
        let kld = self.mean_kld();
        let k = &self.klds;
        let _ = writeln!(w, "Mean    KLD: {:10.6} ± {:10.6}", kld.0, kld.1);
        let _ = writeln!(w, "Maximum KLD: {:10.6}", k[k.len() - 1]);
        for (label, f) in [("99.9%", 0.999), ("99.0%", 0.99), ("95.0%", 0.95), ("90.0%", 0.9)] {
            let _ = writeln!(w, "{label}   KLD: {:10.6}", percentile(k, f));
        }
        let _ = writeln!(w, "Median  KLD: {:10.6}", median(k));
        for (label, f) in [("10.0%", 0.1), (" 5.0%", 0.05), (" 1.0%", 0.01), (" 0.1%", 0.001)] {
            let _ = writeln!(w, "{label}   KLD: {:10.6}", percentile(k, f));
        }
        let _ = writeln!(w, "Minimum KLD: {:10.6}", k[0]);
        let _ = writeln!(w);
        let _ = writeln!(w, "====== Token probability statistics ======");
        let pd = mean_err(self.p_diff, self.p_diff2, self.count);
        let d = &self.p_diffs;
        let _ = writeln!(w, "Mean    Δp: {:6.3} ± {:5.3} %", 100.0 * pd.0, 100.0 * pd.1);
        let _ = writeln!(w, "Maximum Δp: {:6.3}%", 100.0 * d[d.len() - 1]);
        for (label, f) in [("99.9%", 0.999), ("99.0%", 0.99), ("95.0%", 0.95), ("90.0%", 0.9), ("75.0%", 0.75)] {
            let _ = writeln!(w, "{label}   Δp: {:6.3}%", 100.0 * percentile(d, f));
        }
        let _ = writeln!(w, "Median  Δp: {:6.3}%", 100.0 * median(d));
        for (label, f) in [("25.0%", 0.25), ("10.0%", 0.1), (" 5.0%", 0.05), (" 1.0%", 0.01), (" 0.1%", 0.001)] {
            let _ = writeln!(w, "{label}   Δp: {:6.3}%", 100.0 * percentile(d, f));
        }
        let _ = writeln!(w, "Minimum Δp: {:6.3}%", 100.0 * d[0]);
        let rms = self.rms_p_diff();
        let _ = writeln!(w, "RMS Δp    : {:6.3} ± {:5.3} %", 100.0 * rms.0, 100.0 * rms.1);
        let top = self.same_top();
        let _ = writeln!(w, "Same top p: {:6.3} ± {:5.3} %", 100.0 * top.0, 100.0 * top.1);
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_between_neighbours() {
        let v = [0.0, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.0), 0.0);
        assert_eq!(percentile(&v, 1.0), 4.0);
        assert_eq!(percentile(&v, 0.5), 2.0);
        assert!((percentile(&v, 0.9) - 3.6).abs() < 1e-6);
        assert_eq!(median(&v[..4]), 1.5);
    }

    #[test]
    fn identical_models_report_no_divergence() {
        let mut s = KldSums::default();
        for i in 0..200 {
            let nll = 1.0 + (i % 7) as f64 * 0.3;
            s.add(&Compared { nll, nll_base: nll, kld: 0.0, p_diff: 0.0, same_top: true });
        }
        let report = s.report().unwrap();
        assert!(report.contains("Mean ln(PPL(Q)/PPL(base))     :   0.000000 ±   0.000000"), "{report}");
        assert!(report.contains("Same top p: 100.000 ± 0.000 %"), "{report}");
        assert!(report.contains("Cor(ln(PPL(Q)), ln(PPL(base))): 100.00%"), "{report}");
    }
}
