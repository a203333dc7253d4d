//! Ports for the processes a test starts (nginx, etcd, the API server, the operator) to listen on.

use std::net::{TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};

/// Where handed-out ports start.
const LOWEST: u32 = 10_000;

/// A port free for TCP and UDP on every address, below the kernel's ephemeral range.
///
/// A port the kernel chose (`bind` to port 0) and the test released can become another test's
/// client port before the process it was meant for binds it (`bind() ... Address already in
/// use`). Below the ephemeral range the kernel hands out none; one counter keeps this binary's
/// tests apart, and each binary starts at its own offset.
pub fn listen_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = first_ephemeral().max(LOWEST + 1_000) - LOWEST;
    let start = std::process::id().wrapping_mul(97);
    (0..span)
        .map(|_| LOWEST + start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % span)
        .filter_map(|port| u16::try_from(port).ok())
        .find(|&port| TcpListener::bind(("0.0.0.0", port)).is_ok() && UdpSocket::bind(("0.0.0.0", port)).is_ok())
        .expect("a port below the ephemeral range free for TCP and UDP")
}

/// `N` distinct ports as [`listen_port`] gives them.
pub fn listen_ports<const N: usize>() -> [u16; N] {
    std::array::from_fn(|_| listen_port())
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`).
fn first_ephemeral() -> u32 {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    range.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(32_768)
}
