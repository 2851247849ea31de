//! The k largest logits of a row (values only), kept while the row streams past.

/// A descending list of at most `k` values. `k == 0` keeps nothing (the entropy-only
/// reduction carries one of these at no cost).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TopK {
    k: usize,
    vals: Vec<f32>,
}

impl TopK {
    pub(crate) fn new(k: usize) -> TopK {
        TopK { k, vals: Vec::with_capacity(k + 1) }
    }

    /// A value must exceed this to enter (`-inf` until k values are held, so `-inf` and
    /// NaN never enter).
    pub(crate) fn threshold(&self) -> f32 {
        if self.k == 0 {
            f32::INFINITY
        } else if self.vals.len() < self.k {
            f32::NEG_INFINITY
        } else {
            self.vals[self.k - 1]
        }
    }

    pub(crate) fn offer(&mut self, v: f32) {
        // Also rejects NaN.
        let enters = v > self.threshold();
        if !enters {
            return;
        }
        let at = self.vals.partition_point(|&h| h >= v);
        self.vals.insert(at, v);
        self.vals.truncate(self.k);
    }

    pub(crate) fn merge(&mut self, other: &TopK) {
        other.vals.iter().for_each(|&v| self.offer(v));
    }

    pub(crate) fn values(&self) -> &[f32] {
        &self.vals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_k_largest_and_ignores_nan_and_minus_inf() {
        let mut t = TopK::new(3);
        for v in [1.0, f32::NAN, 5.0, f32::NEG_INFINITY, 3.0, 4.0, 5.0, 0.5] {
            t.offer(v);
        }
        assert_eq!(t.values(), &[5.0, 5.0, 4.0]);
        let mut none = TopK::new(0);
        none.offer(1.0);
        assert!(none.values().is_empty());
    }
}
