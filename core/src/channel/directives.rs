//! What the hook has been told, per request: the state the scheduler and the logits
//! processor read every step, plus a bounded log so other processes can catch up.

use std::collections::{HashMap, VecDeque};

use super::{Action, Directive, ReportedPhase, SyncReply};

/// Everything known about one request from directives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestDirectives {
    pub phase: Option<ReportedPhase>,
    pub priority: Option<i32>,
    pub think_budget: Option<u32>,
    pub end_thinking: bool,
}

/// Directives by request id, with a sequence number per directive. Bounded: past
/// `max_requests` the requests told about longest ago are dropped (a proxy that never
/// sends `forget` cannot grow it without end), and the log keeps the last `max_log`.
#[derive(Debug)]
pub struct DirectiveTable {
    by_request: HashMap<String, (u64, RequestDirectives)>,
    order: VecDeque<(u64, String)>,
    log: VecDeque<(u64, Directive)>,
    seq: u64,
    /// Bumped by every change of the state (`apply`, `merge`), so a reader can keep
    /// what it looked up while this stays the same.
    generation: u64,
    max_requests: usize,
    max_log: usize,
}

impl Default for DirectiveTable {
    fn default() -> Self {
        DirectiveTable::with_limits(65_536, 8_192)
    }
}

impl DirectiveTable {
    pub fn with_limits(max_requests: usize, max_log: usize) -> Self {
        DirectiveTable {
            by_request: HashMap::new(),
            order: VecDeque::new(),
            log: VecDeque::new(),
            seq: 0,
            generation: 0,
            max_requests: max_requests.max(1),
            max_log: max_log.max(1),
        }
    }

