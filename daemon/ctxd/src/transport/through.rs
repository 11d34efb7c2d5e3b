//! Write-through: an answer goes out from the task that has it when nothing is queued
//! before it.
//!
//! The writer thread (`Writer::stdout_thread`) owns stdout, and every answer used to
//! reach it through the outbound queue: one more thread to wake per answer. On a busy
//! machine that wake-up can wait for a CPU, and it was the part of a short answer's way
//! back that grew most under load. So when the queue is empty, the answering task writes
//! the frame itself, on a non-blocking description of the same pipe; whatever a full
//! pipe does not take is queued first, and the writer thread sends it on.
//!
//! Order: a message queued before an answer is written before it. `queued` counts what
//! was queued and is not written yet; it is raised under `direct`'s lock, and a direct
//! write happens under that lock only when `queued` is 0, so it never overtakes a
//! queued message, and two direct writes never interleave. The writer thread lowers the
//! count after each batch is written.

use std::io::IoSlice;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Shared by every [`super::Outbound`] and the writer thread.
#[derive(Default)]
pub(super) struct WriteThrough {
    /// Messages queued for the writer and not yet written.
    queued: AtomicUsize,
    /// A non-blocking description of the stdout pipe, once the writer thread opened one
    /// (`None`: everything is queued, as when stdout is not a pipe).
    direct: Mutex<Option<std::fs::File>>,
}

/// What [`WriteThrough::try_write`] did with a frame.
pub(super) enum Through {
    /// It is out, or its rest is at the head of the queue.
    Written,
    /// None of it went: queue it (it is counted as queued already).
    Queue,
}

impl WriteThrough {
    /// Opens a non-blocking description of the pipe on descriptor 1, so that answers
    /// can be written through.
    pub(super) fn enable_for_stdout(&self) {
        self.enable_on(&std::io::stdout());
    }

    /// Opens a non-blocking description of the pipe `output` writes to. Only a pipe,
    /// and a new description of it, so that `output`'s own stays blocking for the
    /// writer thread and for whoever shares it. Linux only: the new description comes
    /// from `/proc/self/fd`; elsewhere nothing is written through and every answer is
    /// queued for the writer thread, as when stdout is not a pipe.
    #[cfg(not(target_os = "linux"))]
    fn enable_on(&self, _output: &impl std::os::fd::AsFd) {}

    /// See the other `enable_on`.
    #[cfg(target_os = "linux")]
    fn enable_on(&self, output: &impl std::os::fd::AsFd) {
        use rustix::fs::{Mode, OFlags};
        use std::os::fd::AsRawFd;
        let Ok(output_stat) = rustix::fs::fstat(output) else { return };
        if rustix::pipe::fcntl_getpipe_size(output).is_err() {
            return;
        }
        let path = format!("/proc/self/fd/{}", output.as_fd().as_raw_fd());
        match rustix::fs::open(path.as_str(), OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC, Mode::empty()) {
            // The same pipe, checked: the path names whatever the descriptor is now.
            Ok(fd)
                if rustix::fs::fstat(&fd)
                    .is_ok_and(|s| s.st_ino == output_stat.st_ino && s.st_dev == output_stat.st_dev) =>
            {
                if let Ok(mut direct) = self.direct.lock() {
                    *direct = Some(std::fs::File::from(fd));
                }
            }
            Ok(_) => tracing::debug!("the output changed while opening it again; answers are queued"),
            Err(e) => tracing::debug!(error = %e, "could not open the output's pipe again; answers are queued"),
        }
    }

    /// Writes the frame `header` + `body` now if nothing is queued, as much as the pipe
    /// takes without blocking. `queue_front` puts the rest of a begun frame on the
    /// (then empty) queue, under the same lock, so that it is the next thing written.
    pub(super) fn try_write(&self, header: &[u8], body: &[u8], queue_front: impl FnOnce(Vec<u8>)) -> Through {
        let Ok(mut direct) = self.direct.lock() else {
            self.queued.fetch_add(1, Ordering::SeqCst);
            return Through::Queue;
        };
        let written = match direct.as_mut() {
            Some(file) if self.queued.load(Ordering::SeqCst) == 0 => write_without_blocking(file, &[header, body]),
            _ => 0,
        };
        if written == header.len() + body.len() {
            return Through::Written;
        }
        self.queued.fetch_add(1, Ordering::SeqCst);
        if written == 0 {
            return Through::Queue;
        }
        queue_front(rest_after(header, body, written));
        Through::Written
    }

    /// Counts one message queued by a path that does not write through.
    pub(super) fn note_queued(&self) {
        // Under the lock, so that no direct write is between the check and the queue.
        let _direct = self.direct.lock();
        self.queued.fetch_add(1, Ordering::SeqCst);
    }

    /// The writer thread wrote `messages` queued messages.
    pub(super) fn note_written(&self, messages: usize) {
        self.queued.fetch_sub(messages, Ordering::SeqCst);
    }
}

