//! A request's admission class: which waiters a free engine goes to first
//! (`crate::admission`), decided by the route from the request (`routes::generate`).

/// Admission classes, highest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// Starts in the output phase (thinking disabled): a user is waiting for visible text.
    Output,
    Interactive,
    /// Marked `"meridian": {"class": "batch"}`.
    Batch,
}

impl Class {
    pub const ALL: [Class; 3] = [Class::Output, Class::Interactive, Class::Batch];

    pub fn as_str(self) -> &'static str {
        match self {
            Class::Output => "output",
            Class::Interactive => "interactive",
            Class::Batch => "batch",
        }
    }
}