    /// Last sequence number assigned.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Changes with every change of the table's state (unlike `seq`, also when a
    /// follower merges a snapshot); lookups made at one generation hold while it lasts.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn len(&self) -> usize {
        self.by_request.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_request.is_empty()
    }

    pub fn get(&self, request_id: &str) -> Option<&RequestDirectives> {
        self.by_request.get(request_id).map(|(_, d)| d)
    }

    /// Applies one directive and logs it; returns its sequence number.
    pub fn apply(&mut self, directive: Directive) -> u64 {
        self.generation += 1;
        self.seq += 1;
        let seq = self.seq;
        self.apply_state(&directive, seq);
        self.log.push_back((seq, directive));
        while self.log.len() > self.max_log {
            self.log.pop_front();
        }
        seq
    }

    fn apply_state(&mut self, directive: &Directive, seq: u64) {
        let id = directive.request_id.as_str();
        if let Action::Forget = directive.action {
            self.by_request.remove(id);
            return;
        }
        let entry = match self.by_request.get_mut(id) {
            Some((_, entry)) => entry,
            None => {
                self.order.push_back((seq, id.to_owned()));
                self.by_request.insert(id.to_owned(), (seq, RequestDirectives::default()));
                self.evict_oldest();
                match self.by_request.get_mut(id) {
                    Some((_, entry)) => entry,
                    None => return,
                }
            }
        };
        match directive.action {
            Action::Phase { phase } => entry.phase = Some(phase),
            Action::Priority { priority } => entry.priority = Some(priority),
            Action::ThinkBudget { tokens } => entry.think_budget = Some(tokens),
            Action::EndThinking => entry.end_thinking = true,
            Action::Forget => {}
        }
    }

    fn evict_oldest(&mut self) {
        while self.by_request.len() > self.max_requests {
            let Some((seq, id)) = self.order.pop_front() else { break };
            // Only evict if this queue entry is the one that created the live entry
            // (a forgotten and re-created id has a newer creation seq).
            if self.by_request.get(&id).is_some_and(|(created, _)| *created == seq) {
                self.by_request.remove(&id);
            }
        }
        // Drop queue entries of forgotten requests so the queue stays bounded too.
        if self.order.len() > 2 * self.max_requests {
            let live = &self.by_request;
            self.order.retain(|(seq, id)| live.get(id).is_some_and(|(c, _)| c == seq));
        }
    }

    /// Directives after `after`, for a process catching up. When the log no longer
    /// reaches back that far, the reply is a snapshot of the whole state instead.
    pub fn since(&self, after: u64) -> SyncReply {
        let oldest_logged = self.log.front().map_or(self.seq + 1, |(s, _)| *s);
        if after + 1 >= oldest_logged || after >= self.seq {
            let directives = self.log.iter().filter(|(s, _)| *s > after).map(|(_, d)| d.clone()).collect();
            return SyncReply { seq: self.seq, directives, snapshot: false };
        }
        let mut directives = Vec::new();
        for (id, (_, d)) in &self.by_request {
            let mut push = |action| directives.push(Directive { request_id: id.clone(), action });
            if let Some(phase) = d.phase {
                push(Action::Phase { phase });
            }
            if let Some(priority) = d.priority {
                push(Action::Priority { priority });
            }
            if let Some(tokens) = d.think_budget {
                push(Action::ThinkBudget { tokens });
            }
            if d.end_thinking {
                push(Action::EndThinking);
            }
        }
        SyncReply { seq: self.seq, directives, snapshot: true }
    }

    /// Applies a sync reply received from the listening process.
    pub fn merge(&mut self, reply: SyncReply) {
        self.generation += 1;
        if reply.snapshot {
            self.by_request.clear();
            self.order.clear();
        }
        for d in reply.directives {
            self.apply_state(&d, reply.seq);
        }
        self.seq = self.seq.max(reply.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(id: &str, action: Action) -> Directive {
        Directive { request_id: id.into(), action }
    }

    #[test]
    fn directives_accumulate_per_request_and_forget_clears() {
        let mut t = DirectiveTable::default();
        t.apply(d("a", Action::ThinkBudget { tokens: 10 }));
        t.apply(d("a", Action::Priority { priority: -1 }));
        t.apply(d("b", Action::EndThinking));
        assert_eq!(
            t.get("a"),
            Some(&RequestDirectives { think_budget: Some(10), priority: Some(-1), ..Default::default() })
        );
        assert!(t.get("b").unwrap().end_thinking);
        let generation = t.generation();
        t.apply(d("a", Action::Forget));
        assert_eq!(t.get("a"), None);
        assert_eq!(t.seq(), 4);
        assert!(t.generation() > generation, "every change is a new generation");
    }

    #[test]
    fn table_is_bounded_oldest_first() {
        let mut t = DirectiveTable::with_limits(2, 16);
        t.apply(d("a", Action::EndThinking));
        t.apply(d("b", Action::EndThinking));
        t.apply(d("c", Action::EndThinking));
        assert_eq!(t.len(), 2);
        assert!(t.get("a").is_none() && t.get("b").is_some() && t.get("c").is_some());
    }

    #[test]
    fn a_follower_catches_up_from_the_log_or_a_snapshot() {
        let mut leader = DirectiveTable::with_limits(100, 3);
        let mut follower = DirectiveTable::default();
        leader.apply(d("a", Action::ThinkBudget { tokens: 5 }));
        follower.merge(leader.since(follower.seq()));
        assert_eq!(follower.get("a"), leader.get("a"));
        for i in 0..6 {
            leader.apply(d(&format!("r{i}"), Action::EndThinking));
        }
        let reply = leader.since(follower.seq());
        assert!(reply.snapshot, "log of 3 no longer reaches back to seq 1");
        follower.merge(reply);
        assert_eq!(follower.len(), leader.len());
        assert_eq!(follower.get("a"), leader.get("a"));
        leader.apply(d("r0", Action::Forget));
        let reply = leader.since(follower.seq());
        assert!(!reply.snapshot);
        follower.merge(reply);
        assert_eq!(follower.get("r0"), None);
        assert_eq!(follower.seq(), leader.seq());
    }
}
