//! Every weight format's GPU product and row lookup against the CPU's scalar dequantization
//! (odd row counts, token counts around the launch width). Needs a GPU: where none opens, each
//! test says so and checks nothing (`scripts/test-cuda.sh` runs them on one).

use onebit_cuda::{Acts, Gpu, MATVEC_TOKENS};
use onebit_gguf::GgmlType;
use onebit_kernels::formats::{dequantize, quantize};

fn gpu() -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("no GPU, CUDA kernel test skipped: {e}");
            None
        }
    }
}

/// A fixed pseudo-random sequence in [-1, 1).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn formats() -> Vec<GgmlType> {
    GgmlType::ALL.iter().copied().filter(|&t| onebit_cuda::supports(t)).collect()
}

#[test]
fn matvec_matches_the_cpu_for_every_format() {
    let Some(g) = gpu() else { return };
    let (rows, cols) = (37, 768);
    for ty in formats() {
        let w = noise(rows * cols, ty.id() as u64 + 1);
        let mut bytes = vec![0u8; ty.bytes_for((rows * cols) as u64).unwrap() as usize];
        quantize(ty, &w, &mut bytes).unwrap();
        let mut wq = vec![0f32; rows * cols];
        dequantize(ty, &bytes, &mut wq).unwrap();
        let dw = g.upload(&bytes).unwrap();
        for n in [1, 3, MATVEC_TOKENS, MATVEC_TOKENS + 3] {
            let x = noise(n * cols, 7 + n as u64);
            let dx = g.upload(&x).unwrap();
            let mut dy = g.upload(&vec![1.0f32; n * rows]).unwrap();
            for add in [false, true] {
                // SAFETY: the buffers hold exactly the shapes passed.
                unsafe {
                    g.matvec(ty, dw.ptr(), rows, cols, dx.ptr(), onebit_cuda::DevPtr::NULL, n, dy.ptr(), rows, add)
                }
                .unwrap();
                let mut y = vec![0f32; n * rows];
                g.read(&dy, &mut y).unwrap();
                for t in 0..n {
                    for r in 0..rows {
                        let want: f64 = (0..cols).map(|c| wq[r * cols + c] as f64 * x[t * cols + c] as f64).sum();
                        let want = want + if add { 1.0 } else { 0.0 };
                        let got = y[t * rows + r] as f64;
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{ty} n={n} add={add} token {t} row {r}: {got} vs {want}"
                        );
                    }
                }
                g.write(&mut dy, &vec![1.0f32; n * rows]).unwrap();
            }
        }
    }
}

#[test]
fn dequant_rows_matches_the_cpu_for_every_format() {
    let Some(g) = gpu() else { return };
    let (rows, cols) = (9, 1280);
    for ty in formats() {
        let w = noise(rows * cols, 100 + ty.id() as u64);
        let mut bytes = vec![0u8; ty.bytes_for((rows * cols) as u64).unwrap() as usize];
        quantize(ty, &w, &mut bytes).unwrap();
        let mut want = vec![0f32; rows * cols];
        dequantize(ty, &bytes, &mut want).unwrap();
        let ids: Vec<i32> = vec![8, 0, 3, 3, 5];
        let (dw, di) = (g.upload(&bytes).unwrap(), g.upload(&ids).unwrap());
        let out = g.zeros::<f32>(ids.len() * cols).unwrap();
        // SAFETY: the buffers hold exactly the shapes passed; every id is a row of `w`.
        unsafe { g.dequant_rows(ty, dw.ptr(), cols, di.ptr(), ids.len(), out.ptr()) }.unwrap();
        let mut got = vec![0f32; ids.len() * cols];
        g.read(&out, &mut got).unwrap();
        for (i, &id) in ids.iter().enumerate() {
            for c in 0..cols {
                let (a, b) = (got[i * cols + c], want[id as usize * cols + c]);
                assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{ty} row {id} col {c}: {a} vs {b}");
            }
        }
    }
}

