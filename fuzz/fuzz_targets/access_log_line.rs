//! A line of nginx's access log, as the metrics sidecar reads it (clients and backends shape
//! parts of it): a session or a reason to skip the line, never a panic.
#![no_main]

use balancer::proxy::access_log::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|line: &[u8]| {
    if let Ok(line) = std::str::from_utf8(line) {
        let _ = parse(line);
    }
});
