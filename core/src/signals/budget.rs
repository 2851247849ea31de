//! Think budgets in tokens and in seconds (s1-style budget forcing, arXiv 2501.19393:
//! cap by forcing the end-of-thinking delimiter).

use std::time::Duration;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ThinkBudget {
    pub max_tokens: Option<u32>,
    pub max_duration: Option<Duration>,
}

impl ThinkBudget {
    /// Whether thinking must end now.
    pub fn exceeded(&self, think_tokens: u32, thinking_for: Duration) -> bool {
        self.max_tokens.is_some_and(|m| think_tokens >= m)
            || self.max_duration.is_some_and(|d| thinking_for >= d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_limit_ends_thinking() {
        let b = ThinkBudget { max_tokens: Some(100), max_duration: Some(Duration::from_secs(5)) };
        assert!(!b.exceeded(99, Duration::from_secs(4)));
        assert!(b.exceeded(100, Duration::from_secs(0)));
        assert!(b.exceeded(0, Duration::from_secs(5)));
        assert!(!ThinkBudget::default().exceeded(u32::MAX, Duration::MAX));
    }
}
