//! The write-ahead log of the single-member embedded store (`wal.log` beside
//! `state.redb`), and of a Raft member's log (`raft-log.wal` beside `raft-log.redb`,
//! see `raft::log_store`).
//!
//! A redb commit with `Durability::Immediate` costs two fsyncs and rewrites several
//! pages (about 1 ms here), while writing one record into space the file already has and
//! calling `fdatasync` costs one small write (0.15–0.3 ms here). So each batch is made
//! durable here first, then committed to `state.redb` *without* fsync; a durable redb
//! commit (a checkpoint) happens only every [`CHECKPOINT_BYTES`] of log or
//! [`CHECKPOINT_EVERY`], after which the log is written again from its start. After a
//! crash redb comes back at its last durable commit, and the records after it (by
//! sequence number, which `state.redb` stores with every batch as `meta.wal_seq`) are
//! applied again.
//!
//! Record, at an offset that is a multiple of 8: `len: u32 | crc32(seq ‖ payload): u32 |
//! seq: u64 | payload | zero padding to a multiple of 8` (little endian). Sequence
//! numbers grow by one per record over the file's whole life and are never reused, so
//! the log is the chain of records from offset 0 whose numbers follow each other: it ends
//! at zeros (reserved space never written), at a record of an earlier pass over the file
//! (a smaller number), or at a torn last write (bad checksum). Every record of an earlier
//! pass is at most the state file's `wal_seq` (it was checkpointed before the pass
//! restarted), so a valid record *newer* than both the chain and `wal_seq` anywhere
//! after the chain's end means a record in between is damaged: start-up stops with an
//! error naming the file rather than lose the writes after it.
//!
//! A batch whose record was written but whose commit then failed (or whose `fdatasync`
//! reported an error after the data reached the disk) was answered with an error yet can
//! come back after a restart, as with etcd: an error says "not known to be written", not
//! "not written".

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{StoreError, StoreResult};

pub const WAL_FILE: &str = "wal.log";
const HEADER: usize = 16;
/// Records start at multiples of this (so the damage scan looks at one offset in 8).
const ALIGN: usize = 8;
/// Space reserved at a time (`fallocate`): the file's size does not change per record,
/// so `fdatasync` has no size update to journal (measured here: 0.14 ms per record into
/// reserved space, 0.28 ms appending).
const CHUNK: u64 = 16 << 20;
/// A checkpoint once this much log has been written since the last one...
pub const CHECKPOINT_BYTES: u64 = 12 << 20;
/// ...or this long after it (bounding how much redb holds back from reuse and how much
/// a restart replays).
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);
/// A length beyond this is damage, not a record.
const MAX_RECORD: usize = 1 << 30;
/// The record buffer is kept for the next append up to this capacity.
const KEEP_BUFFER: usize = 4 << 20;

fn io(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("{}: {e}", path.display()))
}

/// One record read back.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub seq: u64,
    pub payload: Vec<u8>,
}

pub struct Wal {
    file: File,
    path: PathBuf,
    /// Where the next record goes.
    offset: u64,
    /// Bytes reserved (the file's length).
    capacity: u64,
    /// Sequence number of the next record.
    next_seq: u64,
    /// The last record's buffer, reused.
    buf: Vec<u8>,
}

impl Wal {
    /// Open (or create) `dir/wal.log` and read the records of its chain newer than
    /// `held` (the last one the state file holds).
    pub fn open(dir: &Path, held: u64) -> StoreResult<(Wal, Vec<Record>)> {
        Wal::open_named(dir, WAL_FILE, held)
    }