/// What is left of the frame `header` + `body` once `written` bytes of it are out.
fn rest_after(header: &[u8], body: &[u8], written: usize) -> Vec<u8> {
    match written.checked_sub(header.len()) {
        Some(of_body) => body.get(of_body..).unwrap_or_default().to_vec(),
        None => [header.get(written..).unwrap_or_default(), body].concat(),
    }
}

/// Writes as much of `parts` as `file` takes without blocking; the bytes written.
fn write_without_blocking(file: &mut std::fs::File, parts: &[&[u8]]) -> usize {
    use std::io::Write as _;
    let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|part| IoSlice::new(part)).collect();
    let mut rest = &mut slices[..];
    let mut written = 0;
    while !rest.is_empty() {
        match file.write_vectored(rest) {
            Ok(0) => break,
            Ok(n) => {
                written += n;
                IoSlice::advance_slices(&mut rest, n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // Full (`WouldBlock`) or broken: the writer thread takes it from here.
            Err(_) => break,
        }
    }
    written
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Read as _;

    use super::*;

    impl WriteThrough {
        pub(in crate::transport) fn queued(&self) -> usize {
            self.queued.load(Ordering::SeqCst)
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_answer_is_written_through_only_when_nothing_is_queued_before_it() {
        let (read_end, write_end) = rustix::pipe::pipe().unwrap();
        let through = WriteThrough::default();
        through.enable_on(&write_end);
        let mut queued_front = Vec::new();
        assert!(matches!(through.try_write(b"H1", b"first", |rest| queued_front.push(rest)), Through::Written));
        // A notification queued: the next answer must wait behind it.
        through.note_queued();
        assert!(matches!(through.try_write(b"H2", b"second", |rest| queued_front.push(rest)), Through::Queue));
        assert_eq!(through.queued(), 2);
        through.note_written(2);
        assert!(matches!(through.try_write(b"H3", b"third", |rest| queued_front.push(rest)), Through::Written));
        drop((write_end, through));
        let mut out = String::new();
        std::fs::File::from(read_end).read_to_string(&mut out).unwrap();
        assert_eq!(out, "H1firstH3third");
        assert!(queued_front.is_empty());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn what_a_full_pipe_does_not_take_is_queued_first_and_counted() {
        let (read_end, write_end) = rustix::pipe::pipe().unwrap();
        let capacity = rustix::pipe::fcntl_setpipe_size(&write_end, 4096).unwrap();
        let through = WriteThrough::default();
        through.enable_on(&write_end);
        let body: Vec<u8> = (0..3 * capacity).map(|i| b'a' + (i % 26) as u8).collect();
        let mut rest = Vec::new();
        assert!(matches!(through.try_write(b"Content-Length: n\r\n\r\n", &body, |r| rest = r), Through::Written));
        assert_eq!(through.queued(), 1, "the rest counts as queued");
        // Nothing goes through while the rest waits.
        assert!(matches!(through.try_write(b"H", b"later", |_| panic!("nothing was begun")), Through::Queue));
        drop((write_end, through));
        let mut out = Vec::new();
        std::fs::File::from(read_end).read_to_end(&mut out).unwrap();
        assert_eq!(out.len(), capacity, "the pipe took what it holds");
        out.extend_from_slice(&rest);
        assert_eq!(out, [b"Content-Length: n\r\n\r\n".as_slice(), &body].concat());
    }

    #[test]
    fn the_rest_of_a_frame_starts_where_the_write_stopped_in_the_header_or_the_body() {
        assert_eq!(rest_after(b"HEADER", b"body", 3), b"DERbody");
        assert_eq!(rest_after(b"HEADER", b"body", 6), b"body");
        assert_eq!(rest_after(b"HEADER", b"body", 8), b"dy");
        assert_eq!(rest_after(b"HEADER", b"body", 0), b"HEADERbody");
    }

    /// Without Linux's `/proc/self/fd`, a pipe is not written through either: every
    /// answer takes the queue, and none is lost.
    #[cfg(not(target_os = "linux"))]
    #[test]
    fn without_linux_a_pipe_is_not_written_through() {
        let (read_end, write_end) = rustix::pipe::pipe().unwrap();
        let through = WriteThrough::default();
        through.enable_on(&write_end);
        assert!(matches!(through.try_write(b"H", b"x", |_| panic!("nothing was begun")), Through::Queue));
        assert_eq!(through.queued(), 1);
        drop((write_end, through));
        let mut out = Vec::new();
        std::fs::File::from(read_end).read_to_end(&mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn a_file_is_not_written_through() {
        let file = tempfile::tempfile().unwrap();
        let through = WriteThrough::default();
        through.enable_on(&file);
        assert!(matches!(through.try_write(b"H", b"x", |_| {}), Through::Queue));
        assert_eq!(file.metadata().unwrap().len(), 0);
    }
}
