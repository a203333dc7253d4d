//! Finding Debian's nginx and its stream module, and running it on a rendered file.

use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use balancer::proxy::nginx;
use tempfile::TempDir;

use crate::NGINX_DEADLINE;
use crate::support::ports::listen_port;

/// An nginx binary that can run the rendered config.
pub(crate) struct NginxBinary {
    /// The stream module to `load_module`, when it is dynamic (Debian, Ubuntu, Fedora).
    pub(crate) stream_module: Option<PathBuf>,
}

/// The usable nginx, or `None` (loudly) outside CI; panics in CI when it is missing or unusable.
pub(crate) fn nginx_binary() -> Option<NginxBinary> {
    if !crate::support::have_tool("nginx") {
        return None;
    }
    let out = Command::new("nginx").arg("-V").output().expect("nginx -V runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    let version = text
        .split("nginx/")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .map(|v| v.split('.').map(|n| n.parse::<u32>().unwrap_or(0)).collect::<Vec<_>>())
        .unwrap_or_default();
    // `-e` (error log on the command line, as the proxy pods use it) arrived in nginx 1.19.5.
    if version < vec![1, 19, 5] {
        return unusable(&format!("nginx >= 1.19.5 is required (for -e), found {version:?}"));
    }
    let args: Vec<&str> = text.split_whitespace().collect();
    if args.contains(&"--with-stream") {
        return Some(NginxBinary { stream_module: None });
    }
    if !args.contains(&"--with-stream=dynamic") {
        return unusable("nginx is built without the stream module");
    }
    let configured = |flag: &str| args.iter().find_map(|a| a.strip_prefix(flag)).map(PathBuf::from);
    let mut dirs: Vec<PathBuf> = configured("--modules-path=").into_iter().collect();
    dirs.extend(configured("--prefix=").map(|p| p.join("modules")));
    for fallback in ["/usr/lib/nginx/modules", "/usr/lib64/nginx/modules", "/etc/nginx/modules"].map(PathBuf::from) {
        if !dirs.contains(&fallback) {
            dirs.push(fallback);
        }
    }
    match dirs.iter().map(|d| d.join("ngx_stream_module.so")).find(|m| m.is_file()) {
        Some(module) => Some(NginxBinary { stream_module: Some(module) }),
        None => unusable(&format!(
            "nginx's stream module is dynamic but ngx_stream_module.so is in none of {dirs:?} \
             (Debian: apt-get install libnginx-mod-stream)"
        )),
    }
}

pub(crate) fn unusable(why: &str) -> Option<NginxBinary> {
    crate::support::skip(&format!("{why}; this test needs nginx with the stream module"));
    None
}

/// A scratch prefix holding the rendered file, the wrapper nginx reads, its log and pid file.
pub(crate) struct Prefix {
    pub(crate) dir: TempDir,
}

impl Prefix {
    pub(crate) fn new(bin: &NginxBinary, rendered: &str) -> Prefix {
        let dir = TempDir::new().expect("temp dir");
        let conf = dir.path().join(nginx::CONFIG_FILE);
        fs::write(&conf, rendered).expect("write nginx.conf");
        let mut wrapper = String::new();
        if let Some(module) = &bin.stream_module {
            wrapper.push_str(&format!("load_module {};\n", module.display()));
        }
        wrapper.push_str(&format!("include {};\n", conf.display()));
        fs::write(dir.path().join("wrapper.conf"), wrapper).expect("write wrapper");
        Prefix { dir }
    }

    pub(crate) fn path(&self, file: &str) -> String {
        self.dir.path().join(file).to_str().expect("utf-8 temp path").to_string()
    }

    /// `nginx -p <prefix> -c <wrapper> -e stderr` plus `extra` and the `-g` directives.
    pub(crate) fn command(&self, extra: &[&str], directives: &str) -> Command {
        self.command_in(None, extra, directives)
    }

    /// [`Self::command`], in the network namespace `netns` when given (`ip netns exec` execs
    /// nginx, so the child's pid is nginx's).
    pub(crate) fn command_in(&self, netns: Option<&str>, extra: &[&str], directives: &str) -> Command {
        let mut command = match netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns, "nginx"]);
                command
            }
            None => Command::new("nginx"),
        };
        command.args(extra).args(["-p", &self.path(""), "-c", &self.path("wrapper.conf"), "-e", "stderr", "-g"]);
        command.arg(format!("{directives} pid {};", self.path("nginx.pid")));
        let log = fs::File::create(self.path("stderr.log")).expect("log file");
        command.stdin(Stdio::null()).stdout(log.try_clone().expect("log file")).stderr(log);
        command
    }

    pub(crate) fn log(&self) -> String {
        fs::read_to_string(self.path("stderr.log")).unwrap_or_default()
    }
}

