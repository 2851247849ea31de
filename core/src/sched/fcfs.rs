use super::{RequestView, SchedulingPolicy};

/// vLLM's stock behaviour (`--scheduling-policy fcfs`): running requests keep their
/// admission order, the waiting queue is first come first served (preempted requests go
/// back to its front), and the victim is the most recently admitted running request
/// (`running[-1]`).
#[derive(Debug, Default, Clone)]
pub struct Fcfs;

impl SchedulingPolicy for Fcfs {
    fn name(&self) -> &str {
        "fcfs"
    }

    fn order_running(&mut self, _running: &mut Vec<RequestView>, _now_s: f64) {}

    fn order_waiting(&mut self, _waiting: &mut Vec<RequestView>, _now_s: f64) {}

    fn pick_victim(&mut self, running: &[RequestView], _now_s: f64) -> usize {
        running.len().saturating_sub(1)
    }
}
