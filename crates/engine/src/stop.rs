//! Stop strings over streamed text.
//!
//! Text arrives in pieces (one per token). A stop string may span several pieces, so the tail
//! of the text that could still become a stop string is held back; once the text can no longer
//! match, it is released. A stop string found is never emitted, nor anything after it.

/// The outcome of adding a piece of text.
#[derive(Debug, PartialEq, Eq)]
pub struct Step {
    /// Text that is now safe to show.
    pub emit: String,
    /// A stop string was completed (`emit` ends just before it).
    pub stopped: bool,
}

#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), held: String::new() }
    }

    /// Add a piece of text.
    pub fn push(&mut self, piece: &str) -> Step {
        self.held.push_str(piece);
        if self.stops.is_empty() {
            return Step { emit: std::mem::take(&mut self.held), stopped: false };
        }
        // The earliest complete stop string wins.
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let emit = self.held[..at].to_string();
            self.held.clear();
            return Step { emit, stopped: true };
        }
        let keep = self.partial_suffix();
        let cut = self.held.len() - keep;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        Step { emit, stopped: false }
    }

    /// The text still held back, when generation ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that is a proper prefix of a stop string
    /// (at a character boundary).
    fn partial_suffix(&self) -> usize {
        let h = &self.held;
        let mut best = 0;
        for s in &self.stops {
            for (start, _) in h.char_indices() {
                let tail = &h[start..];
                if tail.len() <= best {
                    break;
                }
                if s.starts_with(tail) {
                    best = tail.len();
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool, String) {
        let mut m = StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let mut out = String::new();
        for p in pieces {
            let step = m.push(p);
            out.push_str(&step.emit);
            if step.stopped {
                return (out, true, String::new());
            }
        }
        let rest = m.finish();
        (out, false, rest)
    }

    #[test]
    fn a_stop_string_spanning_pieces_is_not_emitted() {
        assert_eq!(
            run(&["</s>"], &["Hello", " wor", "ld<", "/", "s>", "more"]),
            ("Hello world".into(), true, "".into())
        );
        assert_eq!(run(&["STOP"], &["aST", "OPb"]), ("a".into(), true, "".into()));
    }

    #[test]
    fn partial_matches_are_held_then_released() {
        let mut m = StopMatcher::new(&["<|end|>".to_string()]);
        assert_eq!(m.push("x <|e"), Step { emit: "x ".into(), stopped: false });
        assert_eq!(m.push("nd"), Step { emit: "".into(), stopped: false });
        assert_eq!(m.push("ing"), Step { emit: "<|ending".into(), stopped: false });
        assert_eq!(run(&["ab"], &["xa"]), ("x".into(), false, "a".into()));
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        assert_eq!(run(&["cd", "b"], &["abcd"]), ("a".into(), true, "".into()));
        assert_eq!(run(&[], &["abc", "def"]), ("abcdef".into(), false, "".into()));
    }

    #[test]
    fn multibyte_text_is_cut_at_character_boundaries() {
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true, "".into()));
        assert_eq!(run(&["→x"], &["a→", "y"]), ("a→y".into(), false, "".into()));
    }
}
