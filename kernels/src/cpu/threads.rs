//! Scoped worker threads for the CPU path, sized by the caller.

/// Below this many elements a piece of a row is not worth a thread of its own.
const MIN_PIECE: usize = 16 * 1024;

pub(crate) fn resolve(threads: usize) -> usize {
    if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads }
}

/// How many pieces to cut each row into so that `threads` workers have work even when
/// the batch is small.
pub(crate) fn pieces_per_row(batch: usize, vocab: usize, threads: usize) -> usize {
    if batch >= threads {
        return 1;
    }
    threads.div_ceil(batch).min(vocab / MIN_PIECE).max(1)
}

/// `f(0..items)` on up to `threads` threads (contiguous blocks of items each), results
/// in order. One thread, or one item, runs inline.
pub(crate) fn map<T: Send, F: Fn(usize) -> T + Sync>(items: usize, threads: usize, f: F) -> Vec<T> {
    let threads = threads.clamp(1, items.max(1));
    if threads == 1 {
        return (0..items).map(f).collect();
    }
    let per = items.div_ceil(threads);
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = (0..threads)
            .map(|w| scope.spawn(move || (w * per..((w + 1) * per).min(items)).map(f).collect::<Vec<T>>()))
            .collect();
        // A worker can only fail by panicking, which the scope re-raises; join's Err arm
        // is that same panic, so resume it rather than hide it.
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}
