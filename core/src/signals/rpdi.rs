//! RPDI, the reasoning path deviation index (arXiv 2603.14251). Only the abstract is
//! verified: overthinking shows as frequent high-entropy transition tokens. Following the
//! second-hand descriptions, RPDI = (mean token entropy over the last W tokens) / (mean
//! over all thinking tokens so far), checked at sentence boundaries; exit when it exceeds
//! lambda. W and lambda (512 and 2-3 are quoted) are configuration, not facts.

use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RpdiConfig {
    pub window: usize,
    pub lambda: f64,
}

impl Default for RpdiConfig {
    fn default() -> Self {
        RpdiConfig { window: 512, lambda: 2.0 }
    }
}

#[derive(Debug, Clone)]
pub struct Rpdi {
    cfg: RpdiConfig,
    recent: VecDeque<f64>,
    recent_sum: f64,
    total_sum: f64,
    count: u64,
}

impl Rpdi {
    pub fn new(cfg: RpdiConfig) -> Self {
        Rpdi {
            cfg,
            recent: VecDeque::with_capacity(cfg.window.min(1 << 16)),
            recent_sum: 0.0,
            total_sum: 0.0,
            count: 0,
        }
    }

    /// Adds one thinking token's entropy.
    pub fn push(&mut self, entropy: f64) {
        self.total_sum += entropy;
        self.count += 1;
        self.recent.push_back(entropy);
        self.recent_sum += entropy;
        if self.recent.len() > self.cfg.window {
            if let Some(old) = self.recent.pop_front() {
                self.recent_sum -= old;
            }
        }
    }

    /// The index now (call at a sentence boundary); `None` before any token.
    pub fn index(&self) -> Option<f64> {
        if self.count == 0 || self.total_sum <= 0.0 {
            return None;
        }
        let recent = self.recent_sum / self.recent.len() as f64;
        let overall = self.total_sum / self.count as f64;
        Some(recent / overall)
    }

    /// Whether the index says to stop.
    pub fn exceeded(&self) -> bool {
        self.index().is_some_and(|i| i > self.cfg.lambda)
    }
}

/// Whether a piece of generated text ends a sentence (where RPDI is checked).
pub fn is_sentence_boundary(text: &str) -> bool {
    text.trim_end_matches([' ', '"', '\'', ')']).ends_with(['.', '!', '?', '\n'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_worked_index() {
        let mut r = Rpdi::new(RpdiConfig { window: 2, lambda: 1.5 });
        assert_eq!(r.index(), None);
        for x in [1.0, 1.0, 1.0, 1.0] {
            r.push(x);
        }
        assert_eq!(r.index(), Some(1.0));
        // Last two: 4 and 4 -> recent mean 4; overall (4*1 + 8)/6 = 2 -> RPDI 2 > 1.5.
        r.push(4.0);
        r.push(4.0);
        assert_eq!(r.index(), Some(2.0));
        assert!(r.exceeded());
    }

    #[test]
    fn sentence_boundaries() {
        assert!(is_sentence_boundary("so it is 4."));
        assert!(is_sentence_boundary("Wait!\n"));
        assert!(is_sentence_boundary("right?\" "));
        assert!(!is_sentence_boundary("and then"));
    }
}
