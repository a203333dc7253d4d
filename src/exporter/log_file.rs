//! The access log file: the lines nginx appends, counted as they come and then freed (a hole
//! punched over them), so that the file holds only what is still unread and never needs
//! rotating. See [`access_log`](crate::proxy::access_log) for why a file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::fs::{FallocateFlags, SeekFrom};
use tokio_util::sync::CancellationToken;

use super::metrics::ProxyMetrics;

/// The longest line counted; a longer one is skipped as malformed. nginx's lines are far
/// shorter: a Balancer has at most `MAX_BACKENDS` servers to try.
const MAX_LINE: usize = 4096;

/// How much is read at once.
const CHUNK: usize = 64 * 1024;

/// The most chunks read in a row before the read part is freed and the stop checked again.
const BATCH: usize = 64;

/// How long the sidecar waits when nothing new is in the file. nginx writes each worker's
/// buffer at least every second, so the counts trail the sessions by that and this at most;
/// reading less often than each line costs the sidecar one wake-up per interval, not per session.
const POLL: Duration = Duration::from_millis(200);

/// The sidecar is a native sidecar: its SIGTERM comes once nginx has exited, and nginx's
/// workers write what they hold as they exit. After SIGTERM it keeps serving for at least this
/// long, so that a scrape can read the last count; then it waits for [`QUIET`].
const LAST_SCRAPE: Duration = Duration::from_secs(5);

/// After [`LAST_SCRAPE`], the sidecar stops once no line has come for this long (or when its
/// drain time is over).
const QUIET: Duration = Duration::from_secs(2);

/// The log as read so far.
pub(super) struct LogFile {
    file: File,
    /// Where the next read starts.
    read_to: u64,
    /// The line being gathered: it began `line.len()` bytes before `read_to`.
    line: Vec<u8>,
    /// Whether the line being gathered is over [`MAX_LINE`] (and only its end is awaited).
    overlong: bool,
    /// Everything before this offset is freed.
    freed: u64,
    /// Whether the file system frees a range (tmpfs, ext4, xfs and btrfs do). If not, the file
    /// grows until its volume is full.
    can_free: bool,
    chunk: Vec<u8>,
}

impl LogFile {
    /// Opens the log at `path`, creating it when nginx has not yet, at its first unread line:
    /// after what an earlier sidecar of the pod freed, so that the lines nginx wrote while that
    /// one was gone are counted.
    pub(super) fn open(path: &Path) -> io::Result<LogFile> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let start = match rustix::fs::seek(&file, SeekFrom::Data(0)) {
            Ok(offset) => offset,
            // Holes only: everything in it was read.
            Err(rustix::io::Errno::NXIO) => file.metadata()?.len(),
            Err(_) => 0,
        };
        Ok(LogFile {
            file,
            read_to: start,
            line: Vec::new(),
            overlong: false,
            freed: 0,
            can_free: true,
            chunk: vec![0; CHUNK],
        })
    }

    /// Hands each whole line nginx has appended since the last call to `count` (an overlong
    /// one as an empty line, which is malformed), then frees what it has read; returns how
    /// many lines there were.
    pub(super) fn read_lines(&mut self, mut count: impl FnMut(&[u8])) -> io::Result<usize> {
        let mut lines = 0;
        for _ in 0..BATCH {
            let n = self.file.read_at(&mut self.chunk, self.read_to)?;
            self.read_to += n as u64;
            let chunk = self.chunk.get(..n).unwrap_or_default();
            for piece in chunk.split_inclusive(|b| *b == b'\n') {
                let (mut piece, ends) = match piece.strip_suffix(b"\n") {
                    Some(piece) => (piece, true),
                    None => (piece, false),
                };
                if self.line.is_empty() && !self.overlong {
                    piece = without_freed_bytes(piece);
                }
                if self.line.len() + piece.len() > MAX_LINE {
                    self.overlong = true;
                    self.line.clear();
                }
                if !self.overlong {
                    self.line.extend_from_slice(piece);
                }
                if ends {
                    count(&self.line);
                    self.line.clear();
                    self.overlong = false;
                    lines += 1;
                }
            }
            if n < CHUNK {
                break;
            }
        }
        self.free();
        Ok(lines)
    }

    /// Bytes nginx has written that are not counted yet.
    pub(super) fn unread(&self) -> u64 {
        let size = self.file.metadata().map(|m| m.len()).unwrap_or(self.read_to);
        size.saturating_sub(self.counted())
    }

    /// Where the line being gathered begins: everything before it is counted.
    fn counted(&self) -> u64 {
        self.read_to.saturating_sub(self.line.len() as u64)
    }

    /// Frees what is counted, so that the file's volume holds only what is not.
    fn free(&mut self) {
        let counted = self.counted();
        if !self.can_free || counted <= self.freed {
            return;
        }
        match rustix::fs::fallocate(&self.file, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, 0, counted) {
            Ok(()) => self.freed = counted,
            Err(e) => {
                tracing::warn!(error = %e, "cannot free what was read of the access log: it grows until its volume is full");
                self.can_free = false;
            }
        }
    }
}

/// The start of a line without the zero bytes before it where it begins in the page in which an
/// earlier sidecar freed the file: a hole reads back as zeros, and each ends where a line begins.
fn without_freed_bytes(line: &[u8]) -> &[u8] {
    let start = line.iter().position(|b| *b != 0).unwrap_or(line.len());
    line.get(start..).unwrap_or_default()
}

