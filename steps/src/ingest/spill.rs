//! Putting a log's frame messages in time order in bounded memory: messages are kept
//! until a bound of their bytes ([`BUFFER_BYTES`] unless `reorder_memory` says), then sorted and written to disk as a run; the runs are
//! merged back (k-way, by log time, file order among equal times). A log that fits is
//! sorted in memory and never touches the disk.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// The most message bytes held before a sorted run goes to disk, unless
/// `reorder_memory` says otherwise.
pub(super) const BUFFER_BYTES: usize = 64 << 20;

/// One message of a frame topic, with where it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Kept {
    pub log_time: u64,
    /// Its place in the file: equal log times keep file order.
    pub seq: u64,
    pub channel: u16,
    pub offset: u64,
    pub chunk_offset: Option<u64>,
    pub data: Vec<u8>,
}

/// Messages in, in any order; out in (log time, file order).
pub(super) struct Sorter {
    dir: PathBuf,
    limit: usize,
    held: Vec<Kept>,
    held_bytes: usize,
    runs: Vec<PathBuf>,
    seq: u64,
}

impl Sorter {
    /// A sorter spilling into `dir` (made when the first run is written, removed with
    /// the sorter), holding at most `limit` bytes of messages.
    pub(super) fn new(dir: PathBuf, limit: usize) -> Sorter {
        Sorter {
            dir,
            limit,
            held: Vec::new(),
            held_bytes: 0,
            runs: Vec::new(),
            seq: 0,
        }
    }

    pub(super) fn push(
        &mut self,
        log_time: u64,
        channel: u16,
        offset: u64,
        chunk_offset: Option<u64>,
        data: &[u8],
    ) -> anyhow::Result<()> {
        self.held_bytes += data.len() + 48;
        self.held.push(Kept {
            log_time,
            seq: self.seq,
            channel,
            offset,
            chunk_offset,
            data: data.to_vec(),
        });
        self.seq += 1;
        if self.held_bytes >= self.limit {
            self.spill()?;
        }
        Ok(())
    }

    #[cfg(test)]
    fn runs(&self) -> usize {
        self.runs.len()
    }

    fn spill(&mut self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(format!("run-{}", self.runs.len()));
        let mut w = BufWriter::new(File::create(&path)?);
        self.held.sort_unstable_by_key(|k| (k.log_time, k.seq));
        for k in self.held.drain(..) {
            write_kept(&mut w, &k)?;
        }
        w.flush()?;
        self.held_bytes = 0;
        self.runs.push(path);
        Ok(())
    }

    /// Calls `f` with every message in order; gives how many sorted runs went to disk.
    pub(super) fn drain(
        mut self,
        mut f: impl FnMut(&Kept) -> anyhow::Result<()>,
    ) -> anyhow::Result<u64> {
        if self.runs.is_empty() {
            self.held.sort_unstable_by_key(|k| (k.log_time, k.seq));
            self.held.iter().try_for_each(f)?;
            return Ok(0);
        }
        if !self.held.is_empty() {
            self.spill()?;
        }
        let mut readers = Vec::new();
        for run in &self.runs {
            readers.push(BufReader::with_capacity(1 << 16, File::open(run)?));
        }
        // The smallest head of every run first.
        let mut heap = BinaryHeap::new();
        for (i, r) in readers.iter_mut().enumerate() {
            if let Some(k) = read_kept(r)? {
                heap.push(Reverse((k, i)));
            }
        }
        while let Some(Reverse((k, i))) = heap.pop() {
            f(&k)?;
            if let Some(next) = read_kept(&mut readers[i])? {
                heap.push(Reverse((next, i)));
            }
        }
        Ok(self.runs.len() as u64)
    }
}

impl Drop for Sorter {
    fn drop(&mut self) {
        if !self.runs.is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn write_kept(w: &mut impl Write, k: &Kept) -> std::io::Result<()> {
    w.write_all(&k.log_time.to_le_bytes())?;
    w.write_all(&k.seq.to_le_bytes())?;
    w.write_all(&k.channel.to_le_bytes())?;
    w.write_all(&k.offset.to_le_bytes())?;
    w.write_all(&k.chunk_offset.map_or(0, |c| c + 1).to_le_bytes())?;
    w.write_all(&(k.data.len() as u64).to_le_bytes())?;
    w.write_all(&k.data)
}

fn read_kept(r: &mut impl Read) -> anyhow::Result<Option<Kept>> {
    let mut head = [0u8; 42];
    match r.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().unwrap_or_default());
    let chunk = u64_at(26);
    let len = u64_at(34) as usize;
    let mut data = vec![0u8; len];
    r.read_exact(&mut data)?;
    Ok(Some(Kept {
        log_time: u64_at(0),
        seq: u64_at(8),
        channel: u16::from_le_bytes([head[16], head[17]]),
        offset: u64_at(18),
        chunk_offset: chunk.checked_sub(1),
        data,
    }))
}

/// Where a drive's runs go: beside its partition, removed when it is done.
pub(super) fn spill_dir(frames: &Path, drive: &str) -> PathBuf {
    frames.join(format!(".spill-{drive}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_on_disk_merge_to_time_order_keeping_file_order_among_equal_times() {
        let dir = std::env::temp_dir().join(format!("dt-spill-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // A limit of a few messages: many runs.
        let mut s = Sorter::new(dir.clone(), 200);
        let times: Vec<u64> = (0..500u64).map(|i| (i * 7919) % 101).collect();
        for (i, t) in times.iter().enumerate() {
            s.push(
                *t,
                (i % 3) as u16,
                i as u64,
                i.is_multiple_of(2).then_some(i as u64 * 2),
                &i.to_le_bytes(),
            )
            .unwrap();
        }
        assert!(s.runs() > 10, "{} runs", s.runs());
        let mut out = Vec::new();
        s.drain(|k| {
            out.push((
                k.log_time,
                k.offset,
                k.chunk_offset,
                k.channel,
                k.data.clone(),
            ));
            Ok(())
        })
        .unwrap();
        let mut want: Vec<(u64, u64)> = times
            .iter()
            .enumerate()
            .map(|(i, t)| (*t, i as u64))
            .collect();
        want.sort(); // by time, then by file order
        let got: Vec<(u64, u64)> = out.iter().map(|o| (o.0, o.1)).collect();
        assert_eq!(got, want);
        for (t, off, chunk, channel, data) in &out {
            let i = *off as usize;
            assert_eq!(
                (*t, *chunk, *channel, data.as_slice()),
                (
                    times[i],
                    i.is_multiple_of(2).then_some(i as u64 * 2),
                    (i % 3) as u16,
                    &i.to_le_bytes()[..]
                )
            );
        }
        assert!(!dir.exists(), "the runs are removed");
    }
}
