//! The writer: empties the outbound queue onto the output, everything queued in one
//! write.
//!
//! For stdio it is a thread of its own (`ctxd-writer`) writing with blocking, vectored
//! writes on a duplicate of descriptor 1, whose pipe it widens on Linux; elsewhere (an
//! in-process pipe, tests) a task on the runtime. Within a batch small frames go before
//! large ones, each group in its order.

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::framing;
use super::outbound::{Outflow, Outgoing, QueuedBytes, queued_cost};
use super::through::WriteThrough;

fn encode_into<T: serde::Serialize>(message: &T, buf: &mut Vec<u8>) {
    let body = serde_json::to_vec(message).unwrap_or_else(|e| {
        // Responses are built from serializable types; this is a bug, not input.
        tracing::error!(error = %e, "could not serialize an outgoing message");
        br#"{"jsonrpc":"2.0","error":{"code":-32603,"message":"could not serialize the response"},"id":null}"#.to_vec()
    });
    framing::encode_into(&body, buf);
}

impl Outgoing {
    fn encode_into(&self, buf: &mut Vec<u8>) {
        match self {
            Outgoing::Response(response) => encode_into(response, buf),
            Outgoing::Encoded(body) => framing::encode_into(body, buf),
            Outgoing::Request(request) => encode_into(request, buf),
            Outgoing::Framed(bytes) => buf.extend_from_slice(bytes),
            Outgoing::End => {}
        }
    }
}

/// Everything queued goes out in one batch, up to this many bytes.
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Frames this large go after the smaller ones queued with them.
const LARGE_FRAME: usize = 16 * 1024;

/// What is queued for one write, small frames first.
///
/// One stream carries every session's answers and the client reads it in order, so a
/// short answer queued behind a large `ctx/assemble` answer (hundreds of KB) would wait
/// until the client has read all of that. JSON-RPC lets answers go out in any order:
/// within a batch, frames under [`LARGE_FRAME`] go first, and each group keeps its order.
/// Small frames are copied into one buffer; a large body already encoded stays where it
/// is, behind a header of its own, and the batch leaves in one vectored write.
#[derive(Default)]
struct Batch {
    /// The rest of a frame begun by a write-through (it was queued first).
    front: Vec<u8>,
    small: Vec<u8>,
    /// Each large frame as its header and its body.
    large: Vec<(Vec<u8>, Vec<u8>)>,
    bytes: usize,
    /// Messages in the batch (the end mark too).
    messages: usize,
    /// What the batch's messages count for in [`QueuedBytes`].
    accounted: usize,
}

impl Batch {
    fn push(&mut self, message: Outgoing) {
        self.messages += 1;
        self.accounted += queued_cost(&message);
        let large = match message {
            Outgoing::Framed(bytes) => {
                self.bytes += bytes.len();
                self.front.extend_from_slice(&bytes);
                return;
            }
            Outgoing::Encoded(body) if body.len() >= LARGE_FRAME => body,
            other => {
                let start = self.small.len();
                other.encode_into(&mut self.small);
                let length = self.small.len() - start;
                self.bytes += length;
                if length < LARGE_FRAME {
                    return;
                }
                // A large frame encoded here (rare: the service's answers are small).
                let frame = self.small.split_off(start);
                self.large.push((Vec::new(), frame));
                return;
            }
        };
        let header = framing::header(large.len()).into_bytes();
        self.bytes += header.len() + large.len();
        self.large.push((header, large));
    }

    /// The first message and whatever else is queued, up to [`MAX_BATCH_BYTES`] or the
    /// end mark; whether the end mark was reached.
    fn fill(&mut self, first: Outgoing, rx: &mut mpsc::Receiver<Outgoing>) -> bool {
        self.front.clear();
        self.small.clear();
        self.large.clear();
        self.bytes = 0;
        self.messages = 0;
        self.accounted = 0;
        if matches!(first, Outgoing::End) {
            self.messages = 1;
            return true;
        }
        self.push(first);
        while self.bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(Outgoing::End) => {
                    self.messages += 1;
                    return true;
                }
                Ok(more) => self.push(more),
                Err(_) => break,
            }
        }
        false
    }

    /// The batch's bytes in the order they go out.
    fn parts(&self) -> Vec<&[u8]> {
        let large = self.large.iter().flat_map(|(header, body)| [header.as_slice(), body.as_slice()]);
        [self.front.as_slice(), self.small.as_slice()]
            .into_iter()
            .chain(large)
            .filter(|part| !part.is_empty())
            .collect()
    }
}

