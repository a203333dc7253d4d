//! The pure builders of what a Balancer owns, the proxy container's entrypoints and its stop hook.

mod builders;
mod entrypoint;
mod pre_stop;
mod reload;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// A proxy container's entrypoint under the real `/bin/sh`, in a directory of its own that holds
/// a stand-in `nginx` (first on its PATH) and the files the entrypoint reads and writes; what the
/// stand-in records goes to `events`.
struct Entrypoint {
    dir: TempDir,
    process: Child,
}

impl Entrypoint {
    /// A directory with the stand-in `nginx` written from `script`, a stale pid file, and the
    /// IPv6 probe when `ipv6`.
    fn prepare(script: &str, ipv6: bool) -> TempDir {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let fake = dir.path().join("nginx");
        std::fs::write(&fake, script).expect("the stand-in nginx");
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("executable");
        std::fs::write(dir.path().join("nginx.pid"), "12345").expect("a stale pid file");
        if ipv6 {
            std::fs::write(dir.path().join("if_inet6"), "").expect("the IPv6 probe");
        }
        dir
    }

    /// `file` in the directory, as a path the script is given.
    fn path(&self, file: &str) -> String {
        path(self.dir.path(), file)
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(file)).unwrap_or_default()
    }

    /// What the stand-in nginx recorded, one event a line.
    fn events(&self) -> String {
        self.read("events")
    }

    /// How many events start with `event`.
    fn count(&self, event: &str) -> usize {
        self.events().lines().filter(|l| l.starts_with(event)).count()
    }

    /// Whether `done` held within `timeout`.
    fn within(&self, timeout: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if done(self) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Whether `event` was recorded within `timeout`.
    fn saw(&self, event: &str, timeout: Duration) -> bool {
        self.within(timeout, |entrypoint| entrypoint.events().contains(event))
    }

    /// Sends `signal` (`-TERM`, …) to the process `pid`.
    fn signal(&self, signal: &str, pid: &str) {
        let status = Command::new("kill").args([signal, pid]).status().expect("kill runs");
        assert!(status.success());
    }

    /// SIGTERM, as the kubelet stops the container.
    fn terminate(&self) {
        self.signal("-TERM", &self.process.id().to_string());
    }

    /// The entrypoint's exit code and stderr, waiting at most `timeout`; past it, the entrypoint
    /// is killed and the test fails with what the stand-in nginx recorded.
    fn exit(mut self, timeout: Duration) -> (Option<i32>, String) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.process.try_wait().expect("wait") {
                let mut stderr = String::new();
                if let Some(mut pipe) = self.process.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
                }
                return (status.code(), stderr);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.process.kill();
        panic!("the entrypoint did not exit within {timeout:?}; events: {}", self.events());
    }
}

impl Drop for Entrypoint {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        // The stand-in nginx of a test that failed half-way, and its workers.
        if let Ok(pid) = self.read("nginx.pid").trim().parse::<u32>() {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).stderr(Stdio::null()).status();
        }
        let _ = Command::new("pkill").args(["-f", &self.path("nginx")]).status();
    }
}

/// `file` in `dir`, as a path a script is given.
fn path(dir: &Path, file: &str) -> String {
    PathBuf::from(dir).join(file).display().to_string()
}