/// Counts every line until `stop`, then until [`drained`]; blocks its thread.
pub(super) fn follow(mut log: LogFile, metrics: &ProxyMetrics, stop: &CancellationToken, drain: Duration) {
    let mut stopped_at: Option<Instant> = None;
    let mut last_line = Instant::now();
    loop {
        match log.read_lines(|line| metrics.record(line)) {
            Ok(0) => std::thread::sleep(POLL),
            Ok(_) => last_line = Instant::now(),
            Err(e) => {
                tracing::debug!(error = %e, "access log");
                std::thread::sleep(POLL);
            }
        }
        metrics.set_unread(log.unread());
        if stop.is_cancelled() && stopped_at.is_none() {
            tracing::info!(drain = ?drain, "stopping: counting the proxy's draining sessions first");
            stopped_at = Some(Instant::now());
        }
        if let Some(at) = stopped_at
            && drained(at.elapsed(), last_line.elapsed(), drain)
        {
            return;
        }
    }
}

/// Whether a stopping sidecar may go: the drain time is over, or a last scrape has had its
/// time and no line has come for [`QUIET`].
fn drained(since_stop: Duration, since_last_line: Duration, drain: Duration) -> bool {
    since_stop >= drain || (since_stop >= LAST_SCRAPE.min(drain) && since_last_line >= QUIET)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_stopping_sidecar_serves_a_last_scrape_then_stops_once_quiet() {
        let drain = Duration::from_secs(10);
        let s = Duration::from_secs;
        assert!(!drained(s(1), s(10), drain), "a last scrape may still come");
        assert!(!drained(s(6), s(1), drain), "lines still come");
        assert!(drained(s(6), s(2), drain));
        assert!(drained(s(10), s(0), drain), "the drain is over");
        assert!(drained(s(0), s(5), Duration::ZERO), "no drain asked for");
    }

    fn appender(path: &Path) -> File {
        OpenOptions::new().append(true).create(true).open(path).unwrap()
    }

    fn read_all(log: &mut LogFile) -> Vec<String> {
        let mut lines = Vec::new();
        log.read_lines(|line| lines.push(String::from_utf8_lossy(line).into_owned())).unwrap();
        lines
    }

    /// Blocks the file system holds for the file (its holes hold none).
    fn allocated(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().blocks() * 512
    }

    #[test]
    fn lines_are_counted_whole_as_they_come_and_the_counted_part_is_freed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let mut log = LogFile::open(&path).unwrap();
        let mut nginx = appender(&path);
        assert!(read_all(&mut log).is_empty(), "nothing yet");
        nginx.write_all(b"one\ntw").unwrap();
        assert_eq!(read_all(&mut log), ["one"]);
        assert_eq!(log.unread(), 2, "the line being written is not counted yet");
        nginx.write_all(b"o\nthree\n").unwrap();
        assert_eq!(read_all(&mut log), ["two", "three"]);
        assert_eq!(log.unread(), 0);
        // A megabyte of lines in writes of nginx's buffer size: what is counted takes no space.
        let line = format!("{}\n", "x".repeat(99));
        for _ in 0..160 {
            nginx.write_all(line.repeat(64).as_bytes()).unwrap();
        }
        assert_eq!(read_all(&mut log).len(), 160 * 64);
        let size = std::fs::metadata(&path).unwrap().len();
        assert_eq!(size, 14 + 160 * 64 * 100);
        assert!(allocated(&path) <= 8192, "{} bytes still allocated of {size}", allocated(&path));
    }

    #[test]
    fn an_overlong_line_is_handed_on_as_an_empty_one_and_the_next_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let mut log = LogFile::open(&path).unwrap();
        let mut nginx = appender(&path);
        nginx.write_all("y".repeat(MAX_LINE + 1).as_bytes()).unwrap();
        assert!(read_all(&mut log).is_empty());
        nginx.write_all(b"yyy\nnext\n").unwrap();
        assert_eq!(read_all(&mut log), ["", "next"]);
        assert!(log.line.capacity() <= 2 * MAX_LINE, "bounded: {}", log.line.capacity());
    }

    #[test]
    fn a_new_sidecar_starts_at_the_first_line_the_last_one_had_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let mut nginx = appender(&path);
        let counted = format!("{}\n", "c".repeat(999));
        nginx.write_all(counted.repeat(10).as_bytes()).unwrap();
        let mut first = LogFile::open(&path).unwrap();
        assert_eq!(read_all(&mut first).len(), 10);
        drop(first);
        // Longer than a line may be, with the zeros before it in its page (the first sidecar
        // freed up to 10,000 bytes): the zeros are not part of it.
        let while_gone = "g".repeat(MAX_LINE - 100);
        nginx.write_all(format!("{while_gone}\n").as_bytes()).unwrap();
        let mut second = LogFile::open(&path).unwrap();
        assert_eq!(read_all(&mut second), [while_gone]);
        // With nothing unread, it starts at the end.
        let mut third = LogFile::open(&path).unwrap();
        assert!(read_all(&mut third).is_empty());
        nginx.write_all(b"new\n").unwrap();
        assert_eq!(read_all(&mut third), ["new"]);
    }
}