/// Q1_0 rows times activations rounded to int8 blocks of 32, against the same rounding on the
/// CPU (llama.cpp's Q8_0 activations) in f64: the integer products are exact, so only the
/// float steps differ. With a norm, the rows are RMS-normed before rounding.
#[test]
fn q1_products_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let (rows, cols) = (29, 1024);
    let eps = 1e-6f32;
    let quant = |w: &[f32]| {
        let mut bytes = vec![0u8; GgmlType::Q1_0.bytes_for(w.len() as u64).unwrap() as usize];
        quantize(GgmlType::Q1_0, w, &mut bytes).unwrap();
        let mut deq = vec![0f32; w.len()];
        dequantize(GgmlType::Q1_0, &bytes, &mut deq).unwrap();
        (onebit_cuda::q1_split(&bytes, w.len() / cols, cols).unwrap(), deq)
    };
    let (wb, wq) = quant(&noise(rows * cols, 3));
    let (ub, uq) = quant(&noise(rows * cols, 4));
    let norm: Vec<f32> = noise(cols, 5).iter().map(|v| 1.0 + 0.5 * v).collect();
    for n in [1, 5, MATVEC_TOKENS + 2] {
        let x = noise(n * cols, 11 + n as u64);
        // The CPU's rounding of the normed rows, as llama.cpp's quantize_row_q8_0.
        let mut xr = vec![0f32; n * cols];
        for t in 0..n {
            let row = &x[t * cols..(t + 1) * cols];
            let ss: f32 = row.iter().map(|v| v * v).sum::<f32>() / cols as f32;
            let scale = 1.0 / (ss + eps).sqrt();
            for g32 in 0..cols / 32 {
                let v: Vec<f32> = (0..32).map(|i| row[g32 * 32 + i] * scale * norm[g32 * 32 + i]).collect();
                let amax = v.iter().fold(0f32, |m, a| m.max(a.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                for i in 0..32 {
                    xr[t * cols + g32 * 32 + i] = (v[i] * id).round() * d;
                }
            }
        }
        let dot = |w: &[f32], t: usize, r: usize| -> f64 {
            (0..cols).map(|c| w[r * cols + c] as f64 * xr[t * cols + c] as f64).sum()
        };
        let (dw, du, dx, dn) =
            (g.upload(&wb).unwrap(), g.upload(&ub).unwrap(), g.upload(&x).unwrap(), g.upload(&norm).unwrap());
        let acts_buf = g.zeros::<u8>(Acts::total_bytes(n, cols)).unwrap();
        let acts = Acts::at(acts_buf.ptr(), n, cols);
        let y = g.zeros::<f32>(n * rows).unwrap();
        let mut got = vec![0f32; n * rows];
        // SAFETY: every buffer holds the shapes passed.
        unsafe {
            g.quantize_acts(dx.ptr(), dn.ptr(), eps, onebit_cuda::DevPtr::NULL, n, cols, acts).unwrap();
            g.q1_matvec(dw.ptr(), rows, cols, acts, n, y.ptr(), rows, false).unwrap();
        }
        g.read(&y, &mut got).unwrap();
        for t in 0..n {
            for r in 0..rows {
                let want = dot(&wq, t, r);
                let e = (got[t * rows + r] as f64 - want).abs();
                assert!(
                    e <= 2e-3 * (1.0 + want.abs()),
                    "q1_matvec n={n} token {t} row {r}: {} vs {want}",
                    got[t * rows + r]
                );
            }
        }
        // SAFETY: as above.
        unsafe { g.q1_glu(dw.ptr(), du.ptr(), rows, cols, acts, n, y.ptr()).unwrap() };
        g.read(&y, &mut got).unwrap();
        for t in 0..n {
            for r in 0..rows {
                let (a, b) = (dot(&wq, t, r), dot(&uq, t, r));
                let want = a / (1.0 + (-a).exp()) * b;
                let e = (got[t * rows + r] as f64 - want).abs();
                assert!(
                    e <= 2e-3 * (1.0 + want.abs()),
                    "q1_glu n={n} token {t} row {r}: {} vs {want}",
                    got[t * rows + r]
                );
            }
        }
    }
}
