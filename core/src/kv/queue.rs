//! A free queue of KV blocks as vLLM keeps one: a doubly linked list threaded through
//! the block ids, so that taking a block out of the middle (a prefix hit on a cached
//! block) costs the same as taking the first.

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub(super) struct FreeQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    queued: Vec<bool>,
    head: u32,
    tail: u32,
    len: u32,
}

impl FreeQueue {
    /// An empty queue for block ids below `capacity`.
    pub(super) fn new(capacity: u32) -> Self {
        let n = capacity as usize;
        FreeQueue {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            queued: vec![false; n],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub(super) fn len(&self) -> u32 {
        self.len
    }

    pub(super) fn contains(&self, id: u32) -> bool {
        self.queued[id as usize]
    }

    /// Queues `id` last (evicted after every block queued before it).
    pub(super) fn push_back(&mut self, id: u32) {
        debug_assert!(!self.contains(id));
        let i = id as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        match self.tail {
            NIL => self.head = id,
            t => self.next[t as usize] = id,
        }
        self.tail = id;
        self.queued[i] = true;
        self.len += 1;
    }

    /// Queues `id` first (evicted before every block queued now).
    pub(super) fn push_front(&mut self, id: u32) {
        debug_assert!(!self.contains(id));
        let i = id as usize;
        self.next[i] = self.head;
        self.prev[i] = NIL;
        match self.head {
            NIL => self.tail = id,
            h => self.prev[h as usize] = id,
        }
        self.head = id;
        self.queued[i] = true;
        self.len += 1;
    }

    /// Takes `id` out, wherever it is; false when it was not queued.
    pub(super) fn remove(&mut self, id: u32) -> bool {
        if !self.contains(id) {
            return false;
        }
        let i = id as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        match p {
            NIL => self.head = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL => self.tail = p,
            n => self.prev[n as usize] = p,
        }
        self.queued[i] = false;
        self.len -= 1;
        true
    }

    /// Takes the first block out.
    pub(super) fn pop_front(&mut self) -> Option<u32> {
        let id = self.head;
        (id != NIL && self.remove(id)).then_some(id)
    }

    /// The queued ids, first first.
    #[cfg(test)]
    pub(super) fn ids(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = self.head;
        while at != NIL {
            out.push(at);
            at = self.next[at as usize];
        }
        out
    }
}