    /// [`Wal::open`] for a log named `name` (a Raft member's log has its own,
    /// `raft-log.wal`).
    pub fn open_named(dir: &Path, name: &str, held: u64) -> StoreResult<(Wal, Vec<Record>)> {
        let path = dir.join(name);
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        if created {
            // The new name must survive a crash as well as the records in it.
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io(dir, e))?;
        }
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(|e| io(&path, e))?;
        let (records, last) = parse(&data, &path, held)?;
        let wal = Wal {
            capacity: data.len() as u64,
            file,
            path,
            offset: 0,
            next_seq: last.max(held) + 1,
            buf: Vec::new(),
        };
        Ok((wal, records))
    }

    /// [`Wal::open_named`], with the records after `held` decoded (postcard) and checked
    /// to go on from `held` without a gap; `state` names the file that holds the records
    /// up to `held` (for the error).
    pub fn open_decoded<T: serde::de::DeserializeOwned>(
        dir: &Path,
        name: &str,
        held: u64,
        state: &Path,
    ) -> StoreResult<(Wal, Vec<(u64, T)>)> {
        Wal::open_decoded_with(dir, name, held, state, |p| postcard::from_bytes(p))
    }

    /// [`Wal::open_decoded`] with a decoder of its own (one that reads older record
    /// layouts too).
    pub fn open_decoded_with<T, E: std::fmt::Display>(
        dir: &Path,
        name: &str,
        held: u64,
        state: &Path,
        decode: impl Fn(&[u8]) -> Result<T, E>,
    ) -> StoreResult<(Wal, Vec<(u64, T)>)> {
        let (wal, records) = Wal::open_named(dir, name, held)?;
        let path = dir.join(name);
        let mut last = held;
        let mut out = Vec::with_capacity(records.len());
        for rec in records {
            if rec.seq <= held {
                continue;
            }
            if rec.seq != last + 1 {
                return Err(StoreError::Corrupt(format!(
                    "{}: the log goes on at record {} but {} holds records up to {held}; \
                     restore from a backup",
                    path.display(),
                    rec.seq,
                    state.display()
                )));
            }
            let value = decode(&rec.payload).map_err(|e| {
                StoreError::Corrupt(format!(
                    "{}: record {} undecodable: {e}",
                    path.display(),
                    rec.seq
                ))
            })?;
            out.push((rec.seq, value));
            last = rec.seq;
        }
        Ok((wal, out))
    }

    /// Whether `dir/wal.log` holds records newer than `held`.
    pub fn has_newer(dir: &Path, held: u64) -> StoreResult<bool> {
        let path = dir.join(WAL_FILE);
        match std::fs::read(&path) {
            Ok(data) => Ok(!parse(&data, &path, held)?.0.is_empty()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(&path, e)),
        }
    }

    /// Give back reserved space beyond one chunk (a very large record grew the file);
    /// only once everything in the log is durable elsewhere.
    pub fn shrink(&mut self) -> StoreResult<()> {
        if self.capacity > CHUNK && self.offset == 0 {
            self.file.set_len(CHUNK).map_err(|e| io(&self.path, e))?;
            self.file.sync_all().map_err(|e| io(&self.path, e))?;
            self.capacity = CHUNK;
        }
        Ok(())
    }

    /// Append one record and make it durable (`fdatasync`); returns its sequence number.
    pub fn append(&mut self, payload: &[u8]) -> StoreResult<u64> {
        self.append_with(|buf| {
            buf.extend_from_slice(payload);
            Ok(())
        })
    }

    /// [`Wal::append`] of the payload `encode` writes into the buffer it is given (the
    /// record is built in one buffer kept from call to call: no copy of the payload and
    /// no fresh pages per record).
    pub fn append_with(
        &mut self,
        encode: impl FnOnce(&mut Vec<u8>) -> StoreResult<()>,
    ) -> StoreResult<u64> {
        let seq = self.next_seq;
        let mut rec = std::mem::take(&mut self.buf);
        rec.clear();
        rec.resize(HEADER, 0);
        let written = encode(&mut rec).and_then(|()| self.write_record(seq, &mut rec));
        if rec.capacity() <= KEEP_BUFFER {
            self.buf = rec;
        }
        written?;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Fill in the header of `rec` (payload after `HEADER` bytes), pad it, write it at
    /// the current offset and `fdatasync`.
    fn write_record(&mut self, seq: u64, rec: &mut Vec<u8>) -> StoreResult<()> {
        let payload = &rec[HEADER..];
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|l| (*l as usize) <= MAX_RECORD)
            .ok_or_else(|| io(&self.path, "record too large for the log"))?;
        let sum = checksum(seq, payload);
        rec[0..4].copy_from_slice(&len.to_le_bytes());
        rec[4..8].copy_from_slice(&sum.to_le_bytes());
        rec[8..16].copy_from_slice(&seq.to_le_bytes());
        rec.resize(rec.len().next_multiple_of(ALIGN), 0);
        let end = self.offset + rec.len() as u64;
        if end > self.capacity {
            self.reserve(end)?;
        }
        self.file
            .write_all_at(rec, self.offset)
            .map_err(|e| io(&self.path, e))?;
        self.file.sync_data().map_err(|e| io(&self.path, e))?;
        self.offset = end;
        Ok(())
    }

    /// Bytes written since the log (re)started.
    pub fn written(&self) -> u64 {
        self.offset
    }

    /// Everything appended so far is durable elsewhere: write the next record at the
    /// start of the file again (its sequence number keeps growing, which is what ends the
    /// chain at the older records behind it).
    pub fn restart(&mut self) {
        self.offset = 0;
    }

    /// Reserve space up to at least `end` (and a chunk more), durably.
    fn reserve(&mut self, end: u64) -> StoreResult<()> {
        let target = end.div_ceil(CHUNK).max(1) * CHUNK;
        let len = i64::try_from(target).map_err(|e| io(&self.path, e))?;
        // SAFETY: fallocate on a file descriptor we own; it only reserves blocks.
        let rc = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&self.file), 0, 0, len) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                // A filesystem without fallocate: extend the file; writes allocate.
                Some(libc::EOPNOTSUPP | libc::ENOSYS) => {
                    self.file.set_len(target).map_err(|e| io(&self.path, e))?
                }
                _ => return Err(io(&self.path, format!("reserving {target} bytes: {err}"))),
            }
        }
        self.file.sync_all().map_err(|e| io(&self.path, e))?;
        self.capacity = target;
        Ok(())
    }
}

