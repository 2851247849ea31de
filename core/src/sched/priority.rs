use std::cmp::Ordering;

use super::{RequestView, SchedulingPolicy};

/// vLLM's `--scheduling-policy priority`: lower `priority` values run first, ties by
/// arrival; the running list and the waiting queue are kept in that order, and the victim
/// is the request with the largest (priority, arrival).
#[derive(Debug, Default, Clone)]
pub struct Priority;

fn key(a: &RequestView, b: &RequestView) -> Ordering {
    a.priority.cmp(&b.priority).then(a.arrival_s.total_cmp(&b.arrival_s)).then(a.seq.cmp(&b.seq))
}

impl SchedulingPolicy for Priority {
    fn name(&self) -> &str {
        "priority"
    }

    fn order_running(&mut self, running: &mut Vec<RequestView>, _now_s: f64) {
        running.sort_by(key);
    }

    fn order_waiting(&mut self, waiting: &mut Vec<RequestView>, _now_s: f64) {
        waiting.sort_by(key);
    }

    fn pick_victim(&mut self, running: &[RequestView], _now_s: f64) -> usize {
        running.iter().enumerate().max_by(|(_, a), (_, b)| key(a, b)).map_or(0, |(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Phase;

    fn view(seq: u64, priority: i32, arrival_s: f64) -> RequestView {
        RequestView {
            seq,
            arrival_s,
            priority,
            phase: Phase::Think,
            prefill_remaining: 0,
            think_tokens: 0,
            output_tokens: 0,
            think_ended_s: None,
            think_ends_next: false,
            queued_s: None,
        }
    }

    #[test]
    fn lower_priority_value_first_and_largest_is_the_victim() {
        let mut p = Priority;
        let mut v = vec![view(0, 5, 0.0), view(1, -1, 2.0), view(2, 5, 1.0), view(3, 0, 3.0)];
        p.order_waiting(&mut v, 0.0);
        assert_eq!(v.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 3, 0, 2]);
        assert_eq!(v[p.pick_victim(&v, 0.0)].seq, 2, "priority 5, arrived last");
    }
}
