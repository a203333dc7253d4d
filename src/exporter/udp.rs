//! The log socket: datagrams in, counted one by one, and the kernel's count of those it
//! dropped because the socket's buffer was full.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::metrics::ProxyMetrics;

/// The longest line read whole; a longer one is cut, fails to parse and is counted as skipped.
/// nginx's syslog lines are shorter (its own limit is 2 KiB of message).
const MAX_DATAGRAM: usize = 4096;

/// While lines keep coming, how long they are left to queue between two reads of the socket:
/// one wake-up then reads a batch instead of one line. Waking for every session cost the
/// sidecar more in task switches than its counting (an async socket wakes its thread for
/// every datagram, even while nobody waits for it, so the reading is a blocking thread's). At
/// 10,000 sessions a second about 50 lines queue meanwhile, a quarter of what the socket's
/// default buffer holds.
const GATHER: Duration = Duration::from_millis(5);

/// The sidecar is a native sidecar: its SIGTERM comes once nginx has exited, so the last
/// session's line has already been sent. After SIGTERM it keeps serving for at least this long,
/// so that a scrape can read the last count; then it waits for [`QUIET`].
const LAST_SCRAPE: Duration = Duration::from_secs(5);

/// After [`LAST_SCRAPE`], the sidecar stops once no line has come for this long (or when its
/// drain time is over). Also the socket's read timeout: how long a wait for a line lasts before
/// the stop is checked.
pub(super) const QUIET: Duration = Duration::from_secs(2);

/// The most lines read in a row before the stop is checked again.
const BATCH: usize = 4096;

/// Counts every datagram until `stop`, then until [`drained`]; blocks its thread.
pub(super) fn receive(socket: UdpSocket, metrics: &ProxyMetrics, stop: &CancellationToken, drain: Duration) {
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    let mut stopped_at: Option<Instant> = None;
    let mut last_line = Instant::now();
    loop {
        // Wait for a line; then, while lines keep coming, read them in batches.
        match socket.recv(&mut buffer) {
            Ok(n) => {
                metrics.record(buffer.get(..n).unwrap_or_default());
                last_line = Instant::now();
                while !stop.is_cancelled() {
                    std::thread::sleep(GATHER);
                    if read_queued(&socket, &mut buffer, metrics) == 0 {
                        break;
                    }
                    last_line = Instant::now();
                }
            }
            // The read timed out, or the socket was left non-blocking: sleep rather than spin.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                std::thread::sleep(GATHER);
            }
            Err(e) => {
                tracing::debug!(error = %e, "log socket");
                std::thread::sleep(GATHER);
            }
        }
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

/// Counts the lines queued on the socket (up to [`BATCH`]), without waiting; returns how many.
fn read_queued(socket: &UdpSocket, buffer: &mut [u8], metrics: &ProxyMetrics) -> usize {
    if socket.set_nonblocking(true).is_err() {
        return 0;
    }
    let mut read = 0;
    while read < BATCH {
        match socket.recv(buffer) {
            Ok(n) => {
                metrics.record(buffer.get(..n).unwrap_or_default());
                read += 1;
            }
            Err(e) => {
                if e.kind() != std::io::ErrorKind::WouldBlock {
                    tracing::debug!(error = %e, "log socket");
                }
                break;
            }
        }
    }
    let _ = socket.set_nonblocking(false);
    read
}

/// Whether a stopping sidecar may go: the drain time is over, or a last scrape has had its
/// time and no line has come for [`QUIET`].
pub(super) fn drained(since_stop: Duration, since_last_line: Duration, drain: Duration) -> bool {
    since_stop >= drain || (since_stop >= LAST_SCRAPE.min(drain) && since_last_line >= QUIET)
}

/// The most of `/proc/net/udp` read: one line per UDP socket of the pod.
const MAX_SOCKET_TABLE: u64 = 8 << 20;

/// The kernel's drop count for the socket bound to 127.0.0.1:`port` in this network namespace
/// (the pod's), from `/proc/net/udp`; `None` when it cannot be read.
pub(super) fn drops(port: u16) -> Option<u64> {
    use std::io::Read;
    let mut table = String::new();
    std::fs::File::open("/proc/net/udp").ok()?.take(MAX_SOCKET_TABLE).read_to_string(&mut table).ok()?;
    drops_in(&table, port)
}

/// Reads `/proc/net/udp`: the `drops` column of the socket whose local address is 127.0.0.1:`port`.
fn drops_in(table: &str, port: u16) -> Option<u64> {
    // The kernel prints the address as the in-memory (network order) u32, in hex.
    let local = format!("{:08X}:{port:04X}", u32::from_ne_bytes([127, 0, 0, 1]));
    table.lines().skip(1).find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.nth(1)? == local).then(|| line.split_whitespace().last()?.parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_log_sockets_drops_are_read_from_the_socket_table() {
        let local = format!("{:08X}", u32::from_ne_bytes([127, 0, 0, 1]));
        let table = format!(
            "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
             \x20 12: 00000000:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000   101        0 1 2 0000000000000000 9\n\
             \x20 98: {local}:158A 00000000:0000 07 00000000:00000000 00:00000000 00000000   101        0 2 2 0000000000000000 17\n"
        );
        assert_eq!(drops_in(&table, 5514), Some(17));
        assert_eq!(drops_in(&table, 53), None, "only the loopback socket");
        assert_eq!(drops_in("garbage", 5514), None);
    }
}