/// `nginx -t` on `rendered`: `Err(nginx's output)` when it rejects it.
pub(crate) fn nginx_check(bin: &NginxBinary, rendered: &str) -> Result<(), String> {
    let prefix = Prefix::new(bin, rendered);
    let mut child = prefix.command(&["-t"], "").spawn().expect("spawn nginx -t");
    let deadline = Instant::now() + NGINX_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for nginx -t") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("nginx -t did not finish in {NGINX_DEADLINE:?}\n{}", prefix.log()));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if status.success() { Ok(()) } else { Err(format!("nginx -t: {status}\n{}", prefix.log())) }
}

/// nginx in the foreground in its own process group; stopped (and its workers with it) on drop.
pub(crate) struct Nginx {
    pub(crate) child: Child,
    pub(crate) prefix: Prefix,
}

impl Nginx {
    /// Starts nginx on `rendered` and waits until its listening sockets exist:
    /// the master writes its pid file after binding them and before forking workers,
    /// so traffic sent after that waits in the sockets' queues instead of being refused.
    pub(crate) async fn start(bin: &NginxBinary, rendered: &str) -> Result<Nginx, String> {
        Nginx::start_in(None, bin, rendered).await
    }

    /// [`Self::start`] in the network namespace `netns`, when given.
    pub(crate) async fn start_in(netns: Option<&str>, bin: &NginxBinary, rendered: &str) -> Result<Nginx, String> {
        let prefix = Prefix::new(bin, rendered);
        let child = prefix.command_in(netns, &[], "daemon off;").process_group(0).spawn().expect("spawn nginx");
        let mut nginx = Nginx { child, prefix };
        let pid_file = nginx.prefix.path("nginx.pid");
        let deadline = Instant::now() + NGINX_DEADLINE;
        loop {
            if let Some(status) = nginx.child.try_wait().expect("poll nginx") {
                return Err(format!("nginx exited at startup: {status}\n{}", nginx.prefix.log()));
            }
            let written = fs::read_to_string(&pid_file).unwrap_or_default();
            if written.trim() == nginx.child.id().to_string() {
                return Ok(nginx);
            }
            if Instant::now() > deadline {
                return Err(format!("nginx did not start in {NGINX_DEADLINE:?}\n{}", nginx.prefix.log()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Worker processes (they share each upstream's state through its `zone`).
    pub(crate) fn workers(&self) -> usize {
        let master = self.child.id().to_string();
        let entries = fs::read_dir("/proc").expect("read /proc");
        entries
            .filter_map(|entry| fs::read_to_string(entry.ok()?.path().join("stat")).ok())
            // `pid (comm) state ppid ...`: the fields after the last ')'.
            .filter(|stat| stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(1)) == Some(&master))
            .count()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let pid = self.child.id();
        // SIGTERM: nginx's fast shutdown stops the workers, then the master exits.
        signal("TERM", &pid.to_string());
        let deadline = Instant::now() + NGINX_DEADLINE;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        // Whatever happened, nothing of the group (pgid = master pid) survives the test.
        signal("KILL", &format!("-{pid}"));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn signal(name: &str, target: &str) {
    let _ = Command::new("sh")
        .args(["-c", &format!("kill -s {name} -- {target} 2>/dev/null")])
        .stdin(Stdio::null())
        .status();
}

/// Renders `spec` (with `port` as its first listen port) and starts nginx on it,
/// retrying with a fresh port if another process took the one picked.
pub(crate) async fn start_nginx(bin: &NginxBinary, render: impl Fn(u16) -> String) -> (Nginx, u16) {
    let mut failures = Vec::new();
    for _ in 0..3 {
        let port = listen_port();
        match Nginx::start(bin, &render(port)).await {
            Ok(nginx) => return (nginx, port),
            Err(log) if log.contains("Address already in use") => failures.push(log),
            Err(log) => panic!("{log}\n--- rendered ---\n{}", render(port)),
        }
    }
    panic!("no free port after 3 tries:\n{}", failures.join("\n"));
}
