//! The forward pass over batches: several sequences at their own positions in one pass give
//! what each gives alone, bit for bit; chunked prefill equals one prefill; sequences may share
//! the blocks of a common prefix; a full context and bad block tables are errors.

use onebit_kernels::Pool;
use onebit_model::{BLOCK_TOKENS, LogitsWanted, Model, ModelError, ModelOptions, Scratch, SeqInput};

fn model() -> Option<Model> {
    let path = onebit_testkit::shared_file("models/qwen2-f16.gguf")?;
    Some(Model::load(path, &ModelOptions::default()).unwrap())
}

/// Every row of logits of `toks` run alone, in a cache of its own.
fn alone(m: &Model, pool: &Pool, toks: &[u32]) -> Vec<Vec<f32>> {
    let mut c = m.new_cache(64).unwrap();
    m.forward_one(pool, &mut c, toks, LogitsWanted::All, &mut Scratch::new())
        .unwrap()
        .rows_of(0)
        .map(|(_, l)| l.to_vec())
        .collect()
}

#[test]
fn sequences_in_one_batch_match_sequences_alone() {
    let Some(m) = model() else { return };
    let pool = Pool::new(2);
    let mut sc = Scratch::new();
    let (a, b) = ([10u32, 20, 30, 40, 50], [7u32, 8, 9, 10, 11, 12, 13]);
    let (la, lb) = (alone(&m, &pool, &a), alone(&m, &pool, &b));
    // Two sequences in one pool, with interleaved, out-of-order block tables.
    let mut kv = m.new_pool(8).unwrap();
    let (ta, tb) = ([5u32, 2], [0u32, 7]);
    let out = m
        .forward(
            &pool,
            &mut kv,
            &[
                SeqInput { tokens: &a, start: 0, blocks: &ta, window_blocks: None, logits: LogitsWanted::All },
                SeqInput { tokens: &b, start: 0, blocks: &tb, window_blocks: None, logits: LogitsWanted::All },
            ],
            &mut sc,
        )
        .unwrap();
    for (i, l) in la.iter().enumerate() {
        assert_eq!(out.get(0, i).unwrap(), &l[..], "sequence a, token {i}");
    }
    for (i, l) in lb.iter().enumerate() {
        assert_eq!(out.get(1, i).unwrap(), &l[..], "sequence b, token {i}");
    }
    // Continue both with one token each: a decode step of two sequences at different positions.
    let out = m
        .forward(
            &pool,
            &mut kv,
            &[
                SeqInput {
                    tokens: &[99],
                    start: a.len(),
                    blocks: &ta,
                    window_blocks: None,
                    logits: LogitsWanted::Last,
                },
                SeqInput {
                    tokens: &[98],
                    start: b.len(),
                    blocks: &tb,
                    window_blocks: None,
                    logits: LogitsWanted::Last,
                },
            ],
            &mut sc,
        )
        .unwrap();
    let la2 = alone(&m, &pool, &[10, 20, 30, 40, 50, 99]);
    let lb2 = alone(&m, &pool, &[7, 8, 9, 10, 11, 12, 13, 98]);
    assert_eq!(out.last(0).unwrap(), &la2.last().unwrap()[..]);
    assert_eq!(out.last(1).unwrap(), &lb2.last().unwrap()[..]);
}

#[test]
fn sequences_share_the_blocks_of_a_common_prefix() {
    let Some(m) = model() else { return };
    let pool = Pool::new(2);
    let mut sc = Scratch::new();
    let prefix: Vec<u32> = (0..2 * BLOCK_TOKENS as u32).map(|i| 100 + 3 * i).collect();
    let mut kv = m.new_pool(6).unwrap();
    m.forward(
        &pool,
        &mut kv,
        &[SeqInput { tokens: &prefix, start: 0, blocks: &[3, 1], window_blocks: None, logits: LogitsWanted::None }],
        &mut sc,
    )
    .unwrap();
    // Both continue from the two shared blocks into blocks of their own.
    let (ta, tb) = ([3u32, 1, 0], [3u32, 1, 4]);
    let out = m
        .forward(
            &pool,
            &mut kv,
            &[
                SeqInput {
                    tokens: &[5, 6],
                    start: prefix.len(),
                    blocks: &ta,
                    window_blocks: None,
                    logits: LogitsWanted::Last,
                },
                SeqInput {
                    tokens: &[9],
                    start: prefix.len(),
                    blocks: &tb,
                    window_blocks: None,
                    logits: LogitsWanted::Last,
                },
            ],
            &mut sc,
        )
        .unwrap();
    let with = |tail: &[u32]| [&prefix[..], tail].concat();
    assert_eq!(out.last(0).unwrap(), &alone_long(&m, &pool, &with(&[5, 6]))[..]);
    assert_eq!(out.last(1).unwrap(), &alone_long(&m, &pool, &with(&[9]))[..]);
}

/// The last logits of `toks` alone.
fn alone_long(m: &Model, pool: &Pool, toks: &[u32]) -> Vec<f32> {
    let mut c = m.new_cache(toks.len()).unwrap();
    m.forward_one(pool, &mut c, toks, LogitsWanted::Last, &mut Scratch::new()).unwrap().last(0).unwrap().to_vec()
}