/// Writes every part, in as few `write` calls as the output takes (one, when it takes
/// them all).
fn write_all_vectored(output: &mut impl std::io::Write, parts: &[&[u8]]) -> std::io::Result<()> {
    use std::io::IoSlice;
    let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|part| IoSlice::new(part)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        // Linux takes at most 1,024 slices a call (IOV_MAX).
        let at_once = rest.len().min(1024);
        match output.write_vectored(&rest[..at_once]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Where the serve loop's messages go, in the order sent, and when the writer is done.
pub(super) struct Writer {
    pub(super) done: BoxFuture<'static, ()>,
}

impl Writer {
    /// A task on the runtime writes to an async output (an in-process pipe, tests).
    pub(super) fn task<O: AsyncWrite + Unpin + Send + 'static>(output: O, outflow: Outflow) -> Writer {
        let task = tokio::spawn(write_loop(output, outflow.rx, outflow.outbound.through, outflow.outbound.queued));
        Writer { done: async move { drop(task.await) }.boxed() }
    }

    /// A thread of its own encodes and writes to stdout with blocking writes.
    pub(super) fn stdout_thread(outflow: Outflow) -> Writer {
        let Outflow { rx, outbound } = outflow;
        // Handed over through a slot, so that it is still here if no thread starts.
        let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(rx)));
        let (theirs, (finished, done)) = (slot.clone(), tokio::sync::oneshot::channel::<()>());
        let (through, queued) = (outbound.through.clone(), outbound.queued.clone());
        let spawned = std::thread::Builder::new().name("ctxd-writer".into()).spawn(move || {
            let Some(mut rx) = theirs.lock().ok().and_then(|mut slot| slot.take()) else { return };
            let mut stdout = RawStdout::new();
            through.enable_for_stdout();
            write_blocking(&mut rx, &mut stdout, &through, &queued);
            let _ = finished.send(());
        });
        match spawned {
            Ok(_) => Writer { done: async move { drop(done.await) }.boxed() },
            Err(e) => {
                // No thread to be had: write from the runtime instead.
                tracing::warn!(error = %e, "could not start the writer thread; writing from the runtime");
                match slot.lock().ok().and_then(|mut slot| slot.take()) {
                    Some(rx) => Writer::task(tokio::io::stdout(), Outflow { rx, outbound }),
                    None => Writer { done: async {}.boxed() },
                }
            }
        }
    }
}

/// The writer thread's loop: everything queued goes out as one vectored `write`, until
/// the end mark or a failed write.
fn write_blocking(
    rx: &mut mpsc::Receiver<Outgoing>,
    output: &mut impl std::io::Write,
    through: &WriteThrough,
    queued: &QueuedBytes,
) {
    let mut batch = Batch::default();
    while let Some(first) = rx.blocking_recv() {
        let end = batch.fill(first, rx);
        let written = write_all_vectored(output, &batch.parts());
        through.note_written(batch.messages);
        queued.release(batch.accounted);
        if end || written.is_err() || output.flush().is_err() {
            break;
        }
    }
    let _ = output.flush();
}

/// The daemon's stdout without the standard library's line buffering. `Stdout` is a
/// `LineWriter`: a frame `Content-Length: n\r\n\r\n{…}` left it as two writes, the
/// header at once and the body on flush, so a client blocked in `read` woke for the
/// header alone and had to wait for the body again. Here each part of a batch is one
/// `write` on a duplicate of descriptor 1 (the lock on `Stdout` is held all along, so
/// nothing else can write between); if the descriptor cannot be duplicated, the locked
/// `Stdout` is used as before.
struct RawStdout {
    lock: std::io::StdoutLock<'static>,
    file: Option<std::fs::File>,
}

impl RawStdout {
    fn new() -> RawStdout {
        use std::os::fd::AsFd;
        let lock = std::io::stdout().lock();
        let file = match lock.as_fd().try_clone_to_owned() {
            Ok(fd) => {
                widen_pipe(&fd);
                Some(std::fs::File::from(fd))
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not duplicate stdout; writing through its line buffer");
                None
            }
        };
        RawStdout { lock, file }
    }
}

/// The pipe capacity asked for when stdout is a pipe (Linux's default is 64 KiB, and
/// 1 MiB is the default `/proc/sys/fs/pipe-max-size`, the most an unprivileged process
/// may set).
#[cfg(target_os = "linux")]
const PIPE_CAPACITY: usize = 1 << 20;

