//! The live tail: a per-allocation ring of the most recent lines, bounded in bytes.

use std::collections::VecDeque;
use std::sync::Arc;

use super::LogLine;

/// Recent lines of one allocation, oldest first, at most `capacity` bytes (the newest
/// line is always kept, however long).
#[derive(Debug)]
pub struct RingBuffer {
    lines: VecDeque<Arc<LogLine>>,
    bytes: usize,
    capacity: usize,
}

impl RingBuffer {
    /// An empty ring holding up to `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        Self {
            lines: VecDeque::new(),
            bytes: 0,
            capacity,
        }
    }

    /// Lines held.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Bytes held (data plus per-line overhead).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Sequence number of the oldest line held.
    pub fn first_seq(&self) -> Option<u64> {
        self.lines.front().map(|l| l.seq)
    }

    /// The highest sequence number that pushing a line of `cost` bytes would evict.
    pub fn would_evict(&self, cost: usize) -> Option<u64> {
        let mut over = (self.bytes + cost).saturating_sub(self.capacity);
        let mut last = None;
        for l in &self.lines {
            if over == 0 {
                break;
            }
            over = over.saturating_sub(l.cost());
            last = Some(l.seq);
        }
        last
    }

    /// Add the newest line (sequence numbers must grow), evicting the oldest as needed.
    pub fn push(&mut self, line: Arc<LogLine>) {
        self.bytes += line.cost();
        self.lines.push_back(line);
        while self.bytes > self.capacity && self.lines.len() > 1 {
            if let Some(old) = self.lines.pop_front() {
                self.bytes -= old.cost();
            }
        }
    }

    /// The lines with `seq >= from`, oldest first.
    pub fn since(&self, from: u64) -> impl Iterator<Item = &Arc<LogLine>> {
        let start = self.lines.partition_point(|l| l.seq < from);
        self.lines.range(start..)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Stream;
    use super::*;

    fn line(seq: u64, len: usize) -> Arc<LogLine> {
        Arc::new(LogLine {
            seq,
            stream: Stream::Stdout,
            time: chrono::Utc::now(),
            newline: true,
            data: vec![b'a'; len],
        })
    }

    #[test]
    fn bounded_by_bytes_and_keeps_the_newest() {
        let cost = line(0, 100).cost();
        let mut r = RingBuffer::new(cost * 3);
        for s in 0..3 {
            r.push(line(s, 100));
        }
        assert_eq!(r.len(), 3);
        assert_eq!(r.would_evict(cost), Some(0));
        assert_eq!(r.would_evict(cost * 2), Some(1));
        r.push(line(3, 100));
        assert_eq!(r.len(), 3);
        assert_eq!(r.first_seq(), Some(1));
        assert_eq!(r.bytes(), cost * 3);
        let seqs: Vec<u64> = r.since(2).map(|l| l.seq).collect();
        assert_eq!(seqs, vec![2, 3]);
        assert_eq!(r.since(99).count(), 0);
        // One huge line replaces everything but is kept.
        r.push(line(4, 10_000));
        assert_eq!(r.len(), 1);
        assert_eq!(r.first_seq(), Some(4));
    }
}
