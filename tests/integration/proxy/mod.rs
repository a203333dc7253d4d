//! The pure builders of what a Balancer owns, the proxy container's entrypoints and its stop hook.

mod builders;
mod entrypoint;
mod pre_stop;
mod reload;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// An entrypoint's exit code and stderr, waiting at most `timeout`; past it, the entrypoint is
/// killed and the test fails with what the stand-in nginx recorded in `events`.
fn exit_of(entrypoint: &mut Child, timeout: Duration, events: &Path) -> (Option<i32>, String) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = entrypoint.try_wait().expect("wait") {
            let mut stderr = String::new();
            if let Some(mut pipe) = entrypoint.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            return (status.code(), stderr);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = entrypoint.kill();
    let recorded = std::fs::read_to_string(events).unwrap_or_default();
    panic!("the entrypoint did not exit within {timeout:?}; events: {recorded}");
}