/// Raises a pipe's capacity to [`PIPE_CAPACITY`]. A whole assembled request can be
/// hundreds of KB: through a 64 KiB pipe the writer thread blocks until the client has
/// read all but the last 64 KiB, and every answer queued behind it (a short append's
/// among them) waits for those round trips. Not a pipe, or a limit set lower: left as is.
/// Linux only (`F_SETPIPE_SZ`); elsewhere pipes keep their size.
#[cfg(not(target_os = "linux"))]
fn widen_pipe(_fd: &std::os::fd::OwnedFd) {}

/// See the other `widen_pipe`.
#[cfg(target_os = "linux")]
fn widen_pipe(fd: &std::os::fd::OwnedFd) {
    let Ok(before) = rustix::pipe::fcntl_getpipe_size(fd) else { return };
    if before >= PIPE_CAPACITY {
        return;
    }
    match rustix::pipe::fcntl_setpipe_size(fd, PIPE_CAPACITY) {
        Ok(after) => tracing::debug!(before, after, "stdout pipe widened"),
        Err(e) => tracing::debug!(before, error = %e, "stdout pipe left at its size"),
    }
}

impl std::io::Write for RawStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut self.file {
            Some(file) => file.write(buf),
            None => self.lock.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match &mut self.file {
            Some(file) => file.write_vectored(bufs),
            None => self.lock.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.file {
            Some(file) => file.flush(),
            None => self.lock.flush(),
        }
    }
}

