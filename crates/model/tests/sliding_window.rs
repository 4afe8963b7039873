//! Sliding-window layers in blocks of their own (a split pool): a sequence that gives back the
//! window blocks it no longer reads, and takes recycled ones for new positions, gets the logits
//! of a cache that keeps everything, bit for bit; a window table missing a block the batch
//! reads is an error.

use onebit_kernels::Pool;
use onebit_model::{BLOCK_TOKENS, LogitsWanted, Model, ModelError, ModelOptions, NO_BLOCK, Scratch, SeqInput};

/// Gemma 3 270M with a window of 40: not a multiple of a block, and shorter than attention's
/// runs of rows, so that what a window reads is rounded down past its start.
const WINDOW: u32 = 40;

fn model() -> Option<Model> {
    let path = onebit_testkit::gemma3_with_window(WINDOW)?;
    Some(Model::load(path, &ModelOptions::default()).unwrap())
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 1000 + (i * 7919) % 50_000).collect()
}

/// Chunks of a prefill then decode steps: every kind of step a sequence sees.
const CHUNKS: [usize; 9] = [23, 1, 32, 17, 1, 1, 30, 1, 64];

#[test]
fn window_blocks_given_back_and_reused_change_no_logit() {
    let Some(m) = model() else { return };
    let c = m.config();
    assert_eq!(c.sliding_window(), Some(WINDOW as usize));
    let pool = Pool::new(2);
    let tokens = prompt(CHUNKS.iter().sum());

    // The reference: one cache holding every position of every layer.
    let mut cache = m.new_cache(tokens.len()).unwrap();
    let mut sc = Scratch::new();
    let mut want = Vec::new();
    let mut at = 0;
    for n in CHUNKS {
        let out = m.forward_one(&pool, &mut cache, &tokens[at..at + n], LogitsWanted::All, &mut sc).unwrap();
        want.extend(out.rows_of(0).map(|(_, l)| l.to_vec()));
        at += n;
    }

    // A split pool with room for one window's worth of blocks: the window table gives back
    // what the next step no longer reads, and new positions take the blocks given back last.
    let span = c.window_span(64).unwrap().div_ceil(BLOCK_TOKENS);
    let n_blocks = tokens.len().div_ceil(BLOCK_TOKENS);
    let mut kv = m.new_split_pool(n_blocks, span).unwrap();
    let full: Vec<u32> = (0..n_blocks as u32).rev().collect();
    let mut free: Vec<u32> = (0..span as u32).collect();
    let mut window: Vec<u32> = Vec::new();
    let mut given_back = 0;
    let mut at = 0;
    for n in CHUNKS {
        let first = (c.window_reads_from(at) / BLOCK_TOKENS).min(window.len());
        for entry in &mut window[..first] {
            if *entry != NO_BLOCK {
                free.push(std::mem::replace(entry, NO_BLOCK));
                given_back += 1;
            }
        }
        while window.len() * BLOCK_TOKENS < at + n {
            window.push(free.pop().expect("a window's worth of blocks is enough"));
        }
        let input = SeqInput {
            tokens: &tokens[at..at + n],
            start: at,
            blocks: &full[..(at + n).div_ceil(BLOCK_TOKENS)],
            window_blocks: Some(&window),
            logits: LogitsWanted::All,
        };
        let out = m.forward(&pool, &mut kv, &[input], &mut sc).unwrap();
        for (i, row) in out.rows_of(0) {
            assert!(row == &want[at + i][..], "position {} differs from the cache that keeps everything", at + i);
        }
        at += n;
    }
    assert!(given_back >= 4, "the window slid over {given_back} blocks only");

    // The same table with a block the next step reads given back: an error, not a wrong read.
    let first = c.window_reads_from(at) / BLOCK_TOKENS;
    window[first] = NO_BLOCK;
    let input = SeqInput {
        tokens: &[5],
        start: at,
        blocks: &full[..(at + 1).div_ceil(BLOCK_TOKENS)],
        window_blocks: Some(&window),
        logits: LogitsWanted::Last,
    };
    let err = m.forward(&pool, &mut kv, &[input], &mut sc).unwrap_err();
    assert!(matches!(err, ModelError::BadBatch(_)), "{err}");
}
