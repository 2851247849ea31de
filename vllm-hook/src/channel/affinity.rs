//! Keeps the follower's thread off the cores the engine computes on.
//!
//! vLLM's CPU build pins each worker process to its compute cores (on a 2-core machine,
//! core 0), and a thread the worker starts inherits that pinning. The follower wakes 100
//! times a second for an HTTP round trip; on the compute core every wake preempts one of
//! the engine's OpenMP threads, and the whole step waits at the next barrier for it.
//! Measured on this repository's CPU rig (`docs/src/benchmarks/hook-steps.md`), that
//! made a decode step about 9% longer with the hook loaded and reordering nothing. The
//! follower does no compute, so it belongs on the cores vLLM left to everything else:
//! the online CPUs outside the thread's inherited set. Where the thread may already run
//! anywhere (a GPU worker is not pinned), or nothing is left outside its set, it stays.

/// CPUs listed in the kernel's range format (`0-3,6,8-9`), as in
/// `/sys/devices/system/cpu/online`; `None` when the text is not in that format.
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi): (usize, usize) = (lo.parse().ok()?, hi.parse().ok()?);
                if hi < lo {
                    return None;
                }
                cpus.extend(lo..=hi);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// The CPUs a thread pinned to `current` should move to: the online ones outside its set,
/// or `None` when it is not pinned (its set covers every online CPU) or nothing is left.
pub fn outside(online: &[usize], current: &[usize]) -> Option<Vec<usize>> {
    let rest: Vec<usize> = online.iter().copied().filter(|c| !current.contains(c)).collect();
    (!rest.is_empty()).then_some(rest)
}

/// Moves the calling thread off its inherited cores (see the module's comment). Returns
/// the CPUs it moved to and those it left, or `None` where it stays.
#[cfg(target_os = "linux")]
pub fn move_off_inherited_cores() -> Option<(Vec<usize>, Vec<usize>)> {
    let online = parse_cpu_list(&std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?)?;
    // SAFETY: `cpu_set_t` is plain data for which all-zero bytes is the empty set; pid 0
    // names the calling thread, and the size passed is the set's own.
    let current = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        online.iter().copied().filter(|&c| libc::CPU_ISSET(c, &set)).collect::<Vec<_>>()
    };
    let target = outside(&online, &current)?;
    // SAFETY: as above; CPU_SET is given only CPUs the kernel listed as online, which are
    // below CPU_SETSIZE on any machine `cpu_set_t` describes.
    let moved = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in &target {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    };
    // Refused (a cpuset cgroup that excludes them): the thread stays where it was.
    moved.then_some((target, current))
}

#[cfg(not(target_os = "linux"))]
pub fn move_off_inherited_cores() -> Option<(Vec<usize>, Vec<usize>)> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0-2,5,7-8"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(parse_cpu_list("3"), Some(vec![3]));
        assert_eq!(parse_cpu_list("2-1"), None);
        assert_eq!(parse_cpu_list("a-b"), None);
    }

    #[test]
    fn a_pinned_thread_moves_to_the_cores_left_over() {
        assert_eq!(outside(&[0, 1], &[0]), Some(vec![1]));
        assert_eq!(outside(&[0, 1, 2, 3], &[1, 2]), Some(vec![0, 3]));
    }

    #[test]
    fn an_unpinned_thread_or_one_with_nowhere_to_go_stays() {
        assert_eq!(outside(&[0, 1], &[0, 1]), None);
        assert_eq!(outside(&[0], &[0]), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_pinned_to_one_core_is_moved_off_it() {
        let online =
            parse_cpu_list(&std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap()).unwrap();
        let first = online[0];
        let result = std::thread::spawn(move || {
            // SAFETY: as in move_off_inherited_cores.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(first, &mut set);
                assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
            }
            move_off_inherited_cores()
        })
        .join()
        .unwrap();
        if online.len() == 1 {
            assert_eq!(result, None);
        } else {
            let (to, from) = result.expect("a pinned thread on a machine with more cores moves");
            assert_eq!(from, vec![first]);
            assert!(!to.contains(&first) && !to.is_empty());
        }
    }
}
