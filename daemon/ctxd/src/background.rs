//! A small pool of low-priority threads for the CPU-heavy parts of compaction (the
//! offline summarizer, the fidelity check, restoration planning).
//!
//! Why not the runtime's workers: a fidelity check of a large session is tens of
//! milliseconds of CPU, and a worker that runs it runs no session actor meanwhile, so
//! other sessions' appends and assembles wait behind it. Why not `spawn_blocking`: its
//! threads run at the same priority as everything else, so under load the kernel shares
//! the cores evenly between a compaction and the requests a client is waiting for. The
//! threads here lower their own priority by [`NICE`] (on Linux the nice value is per
//! thread), so the foreground preempts them and they use what is left; when the daemon is
//! otherwise idle they run at full speed.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::oneshot;

/// How much nicer the pool's threads are than the daemon: with the kernel's default
/// weights a runnable thread gets about nine tenths of a contended core against one ten
/// nice levels below it.
pub const NICE: i32 = 10;

/// The highest nice value (lowest priority) there is.
const MAX_NICE: i32 = 19;

type Job = Box<dyn FnOnce() + Send>;

/// The job's thread panicked (the panic is logged by the process's hook).
#[derive(Debug, Clone, thiserror::Error)]
#[error("a background job panicked")]
pub struct Panicked;

struct Pool {
    jobs: Mutex<Sender<Job>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        // As many threads as cores, so an otherwise idle daemon compacts at full speed.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
        for i in 0..threads {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new().name(format!("ctxd-bg-{i}")).spawn(move || worker(&rx));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "could not start a background thread");
            }
        }
        Pool { jobs: Mutex::new(tx) }
    })
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    // `who = 0` is the calling thread on Linux (nice is per thread there); a thread
    // starts with its creator's value, the daemon's.
    let own = rustix::process::getpriority_process(None).unwrap_or(0);
    if let Err(e) = rustix::process::setpriority_process(None, (own + NICE).min(MAX_NICE)) {
        tracing::warn!(error = %e, "could not lower a background thread's priority");
    }
    loop {
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        // A panicking job drops its answer channel (the caller sees `Panicked`); the
        // thread serves on.
        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
    }
}

/// Runs `f` on the low-priority pool and waits for its value.
pub async fn run<T, F>(f: F) -> Result<T, Panicked>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(f());
    });
    let sent = pool().jobs.lock().map_err(|_| Panicked)?.send(job);
    if let Err(std::sync::mpsc::SendError(job)) = sent {
        // No thread could be started: the blocking pool runs it rather than nobody.
        tracing::warn!("no background thread; running the job on the blocking pool");
        tokio::task::spawn_blocking(job).await.map_err(|_| Panicked)?;
    }
    rx.await.map_err(|_| Panicked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_at_a_lower_priority_than_their_caller() {
        let caller = rustix::process::getpriority_process(None).unwrap();
        let (nice, name) = run(|| {
            let nice = rustix::process::getpriority_process(None).unwrap();
            (nice, std::thread::current().name().map(str::to_owned))
        })
        .await
        .unwrap();
        // Raising one's own nice value needs no privilege; the caller keeps its own.
        assert_eq!(nice, (caller + NICE).min(MAX_NICE), "the pool thread's nice value");
        assert_eq!(rustix::process::getpriority_process(None).unwrap(), caller, "the caller's is untouched");
        assert!(name.is_some_and(|n| n.starts_with("ctxd-bg-")));
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_and_the_pool_serves_on() {
        let failed = run(|| -> u32 { panic!("deliberate panic for the test") }).await;
        assert!(failed.is_err());
        // Every thread still answers (more jobs than threads).
        let answers = futures::future::join_all((0..16u32).map(|i| run(move || i * 2))).await;
        assert_eq!(answers.into_iter().map(Result::unwrap).sum::<u32>(), (0..16u32).map(|i| i * 2).sum::<u32>());
    }
}
