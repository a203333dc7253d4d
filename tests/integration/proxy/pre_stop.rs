//! The proxy's `preStop` wait under the real `/bin/sh`, reading a copy of this host's
//! `/proc/net/snmp` whose accepted-connection count the test moves: it waits its minimum on a
//! quiet pod, on while connections keep coming, and never past its maximum.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use balancer::proxy::stop::{StopWait, TCP_COUNTERS, pre_stop_command};

/// Short enough for a test, with the proxy's proportions: the minimum outlasts the quiet seconds.
const WAIT: StopWait = StopWait { min: 3, quiet: 2, max: 10 };

/// This host's counters with `Tcp: PassiveOpens` set to `opens`: the kernel's own layout.
fn counters(opens: u64) -> String {
    let real = std::fs::read_to_string(TCP_COUNTERS).expect("this host's /proc/net/snmp");
    let mut header: Vec<String> = Vec::new();
    real.lines()
        .map(|line| {
            let fields: Vec<String> = line.split(' ').map(String::from).collect();
            if fields.first().map(String::as_str) != Some("Tcp:") {
                return line.to_string();
            }
            if header.is_empty() {
                header = fields;
                return line.to_string();
            }
            let column = header.iter().position(|f| f == "PassiveOpens").expect("a PassiveOpens column");
            let mut values = fields;
            values[column] = opens.to_string();
            values.join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes the counters as the kernel shows them: whole, never half.
fn set_opens(file: &Path, opens: u64) {
    let next = file.with_extension("next");
    std::fs::write(&next, counters(opens)).expect("the counters");
    std::fs::rename(next, file).expect("renamed into place");
}

/// Runs the hook on `file` while `connections` moves the count; returns its exit code and how
/// long it waited.
fn run_hook(file: &Path, connections: impl FnOnce(&AtomicBool) + Send + 'static) -> (Option<i32>, Duration) {
    let done = Arc::new(AtomicBool::new(false));
    let mover = {
        let done = done.clone();
        std::thread::spawn(move || connections(&done))
    };
    let started = Instant::now();
    let command = pre_stop_command(&file.display().to_string(), WAIT);
    let status = Command::new(&command[0]).args(&command[1..]).status().expect("/bin/sh runs");
    let waited = started.elapsed();
    done.store(true, Ordering::Relaxed);
    mover.join().expect("the counter thread");
    (status.code(), waited)
}

/// Raises the count by `step` every `every` until `busy_for` has passed or the hook returned,
/// starting half a second in (between two of the hook's reads, which come once a second).
fn arrivals(file: &Path, step: u64, every: Duration, busy_for: Duration) -> impl FnOnce(&AtomicBool) + Send + 'static {
    let file = file.to_path_buf();
    move |done: &AtomicBool| {
        std::thread::sleep(Duration::from_millis(500));
        let started = Instant::now();
        let mut opens = 1000;
        while !done.load(Ordering::Relaxed) && started.elapsed() < busy_for {
            opens += step;
            set_opens(&file, opens);
            std::thread::sleep(every);
        }
    }
}

fn counters_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("snmp");
    set_opens(&file, 1000);
    (dir, file)
}

/// Its quiet seconds pass first: the minimum is what it waits.
#[test]
fn a_quiet_pod_waits_its_minimum() {
    let (_dir, file) = counters_file();
    let (code, waited) = run_hook(&file, |_| {});
    assert_eq!(code, Some(0));
    let min = Duration::from_secs(WAIT.min.into());
    assert!(waited >= min && waited < min + Duration::from_millis(1500), "waited {waited:?}");
}

/// The kubelet's readiness probe goes on during termination: one connection a second (five
/// times its rate) is still quiet.
#[test]
fn one_connection_a_second_is_quiet() {
    let (_dir, file) = counters_file();
    let (code, waited) = run_hook(&file, arrivals(&file, 1, Duration::from_secs(1), Duration::from_secs(60)));
    assert_eq!(code, Some(0));
    assert!(waited < Duration::from_secs(WAIT.min.into()) + Duration::from_millis(1500), "waited {waited:?}");
}

/// kube-proxy still sends new connections (as after an API server outage): the pod serves on
/// until they stop, then for its quiet seconds.
#[test]
fn a_pod_still_reached_waits_until_the_connections_stop() {
    let (_dir, file) = counters_file();
    let busy = Duration::from_secs(4);
    let (code, waited) = run_hook(&file, arrivals(&file, 20, Duration::from_millis(100), busy));
    assert_eq!(code, Some(0));
    let at_least = busy + Duration::from_secs(WAIT.quiet.into());
    let at_most = Duration::from_secs(WAIT.max.into()) - Duration::from_millis(500);
    assert!(waited >= at_least && waited < at_most, "waited {waited:?}");
}

#[test]
fn a_pod_reached_without_end_stops_waiting_at_its_maximum() {
    let (_dir, file) = counters_file();
    let (code, waited) = run_hook(&file, arrivals(&file, 20, Duration::from_millis(100), Duration::from_secs(60)));
    assert_eq!(code, Some(0));
    let max = Duration::from_secs(WAIT.max.into());
    assert!(waited >= max && waited < max + Duration::from_millis(1500), "waited {waited:?}");
}

/// A kernel without the file (or a container that cannot read it) still stops after the minimum.
#[test]
fn without_counters_the_pod_waits_as_a_quiet_one() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (code, waited) = run_hook(&dir.path().join("missing"), |_| {});
    assert_eq!(code, Some(0));
    let min = Duration::from_secs(WAIT.min.into());
    assert!(waited >= min && waited < min + Duration::from_millis(1500), "waited {waited:?}");
}
