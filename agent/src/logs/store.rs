//! Persisted logs: gzip chunks plus an index, behind the [`LogStore`] trait
//! ([`LocalLogStore`] today; an S3 store can implement the same five calls).
//!
//! Layout under the store's root:
//!
//! ```text
//! <namespace>/<alloc-name>/<attempt>/index.json
//! <namespace>/<alloc-name>/<attempt>/stdout/chunk-000000.log.gz
//! <namespace>/<alloc-name>/<attempt>/stderr/chunk-000000.log.gz
//! ```
//!
//! Each stored line is `<RFC 3339 time> <seq> <F|P> <data>\n`: `seq` orders lines across
//! both streams, `F` marks a line that ended with a newline and `P` a partial one. The
//! index lists each chunk's first/last time and sequence, its byte range in the
//! stream, and the spool offset it covers (where a restarted agent resumes reading).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use serde::{Deserialize, Serialize};

use super::{LogLine, Stream};
use crate::state::write_atomic;

/// A chunk is closed once it holds this many bytes of data...
pub const CHUNK_BYTES: usize = 1024 * 1024;
/// ... or once its first line is this old.
pub const CHUNK_AGE: Duration = Duration::from_secs(5);

/// Which logs: one attempt of one allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LogKey {
    /// Tenant.
    pub namespace: String,
    /// Allocation name.
    pub name: String,
    /// Binding attempt.
    pub attempt: u32,
}

/// One chunk in the index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChunkMeta {
    /// File name, e.g. `chunk-000003.log.gz`.
    pub file: String,
    /// Time of its first line.
    pub first_time: DateTime<Utc>,
    /// Time of its last line.
    pub last_time: DateTime<Utc>,
    /// Sequence number of its first line.
    pub first_seq: u64,
    /// Sequence number of its last line.
    pub last_seq: u64,
    /// Lines in it.
    pub lines: u64,
    /// Offset of its first byte in the stream's output.
    pub start_offset: u64,
    /// Offset just past its last byte in the stream's output.
    pub end_offset: u64,
}

/// One stream's part of the index.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamIndex {
    /// Chunks, oldest first.
    #[serde(default)]
    pub chunks: Vec<ChunkMeta>,
    /// Bytes of output stored (the next chunk's `startOffset`).
    #[serde(default)]
    pub bytes: u64,
    /// Spool offset up to which everything is in the chunks.
    #[serde(default)]
    pub spool_offset: u64,
}

/// `index.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogIndex {
    /// Sequence number the next line gets.
    #[serde(default)]
    pub next_seq: u64,
    /// The process is gone and every line is stored.
    #[serde(default)]
    pub complete: bool,
    /// Node the logs come from.
    #[serde(default)]
    pub node: String,
    /// The allocation's uid: an allocation made later under the same name is another one,
    /// and neither reads nor appends to these logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Standard output.
    #[serde(default)]
    pub stdout: StreamIndex,
    /// Standard error.
    #[serde(default)]
    pub stderr: StreamIndex,
}

impl LogIndex {
    /// One stream's part.
    pub fn stream(&self, s: Stream) -> &StreamIndex {
        match s {
            Stream::Stdout => &self.stdout,
            Stream::Stderr => &self.stderr,
        }
    }
    /// One stream's part, mutably.
    pub fn stream_mut(&mut self, s: Stream) -> &mut StreamIndex {
        match s {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        }
    }
}

/// Where chunks and indexes are kept.
pub trait LogStore: Send + Sync + std::fmt::Debug {
    /// Store chunk `file` of `stream`.
    fn put_chunk(
        &self,
        key: &LogKey,
        stream: Stream,
        file: &str,
        lines: &[LogLine],
    ) -> std::io::Result<()>;
    /// Read chunk `file` of `stream`.
    fn get_chunk(&self, key: &LogKey, stream: Stream, file: &str) -> std::io::Result<Vec<LogLine>>;
    /// Store the index (after the chunks it names).
    fn put_index(&self, key: &LogKey, index: &LogIndex) -> std::io::Result<()>;
    /// The index, if any logs exist.
    fn get_index(&self, key: &LogKey) -> std::io::Result<Option<LogIndex>>;
    /// Attempts with logs for an allocation, ascending.
    fn attempts(&self, namespace: &str, name: &str) -> std::io::Result<Vec<u32>>;
    /// Remove a run's logs (those of a deleted allocation whose name is used again).
    fn remove(&self, key: &LogKey) -> std::io::Result<()>;
}

/// Chunks and indexes as files under a directory.
#[derive(Debug, Clone)]
pub struct LocalLogStore {
    root: PathBuf,
}

