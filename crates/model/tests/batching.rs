//! The forward pass over batches: several sequences at their own positions in one pass give
//! what each gives alone; chunked prefill equals one prefill; a full context is an error.

use onebit_model::{LogitsWanted, Model, ModelError, ModelOptions, SeqInput};

fn model() -> Option<Model> {
    let path = onebit_testkit::shared_file("models/qwen2-f16.gguf")?;
    Some(Model::load(path, &ModelOptions { threads: 2, ..Default::default() }).unwrap())
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-4 * (1.0 + x.abs()))
}

#[test]
fn sequences_in_one_batch_match_sequences_alone() {
    let Some(m) = model() else { return };
    let mut sc = m.new_scratch();
    let (a, b) = ([10u32, 20, 30, 40, 50], [7u32, 8, 9, 10, 11, 12, 13]);
    let alone = |toks: &[u32], sc: &mut _| {
        let mut c = m.new_cache(64);
        m.forward(&mut [SeqInput { cache: &mut c, tokens: toks, logits: LogitsWanted::All }], sc)
            .unwrap()
            .rows_of(0)
            .map(|(_, l)| l.to_vec())
            .collect::<Vec<_>>()
    };
    let (la, lb) = (alone(&a, &mut sc), alone(&b, &mut sc));
    let (mut ca, mut cb) = (m.new_cache(64), m.new_cache(64));
    let out = m
        .forward(
            &mut [
                SeqInput { cache: &mut ca, tokens: &a, logits: LogitsWanted::All },
                SeqInput { cache: &mut cb, tokens: &b, logits: LogitsWanted::All },
            ],
            &mut sc,
        )
        .unwrap();
    for (i, l) in la.iter().enumerate() {
        assert!(close(out.get(0, i).unwrap(), l), "sequence a, token {i}");
    }
    for (i, l) in lb.iter().enumerate() {
        assert!(close(out.get(1, i).unwrap(), l), "sequence b, token {i}");
    }
    // Continue both with one token each: a decode step of two sequences at different positions.
    let out = m
        .forward(
            &mut [
                SeqInput { cache: &mut ca, tokens: &[99], logits: LogitsWanted::Last },
                SeqInput { cache: &mut cb, tokens: &[98], logits: LogitsWanted::Last },
            ],
            &mut sc,
        )
        .unwrap();
    let la2 = alone(&[10, 20, 30, 40, 50, 99], &mut sc);
    let lb2 = alone(&[7, 8, 9, 10, 11, 12, 13, 98], &mut sc);
    assert!(close(out.last(0).unwrap(), la2.last().unwrap()));
    assert!(close(out.last(1).unwrap(), lb2.last().unwrap()));
}

#[test]
fn chunked_prefill_matches_one_prefill() {
    let Some(m) = model() else { return };
    let mut sc = m.new_scratch();
    let toks: Vec<u32> = (0..40).map(|i| (i * 37 % 1000) as u32).collect();
    let mut c1 = m.new_cache(64);
    let whole =
        m.forward(&mut [SeqInput { cache: &mut c1, tokens: &toks, logits: LogitsWanted::Last }], &mut sc).unwrap();
    let mut c2 = m.new_cache(64);
    let mut last = None;
    for chunk in toks.chunks(16) {
        last = Some(
            m.forward(&mut [SeqInput { cache: &mut c2, tokens: chunk, logits: LogitsWanted::Last }], &mut sc).unwrap(),
        );
    }
    assert!(close(whole.last(0).unwrap(), last.unwrap().last(0).unwrap()));
    assert_eq!(c2.len(), 40);
}

#[test]
fn truncating_the_cache_rewinds_the_sequence() {
    let Some(m) = model() else { return };
    let mut sc = m.new_scratch();
    let mut c = m.new_cache(64);
    m.forward(&mut [SeqInput { cache: &mut c, tokens: &[1, 2, 3], logits: LogitsWanted::None }], &mut sc).unwrap();
    let a = m.forward(&mut [SeqInput { cache: &mut c, tokens: &[4], logits: LogitsWanted::Last }], &mut sc).unwrap();
    c.truncate(3);
    let b = m.forward(&mut [SeqInput { cache: &mut c, tokens: &[4], logits: LogitsWanted::Last }], &mut sc).unwrap();
    assert_eq!(a.last(0).unwrap(), b.last(0).unwrap());
}

#[test]
fn a_full_context_and_bad_tokens_are_errors() {
    let Some(m) = model() else { return };
    let mut sc = m.new_scratch();
    let mut c = m.new_cache(4);
    let e = m
        .forward(&mut [SeqInput { cache: &mut c, tokens: &[1, 2, 3, 4, 5], logits: LogitsWanted::Last }], &mut sc)
        .unwrap_err();
    assert!(matches!(e, ModelError::ContextFull { pos: 4, ctx: 4 }), "{e}");
    assert_eq!(c.len(), 0, "a refused batch leaves the cache as it was");
    m.forward(&mut [SeqInput { cache: &mut c, tokens: &[1, 2, 3, 4], logits: LogitsWanted::Last }], &mut sc).unwrap();
    let e =
        m.forward(&mut [SeqInput { cache: &mut c, tokens: &[5], logits: LogitsWanted::Last }], &mut sc).unwrap_err();
    assert!(e.to_string().contains("past the context size 4"), "{e}");
    let mut c = m.new_cache(4);
    let e = m
        .forward(&mut [SeqInput { cache: &mut c, tokens: &[1 << 30], logits: LogitsWanted::Last }], &mut sc)
        .unwrap_err();
    assert!(matches!(e, ModelError::TokenOutOfRange { .. }), "{e}");
}
