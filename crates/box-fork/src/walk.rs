//! A small work queue for walking a tree on a few threads: a job is one
//! directory; working on it may queue its subdirectories. Each thread keeps
//! its own state (buffers, the entries it found), returned at the end.
//! No descriptor is held between jobs, so a deep tree cannot exhaust them.

use std::sync::{Condvar, Mutex};

/// The threads a walk uses: the machine's parallelism, at most 4 (the walk
/// is bound by the filesystem beyond that).
pub(crate) fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|count| count.get())
        .unwrap_or(1)
        .clamp(1, 4)
}

struct Queue<J, E> {
    jobs: Vec<J>,
    active: usize,
    error: Option<E>,
    /// A worker panicked (a bug): everyone stops, the panic propagates.
    panicked: bool,
}

/// Held while a job runs: if the job panics, the queue learns it, so the
/// other workers stop instead of waiting for that job forever.
struct Running<'a, J, E> {
    queue: &'a Mutex<Queue<J, E>>,
    wake: &'a Condvar,
}

impl<J, E> Drop for Running<'_, J, E> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Ok(mut guard) = self.queue.lock() {
                guard.panicked = true;
                guard.active -= 1;
            }
            self.wake.notify_all();
        }
    }
}

/// Run `work` on every job (those in `initial` and those it queues) on
/// `threads` threads, each with a state made by `init`. Stops at the first
/// error and returns it; otherwise returns every thread's state.
pub(crate) fn run<J, S, E>(
    initial: Vec<J>,
    threads: usize,
    init: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, J, &mut Vec<J>) -> Result<(), E> + Sync,
) -> Result<Vec<S>, E>
where
    J: Send,
    S: Send,
    E: Send,
{
    let queue = Mutex::new(Queue {
        jobs: initial,
        active: 0,
        error: None,
        panicked: false,
    });
    let wake = Condvar::new();
    let worker = || {
        let mut state = init();
        let mut found = Vec::new();
        loop {
            let job = {
                let Ok(mut guard) = queue.lock() else { break };
                loop {
                    if guard.error.is_some() || guard.panicked {
                        break None;
                    }
                    if let Some(job) = guard.jobs.pop() {
                        guard.active += 1;
                        break Some(job);
                    }
                    if guard.active == 0 {
                        break None;
                    }
                    guard = match wake.wait(guard) {
                        Ok(guard) => guard,
                        Err(_) => return state,
                    };
                }
            };
            let Some(job) = job else {
                wake.notify_all();
                break;
            };
            let running = Running {
                queue: &queue,
                wake: &wake,
            };
            let result = work(&mut state, job, &mut found);
            drop(running);
            let Ok(mut guard) = queue.lock() else { break };
            guard.active -= 1;
            match result {
                Ok(()) => guard.jobs.append(&mut found),
                Err(error) => {
                    found.clear();
                    guard.error.get_or_insert(error);
                }
            }
            drop(guard);
            wake.notify_all();
        }
        state
    };
    let states = std::thread::scope(|scope| {
        let handles: Vec<_> = (1..threads).map(|_| scope.spawn(worker)).collect();
        let mut states = vec![worker()];
        for handle in handles {
            match handle.join() {
                Ok(state) => states.push(state),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        states
    });
    let queue = queue
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    match queue.error {
        Some(error) => Err(error),
        None => Ok(states),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_queued_job_runs_once() {
        // Job n queues 2n+1 and 2n+2 below 1000: a binary tree of 1000 nodes.
        let states = run(vec![0u32], 3, Vec::new, |seen: &mut Vec<u32>, job, more| {
            seen.push(job);
            more.extend(
                [2 * job + 1, 2 * job + 2]
                    .into_iter()
                    .filter(|next| *next < 1000),
            );
            Ok::<(), ()>(())
        })
        .unwrap();
        let mut all: Vec<u32> = states.into_iter().flatten().collect();
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn a_panicking_job_propagates_instead_of_hanging_the_others() {
        let outcome = std::panic::catch_unwind(|| {
            run(
                vec![0u32],
                3,
                || (),
                |_, job, more| {
                    assert!(job != 500, "job 500 is a bug");
                    more.extend(
                        [2 * job + 1, 2 * job + 2]
                            .into_iter()
                            .filter(|next| *next < 1000),
                    );
                    Ok::<(), ()>(())
                },
            )
        });
        assert!(outcome.is_err());
    }

    #[test]
    fn the_first_error_stops_the_walk() {
        let result = run(
            vec![0u32],
            2,
            || (),
            |_, job, more| {
                if job == 5 {
                    return Err(format!("job {job}"));
                }
                more.push(job + 1);
                Ok(())
            },
        );
        assert_eq!(result.err(), Some("job 5".to_owned()));
    }
}
