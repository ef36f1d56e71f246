//! The spool: how a workload's output travels from its shim to the agent.
//!
//! The shim reads the workload's stdout and stderr pipes, cuts them into lines (a line
//! still unfinished after [`PARTIAL_FLUSH`] of silence, or longer than [`MAX_LINE`], is
//! emitted as a *partial* record so nothing waits forever), stamps each with the time of
//! its first byte and appends it to `<run-dir>/<stream>.spool` as a frame:
//!
//! ```text
//! i64 LE  unix time in nanoseconds
//! u32 LE  length of the data
//! u8      flags (bit 0: the line ended with '\n', which is not stored)
//! [u8]    data
//! ```
//!
//! Files, not pipes, connect the two processes, so the workload never blocks on, or
//! dies with, the agent: output written while the agent is down waits in the spool with
//! its true timestamps, and the agent catches up from its last committed offset.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// A line is cut into partial records above this size.
pub const MAX_LINE: usize = 64 * 1024;
/// An unfinished line is emitted as a partial record after this much silence.
pub const PARTIAL_FLUSH: Duration = Duration::from_millis(250);
/// The most bytes one [`SpoolReader::read`] takes in.
pub const READ_BATCH: usize = 4 * 1024 * 1024;

const HEADER: usize = 13;
const FLAG_NEWLINE: u8 = 1;

/// One record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// When its first byte was read.
    pub time: DateTime<Utc>,
    /// The line ended with a newline (not part of `data`).
    pub newline: bool,
    /// The bytes.
    pub data: Vec<u8>,
}

impl Frame {
    /// Append the encoded frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let nanos = self.time.timestamp_nanos_opt().unwrap_or(i64::MAX);
        out.extend_from_slice(&nanos.to_le_bytes());
        out.extend_from_slice(&(self.data.len() as u32).to_le_bytes());
        out.push(if self.newline { FLAG_NEWLINE } else { 0 });
        out.extend_from_slice(&self.data);
    }

    /// Decode one frame from the start of `buf`: the frame and its encoded length, or
    /// `None` when `buf` holds only part of one.
    pub fn decode(buf: &[u8]) -> Option<(Frame, usize)> {
        if buf.len() < HEADER {
            return None;
        }
        let nanos = i64::from_le_bytes(buf[0..8].try_into().ok()?);
        let len = u32::from_le_bytes(buf[8..12].try_into().ok()?) as usize;
        let flags = buf[12];
        let end = HEADER.checked_add(len)?;
        if buf.len() < end {
            return None;
        }
        Some((
            Frame {
                time: DateTime::from_timestamp_nanos(nanos),
                newline: flags & FLAG_NEWLINE != 0,
                data: buf[HEADER..end].to_vec(),
            },
            end,
        ))
    }
}

/// Cuts a byte stream into line records (used by the shim).
#[derive(Debug, Default)]
pub struct LineAssembler {
    pending: Vec<u8>,
    pending_since: Option<DateTime<Utc>>,
}

impl LineAssembler {
    /// Whether an unfinished line is waiting.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Take in `data` read at `now`; complete lines go to `out`.
    pub fn feed(&mut self, data: &[u8], now: DateTime<Utc>, out: &mut Vec<Frame>) {
        let mut rest = data;
        while !rest.is_empty() {
            if self.pending.is_empty() {
                self.pending_since = Some(now);
            }
            let room = MAX_LINE - self.pending.len();
            match rest.iter().take(room).position(|&b| b == b'\n') {
                Some(i) => {
                    self.pending.extend_from_slice(&rest[..i]);
                    self.emit(true, out);
                    rest = &rest[i + 1..];
                }
                None => {
                    let take = rest.len().min(room);
                    self.pending.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if self.pending.len() >= MAX_LINE {
                        self.emit(false, out);
                    }
                }
            }
        }
    }

    /// Emit the unfinished line, if any, as a partial record.
    pub fn flush(&mut self, out: &mut Vec<Frame>) {
        if !self.pending.is_empty() {
            self.emit(false, out);
        }
    }

    fn emit(&mut self, newline: bool, out: &mut Vec<Frame>) {
        out.push(Frame {
            time: self.pending_since.take().unwrap_or_else(Utc::now),
            newline,
            data: std::mem::take(&mut self.pending),
        });
    }
}

