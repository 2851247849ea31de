//! Signals that say when reasoning has gone on long enough: token entropy (from full
//! logits, or bounded from the top-k logprobs an API returns), EAT (an EMA and EMA
//! variance of the entropy after a forced end-of-thinking), RPDI (recent vs overall
//! entropy at sentence boundaries), and plain budgets in tokens and seconds. All O(1) per
//! token after construction; the proxy, the twin and the engine hook share them.

mod budget;
mod eat;
mod entropy;
mod rpdi;

pub use budget::ThinkBudget;
pub use eat::{Eat, EatConfig, EatReading, EatState};
pub use entropy::{EntropyBound, EntropyState, entropy_from_logits, entropy_from_top_logprobs};
pub use rpdi::{Rpdi, RpdiConfig, is_sentence_boundary};