async fn write_loop<O: AsyncWrite + Unpin>(
    mut output: O,
    mut rx: mpsc::Receiver<Outgoing>,
    through: std::sync::Arc<WriteThrough>,
    queued: std::sync::Arc<QueuedBytes>,
) {
    // Everything queued goes out in one write: tokio's stdout hands each write to a
    // blocking thread, so one write per message would cost one hand-off per message.
    let mut batch = Batch::default();
    'write: while let Some(first) = rx.recv().await {
        let end = batch.fill(first, &mut rx);
        for part in batch.parts() {
            if output.write_all(part).await.is_err() {
                break 'write;
            }
        }
        through.note_written(batch.messages);
        queued.release(batch.accounted);
        if end || output.flush().await.is_err() {
            break;
        }
    }
    let _ = output.flush().await;
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tower_lsp_server::jsonrpc::Request;

    use super::*;

    #[test]
    fn a_batch_puts_small_frames_first_each_group_in_its_order() {
        let (tx, mut rx) = mpsc::channel::<Outgoing>(16);
        let large = |n: u8| Outgoing::Encoded(vec![b'0' + n; LARGE_FRAME + 10]);
        let small = |n: u8| Outgoing::Encoded(vec![b'0' + n; 10]);
        let notification = Outgoing::Request(Request::build("ctx/usageChanged").params(json!({"n": 1})).finish());
        // Large, but encoded by the writer itself rather than by a fast path.
        let large_notification = Outgoing::Request(
            Request::build("ctx/contextChanged").params(json!({"text": "6".repeat(LARGE_FRAME)})).finish(),
        );
        for message in [small(2), large(3), notification, small(4), large_notification, large(5)] {
            tx.try_send(message).ok().unwrap();
        }
        let mut batch = Batch::default();
        batch.fill(large(1), &mut rx);
        let text = String::from_utf8(batch.parts().concat()).unwrap();
        let frames: Vec<&str> = text.split("Content-Length: ").skip(1).collect();
        let order: Vec<char> =
            frames.iter().filter_map(|frame| frame.split("\r\n\r\n").nth(1)?.chars().next()).collect();
        assert_eq!(order, ['2', '{', '4', '1', '3', '{', '5'], "{}", &text[..200]);
        assert!(frames[1].contains("ctx/usageChanged") && frames[5].contains("ctx/contextChanged"));
        // Every frame's length header is its body's.
        for frame in frames {
            let (length, body) = frame.split_once("\r\n\r\n").unwrap();
            assert_eq!(length.parse::<usize>().unwrap(), body.len());
        }
        assert_eq!(batch.bytes, text.len());
    }

    #[test]
    fn a_vectored_write_finishes_whatever_each_call_takes() {
        /// Takes at most 7 bytes a call, across slices.
        struct Trickle(Vec<u8>, usize);
        impl std::io::Write for Trickle {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                let n = buf.len().min(7);
                self.0.extend_from_slice(&buf[..n]);
                self.1 += 1;
                Ok(n)
            }
            fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
                let joined: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).take(7).collect();
                self.0.extend_from_slice(&joined);
                self.1 += 1;
                Ok(joined.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let parts: [&[u8]; 4] = [b"abc", b"defghijkl", b"m", b"nopqrstuvwxyz"];
        let mut out = Trickle(Vec::new(), 0);
        write_all_vectored(&mut out, &parts).unwrap();
        assert_eq!(out.0, b"abcdefghijklmnopqrstuvwxyz");
        assert_eq!(out.1, 4, "26 bytes, 7 a call");
    }

    #[test]
    fn the_rest_of_a_frame_begun_by_a_write_through_goes_out_before_any_other() {
        let (tx, mut rx) = mpsc::channel::<Outgoing>(16);
        tx.try_send(Outgoing::Framed(b"the rest}".to_vec())).ok().unwrap();
        tx.try_send(Outgoing::Encoded(vec![b'x'; LARGE_FRAME])).ok().unwrap();
        tx.try_send(Outgoing::Encoded(b"{}".to_vec())).ok().unwrap();
        tx.try_send(Outgoing::End).ok().unwrap();
        let (mut out, through) = (Vec::new(), WriteThrough::default());
        (0..4).for_each(|_| through.note_queued());
        write_blocking(&mut rx, &mut out, &through, &QueuedBytes::default());
        assert!(
            out.starts_with(b"the rest}Content-Length: 2\r\n\r\n{}Content-Length: 16384"),
            "{}",
            String::from_utf8_lossy(&out[..60])
        );
        assert_eq!(through.queued(), 0);
    }

    #[test]
    fn the_writer_sends_each_batch_in_one_write() {
        /// Records each `write` call; a line buffer in between would split a frame.
        #[derive(Default)]
        struct Calls(Vec<Vec<u8>>);
        impl std::io::Write for Calls {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.push(buf.to_vec());
                Ok(buf.len())
            }
            fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
                self.0.push(bufs.iter().flat_map(|b| b.iter().copied()).collect());
                Ok(self.0.last().map_or(0, Vec::len))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (tx, mut rx) = mpsc::channel::<Outgoing>(16);
        // A large frame first: the small ones overtake it, and all leave in one call.
        tx.try_send(Outgoing::Encoded(vec![b'x'; LARGE_FRAME])).ok().unwrap();
        for n in 0..3u8 {
            tx.try_send(Outgoing::Encoded(format!("{{\"n\":{n}}}").into_bytes())).ok().unwrap();
        }
        tx.try_send(Outgoing::End).ok().unwrap();
        let mut calls = Calls::default();
        let through = WriteThrough::default();
        (0..5).for_each(|_| through.note_queued());
        write_blocking(&mut rx, &mut calls, &through, &QueuedBytes::default());
        assert_eq!(through.queued(), 0, "each message written is counted off");
        assert_eq!(
            calls.0.len(),
            1,
            "{:?}",
            calls.0.iter().map(|c| String::from_utf8_lossy(&c[..c.len().min(80)]).into_owned()).collect::<Vec<_>>()
        );
        let text = String::from_utf8(calls.0.concat()).unwrap();
        assert_eq!(text.matches("Content-Length: 7\r\n\r\n").count(), 3, "{}", &text[..100]);
        let large = format!("{{\"n\":2}}Content-Length: {LARGE_FRAME}\r\n\r\n{}", "x".repeat(LARGE_FRAME));
        assert!(text.ends_with(&large), "{}", &text[..100]);
        // The real stdout is written through a duplicate of its descriptor, not its line buffer.
        assert!(RawStdout::new().file.is_some());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_pipe_on_stdout_is_widened_up_to_the_limit() {
        let (_read, write) = rustix::pipe::pipe().unwrap();
        let before = rustix::pipe::fcntl_getpipe_size(&write).unwrap();
        widen_pipe(&write);
        let after = rustix::pipe::fcntl_getpipe_size(&write).unwrap();
        let limit: usize = std::fs::read_to_string("/proc/sys/fs/pipe-max-size").unwrap().trim().parse().unwrap();
        if limit >= PIPE_CAPACITY {
            assert_eq!(after, PIPE_CAPACITY, "raised from {before}");
        } else {
            assert_eq!(after, before, "a limit below the capacity leaves the pipe alone");
        }
        // Not a pipe: nothing to do, and nothing fails.
        let file = tempfile::tempfile().unwrap();
        widen_pipe(&std::os::fd::OwnedFd::from(file));
    }
}