/// Appends frames to a spool file (used by the shim).
#[derive(Debug)]
pub struct SpoolWriter {
    file: std::fs::File,
}

impl SpoolWriter {
    /// Open (create, append) `path`.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self { file })
    }

    /// Append to `file` (opened for appending).
    pub fn from_file(file: std::fs::File) -> Self {
        Self { file }
    }

    /// Append `frames` in one write.
    pub fn write(&mut self, frames: &[Frame]) -> std::io::Result<()> {
        if frames.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for f in frames {
            f.encode(&mut buf);
        }
        self.file.write_all(&buf)
    }

    /// fsync.
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_all()
    }
}

/// Reads new frames from a spool file, from a byte offset (used by the agent).
#[derive(Debug, Clone)]
pub struct SpoolReader {
    path: PathBuf,
    offset: u64,
}

impl SpoolReader {
    /// Read `path` from `offset` (the end of the last frame already consumed).
    pub fn new(path: PathBuf, offset: u64) -> Self {
        Self { path, offset }
    }

    /// The offset after the last frame read.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The complete frames written since the last call (at most about
    /// [`READ_BATCH`] bytes), each with the offset just after it. A missing file or a
    /// frame still being written yields nothing more.
    pub fn read(&mut self) -> std::io::Result<Vec<(Frame, u64)>> {
        let mut f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let len = f.metadata()?.len();
        if len <= self.offset {
            return Ok(Vec::new());
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let want = ((len - self.offset) as usize).min(READ_BATCH + MAX_LINE + HEADER);
        let mut buf = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match f.read(&mut buf[got..])? {
                0 => break,
                n => got += n,
            }
        }
        buf.truncate(got);
        let mut out = Vec::new();
        let mut pos = 0;
        while let Some((frame, used)) = Frame::decode(&buf[pos..]) {
            pos += used;
            out.push((frame, self.offset + pos as u64));
        }
        self.offset += pos as u64;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(ms).unwrap()
    }

    #[test]
    fn lines_partials_and_long_lines() {
        let mut a = LineAssembler::default();
        let mut out = Vec::new();
        a.feed(b"hello\nwor", t(1), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].data, b"hello");
        assert!(out[0].newline);
        assert!(a.has_pending());
        a.feed(b"ld\n\n", t(2), &mut out);
        assert_eq!(out[1].data, b"world");
        assert_eq!(
            out[1].time,
            t(1),
            "a line is stamped with its first byte's time"
        );
        assert_eq!(out[2].data, b"");
        a.feed(b"progress 50%", t(3), &mut out);
        a.flush(&mut out);
        assert_eq!(out[3].data, b"progress 50%");
        assert!(!out[3].newline);
        let long = vec![b'x'; MAX_LINE + 10];
        let mut out = Vec::new();
        a.feed(&long, t(4), &mut out);
        a.feed(b"\n", t(5), &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].data.len(), MAX_LINE);
        assert!(!out[0].newline);
        assert_eq!(out[1].data.len(), 10);
        assert!(out[1].newline);
    }

    #[test]
    fn reader_resumes_and_waits_for_torn_frames() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout.spool");
        let mut r = SpoolReader::new(path.clone(), 0);
        assert!(r.read().unwrap().is_empty(), "missing file");
        let mut w = SpoolWriter::open(&path).unwrap();
        let f1 = Frame {
            time: t(10),
            newline: true,
            data: b"one".to_vec(),
        };
        let f2 = Frame {
            time: t(20),
            newline: false,
            data: vec![0xff, 0x00, b'\n'],
        };
        w.write(std::slice::from_ref(&f1)).unwrap();
        // Half of the second frame: not returned yet.
        let mut enc = Vec::new();
        f2.encode(&mut enc);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(&enc[..5])
            .unwrap();
        let got = r.read().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, f1);
        let after_first = r.offset();
        assert_eq!(got[0].1, after_first);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(&enc[5..])
            .unwrap();
        let got = r.read().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, f2);
        // A new reader from the committed offset sees only what follows.
        let mut again = SpoolReader::new(path, after_first);
        assert_eq!(again.read().unwrap()[0].0, f2);
    }
}
