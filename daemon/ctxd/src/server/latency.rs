//! Where a per-turn request's time went inside the daemon, at debug level on target
//! `ctxd::latency`: the load benchmark reads these lines to tell the daemon's share of
//! a slow answer from the host's.

/// Where an append's time went inside the daemon, at debug level on target
/// `ctxd::latency` (`CTXD_LOG=info,ctxd::latency=debug`), in µs: from the frame read to
/// just before the command is queued (`parse`), to the actor (`to_actor`), to a
/// blocking thread (`to_write`), the write and `sync_data` (`write_sync`), back to the
/// actor (`to_resume`), into the view (`apply`), to this task (`to_reply`), and all of
/// it (`in_daemon`). `read_unix_us` is when the frame was read, for a client to line up
/// with its own clock (the load benchmark does).
pub fn append_steps(
    session: &str,
    read: std::time::Instant,
    queued: std::time::Instant,
    steps: &crate::session::actor::AppendSteps,
) {
    if !tracing::enabled!(target: "ctxd::latency", tracing::Level::DEBUG) {
        return;
    }
    let done = std::time::Instant::now();
    tracing::debug!(
        target: "ctxd::latency",
        session,
        read_unix_us = unix_us(read, done),
        parse = micros(read, queued),
        to_actor = micros(queued, steps.commit_started),
        to_write = micros(steps.commit_started, steps.write_started),
        write_sync = micros(steps.write_started, steps.synced),
        to_resume = micros(steps.synced, steps.resumed),
        apply = micros(steps.resumed, steps.answered),
        to_reply = micros(steps.answered, done),
        in_daemon = micros(read, done),
        "append steps"
    );
}

/// Where an assemble's time went inside the daemon, as [`append_steps`]
/// for an append, in µs: from the frame read to the command queued (`parse`), to the
/// actor building the request (`to_actor`: a wait for a compaction at the blocked level
/// counts here), building it (`build`), to this task (`to_reply`), the answer's
/// encoding, the request's JSON included (`encode`), all of it (`in_daemon`), and the
/// answer's `bytes`.
/// `instants`: read, queued, started, built, received.
pub fn assemble_steps(session: &str, instants: [std::time::Instant; 5], bytes: usize) {
    if !tracing::enabled!(target: "ctxd::latency", tracing::Level::DEBUG) {
        return;
    }
    let done = std::time::Instant::now();
    let [read, queued, started, built, received] = instants;
    tracing::debug!(
        target: "ctxd::latency",
        session,
        read_unix_us = unix_us(read, done),
        parse = micros(read, queued),
        to_actor = micros(queued, started),
        build = micros(started, built),
        to_reply = micros(built, received),
        encode = micros(received, done),
        in_daemon = micros(read, done),
        bytes,
        "assemble steps"
    );
}

/// Microseconds from `from` to `to` (0 if `to` is earlier).
pub fn micros(from: std::time::Instant, to: std::time::Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_micros()).unwrap_or(u64::MAX)
}

/// The Unix time of `then`, in µs, given that `now` is the present instant.
fn unix_us(then: std::time::Instant, now: std::time::Instant) -> u64 {
    let now_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(now_unix.saturating_sub(now.saturating_duration_since(then)).as_micros()).unwrap_or(0)
}