impl LocalLogStore {
    /// A store under `root` (`<state-dir>/logs`).
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// `<root>/<namespace>/<name>/<attempt>`.
    pub fn dir(&self, key: &LogKey) -> PathBuf {
        self.root
            .join(&key.namespace)
            .join(&key.name)
            .join(key.attempt.to_string())
    }
}

impl LogStore for LocalLogStore {
    fn put_chunk(
        &self,
        key: &LogKey,
        stream: Stream,
        file: &str,
        lines: &[LogLine],
    ) -> std::io::Result<()> {
        let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
        for l in lines {
            gz.write_all(&encode_line(l))?;
        }
        let bytes = gz.finish()?;
        write_atomic(&self.dir(key).join(stream.as_str()).join(file), &bytes)
    }

    fn get_chunk(&self, key: &LogKey, stream: Stream, file: &str) -> std::io::Result<Vec<LogLine>> {
        let f = std::fs::File::open(self.dir(key).join(stream.as_str()).join(file))?;
        let mut raw = Vec::new();
        GzDecoder::new(f).read_to_end(&mut raw)?;
        Ok(decode_lines(&raw, stream))
    }

    fn put_index(&self, key: &LogKey, index: &LogIndex) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(index).map_err(std::io::Error::other)?;
        write_atomic(&self.dir(key).join("index.json"), &bytes)
    }

    fn remove(&self, key: &LogKey) -> std::io::Result<()> {
        match std::fs::remove_dir_all(self.dir(key)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    fn get_index(&self, key: &LogKey) -> std::io::Result<Option<LogIndex>> {
        match std::fs::read(self.dir(key).join("index.json")) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(std::io::Error::other),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn attempts(&self, namespace: &str, name: &str) -> std::io::Result<Vec<u32>> {
        let dir = self.root.join(namespace).join(name);
        let mut out: Vec<u32> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        out.sort_unstable();
        Ok(out)
    }
}

/// `<time> <seq> <F|P> <data>\n`.
pub fn encode_line(l: &LogLine) -> Vec<u8> {
    let mut out = format!(
        "{} {} {} ",
        l.time.to_rfc3339_opts(SecondsFormat::Nanos, true),
        l.seq,
        if l.newline { 'F' } else { 'P' }
    )
    .into_bytes();
    out.extend_from_slice(&l.data);
    out.push(b'\n');
    out
}

/// Parse stored lines (malformed ones are skipped).
pub fn decode_lines(raw: &[u8], stream: Stream) -> Vec<LogLine> {
    let mut out = Vec::new();
    for rec in raw.split(|&b| b == b'\n') {
        let mut parts = rec.splitn(4, |&b| b == b' ');
        let (Some(t), Some(seq), Some(flag)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let data = parts.next().unwrap_or_default().to_vec();
        let Some(time) = std::str::from_utf8(t)
            .ok()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        else {
            continue;
        };
        let Some(seq) = std::str::from_utf8(seq).ok().and_then(|s| s.parse().ok()) else {
            continue;
        };
        out.push(LogLine {
            seq,
            stream,
            time: time.with_timezone(&Utc),
            newline: flag == b"F",
            data,
        });
    }
    out
}

/// The open chunks of one attempt and its index: lines go in, closed chunks and the
/// index come out in the store.
#[derive(Debug)]
pub struct ChunkWriter {
    key: LogKey,
    index: LogIndex,
    open: BTreeMap<Stream, OpenChunk>,
}

#[derive(Debug)]
struct OpenChunk {
    lines: Vec<LogLine>,
    bytes: usize,
    opened: Instant,
    spool_offset: u64,
}

impl ChunkWriter {
    /// Resume from `index` (or start afresh).
    pub fn new(key: LogKey, index: LogIndex) -> Self {
        Self {
            key,
            index,
            open: BTreeMap::new(),
        }
    }

    /// The index as last stored (plus `next_seq` updates).
    pub fn index(&self) -> &LogIndex {
        &self.index
    }

    /// Lowest sequence number not yet stored, if any line is waiting.
    pub fn first_unstored_seq(&self) -> Option<u64> {
        self.open
            .values()
            .filter_map(|c| c.lines.first().map(|l| l.seq))
            .min()
    }

    /// Add a line read from the spool up to `spool_offset`; closes the chunk when full.
    pub fn append(
        &mut self,
        store: &dyn LogStore,
        line: LogLine,
        spool_offset: u64,
    ) -> std::io::Result<()> {
        let stream = line.stream;
        self.index.next_seq = self.index.next_seq.max(line.seq + 1);
        let c = self.open.entry(stream).or_insert_with(|| OpenChunk {
            lines: Vec::new(),
            bytes: 0,
            opened: Instant::now(),
            spool_offset,
        });
        c.bytes += line.data.len() + usize::from(line.newline);
        c.spool_offset = spool_offset;
        c.lines.push(line);
        if c.bytes >= CHUNK_BYTES {
            self.close_and_index(store, [stream])?;
        }
        Ok(())
    }

    /// Close chunks older than [`CHUNK_AGE`].
    pub fn close_aged(&mut self, store: &dyn LogStore) -> std::io::Result<()> {
        let due: Vec<Stream> = self
            .open
            .iter()
            .filter(|(_, c)| c.opened.elapsed() >= CHUNK_AGE)
            .map(|(s, _)| *s)
            .collect();
        self.close_and_index(store, due)
    }

    /// Close every open chunk.
    pub fn close_all(&mut self, store: &dyn LogStore) -> std::io::Result<()> {
        self.close_and_index(store, Stream::ALL)
    }

    /// Close every chunk and mark the logs complete (one index write).
    pub fn finish(&mut self, store: &dyn LogStore) -> std::io::Result<()> {
        let (any, closed) = self.close_many(store, Stream::ALL);
        // Complete only when every line is in a chunk; a failed chunk is retried later.
        if closed.is_ok() {
            self.index.complete = true;
        }
        if any || closed.is_ok() {
            store.put_index(&self.key, &self.index)?;
        }
        closed
    }

    /// Close `streams`' chunks, then write the index once if any was closed.
    fn close_and_index(
        &mut self,
        store: &dyn LogStore,
        streams: impl IntoIterator<Item = Stream>,
    ) -> std::io::Result<()> {
        let (any, closed) = self.close_many(store, streams);
        if any {
            // Even after a failure: the chunks closed before it must be indexed.
            store.put_index(&self.key, &self.index)?;
        }
        closed
    }

    /// Close `streams`' chunks (stopping at the first failure); whether any chunk was
    /// closed, and the outcome. The index is not written.
    fn close_many(
        &mut self,
        store: &dyn LogStore,
        streams: impl IntoIterator<Item = Stream>,
    ) -> (bool, std::io::Result<()>) {
        let mut any = false;
        for s in streams {
            match self.close(store, s) {
                Ok(closed) => any |= closed,
                Err(e) => return (any, Err(e)),
            }
        }
        (any, Ok(()))
    }

    /// Close one stream's chunk (without writing the index); whether there was one.
    fn close(&mut self, store: &dyn LogStore, stream: Stream) -> std::io::Result<bool> {
        let Some(c) = self.open.remove(&stream) else {
            return Ok(false);
        };
        let (Some(first), Some(last)) = (c.lines.first(), c.lines.last()) else {
            return Ok(false);
        };
        let si = self.index.stream(stream);
        let file = format!("chunk-{:06}.log.gz", si.chunks.len());
        let meta = ChunkMeta {
            file: file.clone(),
            first_time: first.time,
            last_time: last.time,
            first_seq: first.seq,
            last_seq: last.seq,
            lines: c.lines.len() as u64,
            start_offset: si.bytes,
            end_offset: si.bytes + c.bytes as u64,
        };
        if let Err(e) = store.put_chunk(&self.key, stream, &file, &c.lines) {
            // Keep the lines for the next attempt.
            self.open.insert(stream, c);
            return Err(e);
        }
        let si = self.index.stream_mut(stream);
        si.bytes = meta.end_offset;
        si.spool_offset = c.spool_offset;
        si.chunks.push(meta);
        Ok(true)
    }
}

/// What to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineFilter {
    /// Streams wanted.
    pub streams: Vec<Stream>,
    /// Lines at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Lines at or before this time.
    pub until: Option<DateTime<Utc>>,
    /// Only lines with a smaller sequence number.
    pub before_seq: Option<u64>,
    /// Only lines with this sequence number or more.
    pub from_seq: Option<u64>,
}

impl LineFilter {
    /// Whether `l` passes.
    pub fn matches(&self, l: &LogLine) -> bool {
        self.streams.contains(&l.stream)
            && self.since.is_none_or(|t| l.time >= t)
            && self.until.is_none_or(|t| l.time <= t)
            && self.before_seq.is_none_or(|s| l.seq < s)
            && self.from_seq.is_none_or(|s| l.seq >= s)
    }
}

/// The stored lines of `key` passing `filter`, in sequence order; with `tail`, only
/// the last `tail` of them (reading chunks from the newest backwards).
pub fn read_stored(
    store: &dyn LogStore,
    key: &LogKey,
    index: &LogIndex,
    filter: &LineFilter,
    tail: Option<usize>,
) -> std::io::Result<Vec<LogLine>> {
    let mut all = Vec::new();
    for &stream in &filter.streams {
        let mut got: Vec<Vec<LogLine>> = Vec::new();
        let mut count = 0;
        for c in index.stream(stream).chunks.iter().rev() {
            if filter.since.is_some_and(|t| c.last_time < t)
                || filter.until.is_some_and(|t| c.first_time > t)
                || filter.before_seq.is_some_and(|s| c.first_seq >= s)
                || filter.from_seq.is_some_and(|s| c.last_seq < s)
            {
                continue;
            }
            let lines: Vec<LogLine> = store
                .get_chunk(key, stream, &c.file)?
                .into_iter()
                .filter(|l| filter.matches(l))
                .collect();
            count += lines.len();
            got.push(lines);
            if tail.is_some_and(|n| count >= n) {
                break;
            }
        }
        all.extend(got.into_iter().rev().flatten());
    }
    all.sort_by_key(|l| l.seq);
    if let Some(n) = tail {
        let skip = all.len().saturating_sub(n);
        all.drain(..skip);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(seq: u64, stream: Stream, ms: i64, data: &[u8]) -> LogLine {
        LogLine {
            seq,
            stream,
            time: DateTime::from_timestamp_millis(ms).unwrap(),
            newline: true,
            data: data.to_vec(),
        }
    }

    fn key() -> LogKey {
        LogKey {
            namespace: "t".into(),
            name: "a".into(),
            attempt: 1,
        }
    }

    #[test]
    fn line_encoding_round_trips_odd_bytes() {
        let mut l = line(7, Stream::Stderr, 1_700_000_000_123, b"a b  c\r\xff");
        l.newline = false;
        let enc = encode_line(&l);
        assert!(enc.starts_with(b"2023-11-14T22:13:20.123000000Z 7 P a b"));
        assert_eq!(decode_lines(&enc, Stream::Stderr), vec![l]);
        let empty = line(8, Stream::Stdout, 0, b"");
        assert_eq!(
            decode_lines(&encode_line(&empty), Stream::Stdout),
            vec![empty]
        );
    }

    #[test]
    fn chunks_rotate_index_records_ranges_and_reads_filter() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalLogStore::new(dir.path().to_path_buf());
        let mut w = ChunkWriter::new(key(), LogIndex::default());
        let big = vec![b'x'; CHUNK_BYTES / 2];
        // Three big stdout lines: the first chunk closes at the second line.
        w.append(&store, line(0, Stream::Stdout, 1000, &big), 10)
            .unwrap();
        w.append(&store, line(1, Stream::Stderr, 1500, b"warn"), 5)
            .unwrap();
        w.append(&store, line(2, Stream::Stdout, 2000, &big), 20)
            .unwrap();
        assert_eq!(w.first_unstored_seq(), Some(1));
        w.append(&store, line(3, Stream::Stdout, 3000, b"tail"), 30)
            .unwrap();
        let idx = store.get_index(&key()).unwrap().unwrap();
        assert_eq!(idx.stdout.chunks.len(), 1);
        assert_eq!(idx.stdout.spool_offset, 20);
        assert_eq!(idx.stdout.chunks[0].first_seq, 0);
        assert_eq!(idx.stdout.chunks[0].last_seq, 2);
        assert_eq!(idx.stdout.chunks[0].end_offset, (big.len() as u64 + 1) * 2);
        assert_eq!(idx.stderr.chunks.len(), 0, "stderr chunk still open");
        w.finish(&store).unwrap();
        let idx = store.get_index(&key()).unwrap().unwrap();
        assert!(idx.complete);
        assert_eq!(idx.next_seq, 4);
        assert_eq!(idx.stdout.chunks.len(), 2);
        assert_eq!(
            idx.stdout.chunks[1].start_offset,
            idx.stdout.chunks[0].end_offset
        );
        assert_eq!(idx.stderr.spool_offset, 5);
        assert!(dir.path().join("t/a/1/stdout/chunk-000001.log.gz").exists());

        let both = LineFilter {
            streams: Stream::ALL.to_vec(),
            ..Default::default()
        };
        let all = read_stored(&store, &key(), &idx, &both, None).unwrap();
        assert_eq!(all.iter().map(|l| l.seq).collect::<Vec<_>>(), [0, 1, 2, 3]);
        let tail = read_stored(&store, &key(), &idx, &both, Some(2)).unwrap();
        assert_eq!(tail.iter().map(|l| l.seq).collect::<Vec<_>>(), [2, 3]);
        let errs = LineFilter {
            streams: vec![Stream::Stderr],
            ..Default::default()
        };
        let e = read_stored(&store, &key(), &idx, &errs, None).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].data, b"warn");
        let window = LineFilter {
            streams: Stream::ALL.to_vec(),
            since: DateTime::from_timestamp_millis(1500),
            until: DateTime::from_timestamp_millis(2000),
            ..Default::default()
        };
        let w = read_stored(&store, &key(), &idx, &window, None).unwrap();
        assert_eq!(w.iter().map(|l| l.seq).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(store.attempts("t", "a").unwrap(), vec![1]);
        assert!(store.attempts("t", "nope").unwrap().is_empty());
    }
}