/// Encode `value` (postcard) at the end of `buf`: the payload of an
/// [`Wal::append_with`] record.
pub fn encode_into<T: serde::Serialize + ?Sized>(value: &T, buf: &mut Vec<u8>) -> StoreResult<()> {
    postcard::serialize_with_flavor(value, ExtendVec(buf))
        .map_err(|e| StoreError::Io(format!("encoding a log record: {e}")))
}

/// A postcard output appending to a borrowed buffer.
struct ExtendVec<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for ExtendVec<'_> {
    type Output = ();

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// What is at `off`: nothing (end of data, or zeros), a valid record (sequence number,
/// payload, next offset), or anything else.
enum At<'a> {
    End,
    Valid(u64, &'a [u8], usize),
    Invalid,
}

fn record_at(data: &[u8], off: usize) -> At<'_> {
    let Some(header) = data.get(off..off + HEADER) else {
        return At::End;
    };
    if header.iter().all(|b| *b == 0) {
        return At::End;
    }
    let word =
        |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
    let (len, crc) = (word(0) as usize, word(4));
    let seq = seq_at(header, 8);
    let start = off + HEADER;
    match (len <= MAX_RECORD)
        .then(|| data.get(start..start + len))
        .flatten()
    {
        Some(payload) if checksum(seq, payload) == crc => {
            At::Valid(seq, payload, (start + len).next_multiple_of(ALIGN))
        }
        _ => At::Invalid,
    }
}

