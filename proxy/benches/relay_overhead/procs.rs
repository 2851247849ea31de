//! What /proc says about the proxies under test: CPU time (user and system apart),
//! context switches and resident memory, summed over a set of processes (nginx runs a
//! master and workers) and, for switches, over every thread (tokio's workers).

use std::path::Path;

/// Cumulative CPU and scheduling counters of a set of processes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub user_s: f64,
    pub system_s: f64,
    /// Voluntary plus involuntary context switches, over every thread.
    pub switches: u64,
}

impl Usage {
    pub fn of(pids: &[u32]) -> Self {
        let mut u = Usage::default();
        for &pid in pids {
            let (user, system) = cpu_split(pid);
            u.user_s += user;
            u.system_s += system;
            u.switches += switches(pid);
        }
        u
    }

    pub fn since(&self, before: &Usage) -> Usage {
        Usage {
            user_s: self.user_s - before.user_s,
            system_s: self.system_s - before.system_s,
            switches: self.switches.saturating_sub(before.switches),
        }
    }

    pub fn cpu_s(&self) -> f64 {
        self.user_s + self.system_s
    }
}

/// User and system CPU seconds of a process (all its threads), fields 14 and 15 of stat.
fn cpu_split(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces; fields are counted after its closing parenthesis.
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let hz = 100.0; // USER_HZ on Linux
    (ticks(11) / hz, ticks(12) / hz)
}

fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// Resident memory of a set of processes, in KiB.
pub fn rss_kib(pids: &[u32]) -> u64 {
    pids.iter().map(|&p| super::common::rss_kib(p)).sum()
}

/// The process and its direct children (nginx's workers).
pub fn with_children(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let Ok(entries) = std::fs::read_dir("/proc") else { return out };
    for e in entries.flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if parent_of(&e.path()) == Some(pid) {
            out.push(child);
        }
    }
    out
}

fn parent_of(proc_dir: &Path) -> Option<u32> {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

/// CPU seconds the whole machine has spent busy (every process, user and kernel), from
/// the first line of /proc/stat: tells how much else was running beside the bench.
pub fn machine_busy_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<f64> =
        stat.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal: all but idle and iowait are busy.
    let busy: f64 =
        fields.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, v)| v).sum();
    busy / 100.0
}