#[test]
fn chunked_prefill_matches_one_prefill() {
    let Some(m) = model() else { return };
    let pool = Pool::new(2);
    let mut sc = Scratch::new();
    let toks: Vec<u32> = (0..40).map(|i| (i * 37 % 1000) as u32).collect();
    let mut c1 = m.new_cache(64).unwrap();
    let whole = m.forward_one(&pool, &mut c1, &toks, LogitsWanted::Last, &mut sc).unwrap().last(0).unwrap().to_vec();
    let mut c2 = m.new_cache(64).unwrap();
    let mut last = Vec::new();
    for chunk in toks.chunks(7) {
        last = m.forward_one(&pool, &mut c2, chunk, LogitsWanted::Last, &mut sc).unwrap().last(0).unwrap().to_vec();
    }
    assert_eq!(whole, last);
    assert_eq!(c2.len(), 40);
}

#[test]
fn truncating_the_cache_rewinds_the_sequence() {
    let Some(m) = model() else { return };
    let pool = Pool::new(2);
    let mut sc = Scratch::new();
    let mut c = m.new_cache(64).unwrap();
    m.forward_one(&pool, &mut c, &[1, 2, 3], LogitsWanted::None, &mut sc).unwrap();
    let a = m.forward_one(&pool, &mut c, &[4], LogitsWanted::Last, &mut sc).unwrap().last(0).unwrap().to_vec();
    c.truncate(3);
    let b = m.forward_one(&pool, &mut c, &[4], LogitsWanted::Last, &mut sc).unwrap().last(0).unwrap().to_vec();
    assert_eq!(a, b);
}

#[test]
fn a_full_context_bad_tokens_and_bad_tables_are_errors() {
    let Some(m) = model() else { return };
    let pool = Pool::new(2);
    let mut sc = Scratch::new();
    let mut c = m.new_cache(4).unwrap();
    let e = m.forward_one(&pool, &mut c, &[1, 2, 3, 4, 5], LogitsWanted::Last, &mut sc).unwrap_err();
    assert!(matches!(e, ModelError::ContextFull { pos: 4, ctx: 4 }), "{e}");
    assert_eq!(c.len(), 0, "a refused batch leaves the cache as it was");
    m.forward_one(&pool, &mut c, &[1, 2, 3, 4], LogitsWanted::Last, &mut sc).unwrap();
    let e = m.forward_one(&pool, &mut c, &[5], LogitsWanted::Last, &mut sc).unwrap_err();
    assert!(e.to_string().contains("past the context size 4"), "{e}");
    let mut c = m.new_cache(4).unwrap();
    let e = m.forward_one(&pool, &mut c, &[1 << 30], LogitsWanted::Last, &mut sc).unwrap_err();
    assert!(matches!(e, ModelError::TokenOutOfRange { .. }), "{e}");

    let mut kv = m.new_pool(2).unwrap();
    let short = SeqInput { tokens: &[1; 17], start: 0, blocks: &[0], window_blocks: None, logits: LogitsWanted::Last };
    let e = m.forward(&pool, &mut kv, &[short], &mut sc).unwrap_err();
    assert!(e.to_string().contains("does not reach position 16"), "{e}");
    let outside = SeqInput { tokens: &[1], start: 0, blocks: &[9], window_blocks: None, logits: LogitsWanted::Last };
    let e = m.forward(&pool, &mut kv, &[outside], &mut sc).unwrap_err();
    assert!(e.to_string().contains("outside the pool"), "{e}");
}

#[test]
fn an_impossible_cache_is_an_error_not_an_abort() {
    let Some(m) = model() else { return };
    let e = m.new_cache(usize::MAX / 4).unwrap_err();
    assert!(matches!(e, ModelError::OutOfMemory { .. }), "{e}");
    assert!(e.to_string().contains("--ctx-size"), "{e}");
}

#[test]
fn every_cache_type_reads_through_block_tables() {
    let Some(path) = onebit_testkit::shared_file("models/qwen3-q8_0.gguf") else { return };
    let pool = Pool::new(2);
    for kv_type in [onebit_model::KvType::F16, onebit_model::KvType::F32, onebit_model::KvType::Q8_0] {
        let m = Model::load(&path, &ModelOptions { kv_type, ..Default::default() }).unwrap();
        let a: Vec<u32> = (0..40).map(|i| 10 + 7 * i).collect();
        let b: Vec<u32> = (0..23).map(|i| 500 + 3 * i).collect();
        let mut kv = m.new_pool(8).unwrap();
        let (ta, tb) = ([6u32, 1, 4], [3u32, 7]);
        let mut sc = Scratch::new();
        let together = m
            .forward(
                &pool,
                &mut kv,
                &[
                    SeqInput { tokens: &a, start: 0, blocks: &ta, window_blocks: None, logits: LogitsWanted::Last },
                    SeqInput { tokens: &b, start: 0, blocks: &tb, window_blocks: None, logits: LogitsWanted::Last },
                ],
                &mut sc,
            )
            .unwrap();
        let (ga, gb) = (together.last(0).unwrap().to_vec(), together.last(1).unwrap().to_vec());
        assert_eq!(ga, alone_long(&m, &pool, &a), "{kv_type}");
        assert_eq!(gb, alone_long(&m, &pool, &b), "{kv_type}");
    }
}