fn seq_at(data: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&data[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The records of the chain from the start of `data` newer than `held`, and the chain's
/// last sequence number (0: empty). See the module docs.
fn parse(data: &[u8], path: &Path, held: u64) -> StoreResult<(Vec<Record>, u64)> {
    let mut out = Vec::new();
    let mut last: Option<u64> = None;
    let mut off = 0;
    while let At::Valid(seq, payload, next) = record_at(data, off) {
        if last.is_some_and(|l| l + 1 != seq) {
            // A record of an earlier pass over the file.
            break;
        }
        if seq > held {
            out.push(Record {
                seq,
                payload: payload.to_vec(),
            });
        }
        last = Some(seq);
        off = next;
    }
    let floor = held.max(last.unwrap_or(0));
    if let Some((at, seq)) = newer_after(data, off, floor) {
        return Err(StoreError::Corrupt(format!(
            "{}: the log breaks off at offset {off} (after record {}) but holds the newer \
             record {seq} at offset {at}: a record in between is damaged; restore from a \
             backup",
            path.display(),
            last.unwrap_or(held)
        )));
    }
    Ok((out, last.unwrap_or(0)))
}

/// A valid record numbered above `floor` at or after `from`, if any (its offset and
/// sequence number).
fn newer_after(data: &[u8], from: usize, floor: u64) -> Option<(usize, u64)> {
    let last = data.len().checked_sub(HEADER)?;
    (from..=last).step_by(ALIGN).find_map(|off| {
        let seq = seq_at(data, off + 8);
        if seq <= floor || seq - floor > 1 << 32 {
            return None;
        }
        match record_at(data, off) {
            At::Valid(seq, _, _) => Some((off, seq)),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reopen(dir: &Path, held: u64) -> StoreResult<Vec<Record>> {
        Wal::open(dir, held).map(|(_, r)| r)
    }

    fn record_bytes(seq: u64, payload: &[u8]) -> Vec<u8> {
        let mut rec = Vec::new();
        rec.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        rec.extend_from_slice(&checksum(seq, payload).to_le_bytes());
        rec.extend_from_slice(&seq.to_le_bytes());
        rec.extend_from_slice(payload);
        rec
    }

    #[test]
    fn records_come_back_in_order_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, recs) = Wal::open(dir.path(), 0).unwrap();
        assert!(recs.is_empty());
        for i in 0..100u32 {
            assert_eq!(wal.append(&i.to_le_bytes()).unwrap(), u64::from(i) + 1);
        }
        drop(wal);
        let recs = reopen(dir.path(), 0).unwrap();
        assert_eq!(recs.len(), 100);
        assert_eq!(recs[41].payload, 41u32.to_le_bytes());
        // Only what the state file does not hold yet.
        let recs = reopen(dir.path(), 90).unwrap();
        assert_eq!(recs.first().map(|r| r.seq), Some(91));
        let (wal, _) = Wal::open(dir.path(), 0).unwrap();
        assert_eq!(wal.next_seq, 101);
        let (wal, _) = Wal::open(dir.path(), 500).unwrap();
        assert_eq!(
            wal.next_seq, 501,
            "numbers the state file used are never reused"
        );
    }

    #[test]
    fn a_restarted_log_ends_where_the_older_pass_begins() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 0).unwrap();
        for _ in 0..10 {
            wal.append(&[7u8; 100]).unwrap();
        }
        // Checkpointed through record 10; shorter records over the first pass's.
        wal.restart();
        for _ in 0..3 {
            wal.append(&[9u8; 10]).unwrap();
        }
        drop(wal);
        let recs = reopen(dir.path(), 10).unwrap();
        assert_eq!(
            recs.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![11, 12, 13]
        );
        assert!(recs.iter().all(|r| r.payload == [9u8; 10]));
    }

    #[test]
    fn records_built_in_the_reused_buffer_come_back_exactly() {
        // A large record, then smaller ones in the same (kept) buffer, then one built by
        // an encoder that fails: nothing of an earlier record may leak into a later one,
        // and a failed encode writes nothing and uses no sequence number.
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 0).unwrap();
        let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(wal.append(&big).unwrap(), 1);
        assert_eq!(wal.append(&[7u8; 3]).unwrap(), 2);
        let failed = wal.append_with(|buf| {
            buf.extend_from_slice(&[1, 2, 3]);
            Err(StoreError::Io("encoder failed".into()))
        });
        assert!(failed.is_err());
        assert_eq!(
            wal.append_with(|buf| encode_into(&(5u32, "five"), buf))
                .unwrap(),
            3
        );
        drop(wal);
        let recs = reopen(dir.path(), 0).unwrap();
        assert_eq!(
            recs.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(recs[0].payload, big);
        assert_eq!(recs[1].payload, vec![7u8; 3]);
        assert_eq!(
            postcard::from_bytes::<(u32, String)>(&recs[2].payload).unwrap(),
            (5, "five".to_string())
        );
    }

    #[test]
    fn a_torn_last_record_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 0).unwrap();
        for _ in 0..3 {
            wal.append(&[1u8; 64]).unwrap();
        }
        // The fourth write torn half-way: its header and part of its payload.
        let mut rec = record_bytes(4, &[2u8; 64]);
        rec.truncate(HEADER + 20);
        wal.file.write_all_at(&rec, wal.offset).unwrap();
        drop(wal);
        assert_eq!(reopen(dir.path(), 0).unwrap().len(), 3);
    }

    #[test]
    fn a_torn_first_record_of_a_new_pass_is_not_damage() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 0).unwrap();
        for _ in 0..5 {
            wal.append(&[1u8; 100]).unwrap();
        }
        // Checkpointed through 5; the new pass's first write (record 6) lands only in
        // part at offset 0: the old record 1 there is broken, old 2.. follow intact.
        wal.restart();
        wal.file.write_all_at(&[0xAB; 40], 60).unwrap();
        drop(wal);
        assert!(reopen(dir.path(), 5).unwrap().is_empty());
        let (wal, _) = Wal::open(dir.path(), 5).unwrap();
        assert_eq!(wal.next_seq, 6);
    }

    #[test]
    fn damage_inside_the_log_stops_start_up_naming_the_file() {
        for what in ["payload", "length", "zeroed header"] {
            let dir = tempfile::tempdir().unwrap();
            let (mut wal, _) = Wal::open(dir.path(), 0).unwrap();
            for _ in 0..3 {
                wal.append(&[5u8; 32]).unwrap();
            }
            // The second record starts at 48 (16 + 32).
            match what {
                "payload" => wal
                    .file
                    .write_all_at(&[6u8], 48 + HEADER as u64 + 3)
                    .unwrap(),
                "length" => wal
                    .file
                    .write_all_at(&[0xFF, 0xFF, 0xFF, 0x7F], 48)
                    .unwrap(),
                _ => wal.file.write_all_at(&[0u8; HEADER], 48).unwrap(),
            }
            drop(wal);
            let err = reopen(dir.path(), 0).expect_err("corruption must be reported");
            let msg = err.to_string();
            assert!(
                msg.contains("wal.log") && msg.contains("damaged"),
                "{what}: {msg}"
            );
            // Once the state file holds all of it, nothing is lost: no error.
            assert!(reopen(dir.path(), 3).unwrap().is_empty(), "{what}");
        }
    }

    #[test]
    fn a_record_past_the_reserved_space_grows_it_and_shrink_gives_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 0).unwrap();
        let big = vec![3u8; (CHUNK + 10) as usize];
        wal.append(&big).unwrap();
        wal.append(b"after").unwrap();
        drop(wal);
        let recs = reopen(dir.path(), 0).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].payload.len(), big.len());
        assert_eq!(recs[1].payload, b"after");
        let (mut wal, _) = Wal::open(dir.path(), 2).unwrap();
        wal.shrink().unwrap();
        assert_eq!(
            std::fs::metadata(dir.path().join(WAL_FILE)).unwrap().len(),
            CHUNK
        );
        assert_eq!(wal.append(b"next").unwrap(), 3);
    }
}
