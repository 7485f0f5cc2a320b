//! Where an attempt's output goes: straight into its log, or through a pipe the engine
//! copies into the log — masked as it comes when the stage has secrets, and cut into
//! whole lines each led by `[rank N] ` (as `srun --label`) when it has several ranks, so
//! ranks writing at once never share a line.

use std::io::Write as _;
use std::os::fd::OwnedFd;

use drivetrain_engine::executor::{AttemptSpec, ExecutorError};
use drivetrain_engine::mask::Stream;
use tokio::task::JoinHandle;

/// The longest part of a line held back for its end: a longer one (a progress bar
/// redrawn with `\r`) goes into the log in pieces.
const HELD_LINE: usize = 64 << 10;

/// Where rank `rank` (of `world`) writes: the log itself, or a pipe, and the task that
/// copies the pipe into the log.
pub(super) fn rank_sink(
    spec: &AttemptSpec,
    log: &std::fs::File,
    rank: usize,
    world: usize,
) -> Result<(std::fs::File, Option<JoinHandle<()>>), ExecutorError> {
    let opened = |e| ExecutorError(format!("cannot open the log: {e}"));
    if spec.mask.is_empty() && world == 1 {
        return Ok((log.try_clone().map_err(opened)?, None));
    }
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| ExecutorError(format!("cannot make the log's pipe: {e}")))?;
    let copy = log.try_clone().map_err(opened)?;
    let label = (world > 1).then(|| format!("[rank {rank}] "));
    let task = tokio::spawn(copy_out(read, copy, spec.mask.stream(), Lines::new(label)));
    Ok((std::fs::File::from(write), Some(task)))
}

/// Copies what a rank writes to its pipe into `log`: masked, then in labelled lines.
async fn copy_out(pipe: OwnedFd, mut log: std::fs::File, mut mask: Stream, mut lines: Lines) {
    use tokio::io::AsyncReadExt as _;
    let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(pipe) else {
        return;
    };
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = pipe.read(&mut buf).await {
        // One write a batch of whole lines: the log is opened to append, so another
        // rank's lines go before or after it, never into it.
        let _ = log.write_all(&lines.push(&mask.push(&buf[..n])));
    }
    let mut rest = lines.push(&mask.finish());
    rest.extend(lines.finish());
    let _ = log.write_all(&rest);
}

/// Output cut into whole lines, each led by a label; without a label, passed as it comes.
pub(super) struct Lines {
    label: Option<Vec<u8>>,
    held: Vec<u8>,
    /// Whether the next byte out starts a line (a long line's pieces are labelled once).
    at_start: bool,
}

impl Lines {
    pub(super) fn new(label: Option<String>) -> Self {
        Lines {
            label: label.map(String::into_bytes),
            held: Vec::new(),
            at_start: true,
        }
    }

    /// What of `bytes` (and what was held) can go out now: every whole line, labelled;
    /// the part of a line after its last newline is held (unless it grew too long).
    pub(super) fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        let Some(label) = &self.label else {
            return bytes.to_vec();
        };
        self.held.extend_from_slice(bytes);
        let whole = match self.held.iter().rposition(|b| *b == b'\n') {
            Some(end) => end + 1,
            None if self.held.len() >= HELD_LINE => self.held.len(),
            None => return Vec::new(),
        };
        let out: Vec<u8> = self.held.drain(..whole).collect();
        let mut labelled = Vec::with_capacity(out.len() + label.len() * 8);
        for line in out.split_inclusive(|b| *b == b'\n') {
            if self.at_start {
                labelled.extend_from_slice(label);
            }
            labelled.extend_from_slice(line);
            self.at_start = line.ends_with(b"\n");
        }
        labelled
    }

    /// The last line, if it had no newline: labelled and ended (another rank's line
    /// may follow it in the log).
    pub(super) fn finish(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        let Some(label) = &self.label else {
            return held;
        };
        let mut out = Vec::new();
        if !held.is_empty() && self.at_start {
            out.extend_from_slice(label);
        }
        out.extend(held);
        if !self.at_start || !out.is_empty() {
            out.push(b'\n');
        }
        self.at_start = true;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Lines;

    fn all(lines: &mut Lines, pieces: &[&str]) -> String {
        let mut out = Vec::new();
        for p in pieces {
            out.extend(lines.push(p.as_bytes()));
        }
        out.extend(lines.finish());
        String::from_utf8(out).unwrap()
    }

    /// Lines cut anywhere come out whole and labelled once; the unended last line too,
    /// ended.
    #[test]
    fn lines_are_labelled_whole() {
        let mut l = Lines::new(Some("[rank 1] ".into()));
        assert_eq!(l.push(b"epo"), b"", "a part of a line is held");
        let out = all(&mut l, &["ch 1\nepoch", " 2\n\nloss 0.4\ndone"]);
        assert_eq!(
            out,
            "[rank 1] epoch 1\n[rank 1] epoch 2\n[rank 1] \n[rank 1] loss 0.4\n[rank 1] done\n"
        );
        assert_eq!(
            all(&mut Lines::new(Some("[rank 2] ".into())), &["x\n"]),
            "[rank 2] x\n"
        );
    }

    /// A line longer than what is held goes out in pieces, labelled at its start only.
    #[test]
    fn a_long_line_is_labelled_once() {
        let mut l = Lines::new(Some("[rank 0] ".into()));
        let long = "x".repeat(super::HELD_LINE + 10);
        let out = all(&mut l, &[&long, "y\nz\n"]);
        assert_eq!(out, format!("[rank 0] {long}y\n[rank 0] z\n"));
    }

    /// Without a label, bytes pass as they come.
    #[test]
    fn unlabelled_output_passes() {
        let mut l = Lines::new(None);
        assert_eq!(l.push(b"a\nb"), b"a\nb");
        assert_eq!(l.finish(), b"");
    }
}
