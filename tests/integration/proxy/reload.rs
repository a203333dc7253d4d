//! The live proxy container's entrypoint under the real `/bin/sh`, with a stand-in `nginx` on
//! its PATH that records how it was started, checked, reloaded and stopped: nginx starts on the
//! sidecar's first accepted file, a new one is checked and applied with one reload, changes
//! arriving faster than the interval are coalesced, a refused file is reported and not applied,
//! and the process contract (IPv6, SIGTERM, exit status) is the mounted entrypoint's.

use std::process::Stdio;
use std::time::{Duration, Instant};

use balancer::proxy::reload::{
    CONFIG_ID_PREFIX, LIVE_ENTRYPOINT, LiveFiles, RELOAD_POLICY, ReloadPolicy, desired_file, live_environment,
};

use super::{Entrypoint, path};

/// A stand-in nginx, in Perl. `-t` checks the `-c` file:
/// refused when it holds the word `garbage`, with the whole file in the error. Otherwise it
/// writes the `pid` of its `-g` to its pid file, runs a "worker" (a child titled as nginx's),
/// and records `started`, `quit` on SIGQUIT, and on SIGHUP `reload <first line of its -c
/// file>`, replacing its worker unless the file holds the word `unloadable` (as nginx keeps its
/// workers when it cannot load a file). It exits 3 on SIGUSR2.
const FAKE_NGINX: &str = r#"#!/usr/bin/perl
use File::Basename;
sub record { open(my $f, ">>", dirname($0) . "/events") or die; print $f "$_[0]\n"; close $f }
sub slurp { open(my $f, "<", $_[0]) or return ""; local $/; <$f> }
sub first_line { (split /\n/, slurp($_[0]))[0] }
my ($conf, $pid_file, $test);
for my $i (0 .. $#ARGV) {
  $conf = $ARGV[$i + 1] if $ARGV[$i] eq "-c";
  $pid_file = $1 if $ARGV[$i] eq "-g" && $ARGV[$i + 1] =~ /pid ([^;]+);/;
  $test = 1 if $ARGV[$i] eq "-t";
}
if ($test) {
  my $text = slurp($conf);
  record("checked @ARGV");
  if ($text =~ /garbage/) {
    print STDERR "nginx: [emerg] unknown directive \"garbage\" in $conf:2\n";
    print STDERR "nginx: configuration file $conf test failed, near:\n$text";
    exit 1;
  }
  exit 0;
}
my $master = $$;
my $worker;
sub worker {
  my $old = $worker;
  $worker = fork();
  if (!$worker) {
    $SIG{$_} = "DEFAULT" for qw(QUIT HUP USR2);
    $0 = "nginx: worker process";
    sleep 1 while getppid() == $master;
    exit 0;
  }
  kill "TERM", $old if $old;
}
$SIG{CHLD} = "IGNORE";
$SIG{QUIT} = sub { record("quit"); kill "TERM", $worker; exit 0 };
$SIG{HUP} = sub { record("reload " . first_line($conf)); worker() unless slurp($conf) =~ /unloadable/ };
$SIG{USR2} = sub { record("exit 3"); kill "TERM", $worker; exit 3 };
record("started @ARGV");
worker();
open(my $p, ">", $pid_file) or die; print $p "$$\n"; close $p;
sleep 1 while 1;
"#;

/// The live proxy container's entrypoint, as a test starts it.
type Pod = Entrypoint;

impl Entrypoint {
    /// Runs the entrypoint as the live proxy container does, on a node with IPv6.
    fn live() -> Pod {
        Pod::live_on(true, RELOAD_POLICY)
    }

    fn live_on(ipv6: bool, policy: ReloadPolicy) -> Pod {
        let dir = Entrypoint::prepare(FAKE_NGINX, ipv6);
        let at = |file| path(dir.path(), file);
        let (desired, running, candidate, pid_file) =
            (at("desired.conf"), at("running.conf"), at("candidate.conf"), at("nginx.pid"));
        let (ipv6_probe, served, rejected) = (at("if_inet6"), at("served"), at("rejected"));
        let files = LiveFiles {
            desired: &desired,
            running: &running,
            candidate: &candidate,
            pid_file: &pid_file,
            ipv6_probe: &ipv6_probe,
            served: &served,
            rejected: &rejected,
        };
        let (mut shell, tools) = crate::support::shell::shell(dir.path());
        let search = format!("{}:{tools}{}", dir.path().display(), std::env::var("PATH").unwrap_or_default());
        let directives = format!("daemon off; pid {pid_file};");
        let process = shell
            .args(["-c", LIVE_ENTRYPOINT, "nginx", "-c", &running, "-e", "stderr", "-g", &directives])
            .envs(live_environment(&files, policy))
            .env("PATH", search)
            .stderr(Stdio::piped())
            .spawn()
            .expect("/bin/sh runs");
        Entrypoint { dir, process }
    }

    /// As the sidecar does: the file written next to its place, then renamed into it.
    fn write(&self, contents: &str) {
        let next = self.dir.path().join("desired.conf.tmp");
        std::fs::write(&next, contents).expect("the new file");
        std::fs::rename(next, self.dir.path().join("desired.conf")).expect("renamed into place");
    }

    /// Writes `conf` as the desired file; returns its id line.
    fn desire(&self, conf: &str) -> String {
        let file = desired_file(conf);
        self.write(&file);
        id_line(&file)
    }
}

fn id_line(file: &str) -> String {
    file.lines().next().unwrap_or_default().to_string()
}

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn the_desired_file_begins_with_the_id_of_the_rest() {
    let file = desired_file("stream {}\n");
    let hash = balancer::proxy::nginx::config_hash("stream {}\n");
    assert_eq!(file, format!("{CONFIG_ID_PREFIX}{hash}\nstream {{}}\n"));
}

#[test]
fn nginx_waits_for_the_sidecars_first_file_and_starts_on_it() {
    let pod = Pod::live();
    assert!(!pod.saw("started", Duration::from_millis(700)), "started without a file: {}", pod.events());
    pod.write("stream { not yet }\n");
    assert!(!pod.saw("started", Duration::from_millis(700)), "started on a file without an id: {}", pod.events());
    let id = pod.desire("stream { first }\n");
    assert!(pod.saw("started", 5 * SECOND), "{}", pod.events());
    assert_eq!(pod.read("running.conf"), desired_file("stream { first }\n"));
    assert_eq!(pod.read("served"), format!("{id}\n"));
    let events = pod.events();
    assert!(events.contains(&format!("started -c {}", path(pod.dir.path(), "running.conf"))), "{events}");
    let check = format!("checked -t -q -e stderr -g pid {};", path(pod.dir.path(), "nginx.pid"));
    assert!(events.contains(&check), "checked with the pod's pid file and errors on stderr: {events}");
    assert!(pod.read("nginx.pid").trim() != "12345", "the stale pid file was replaced");
    pod.terminate();
    let (code, stderr) = pod.exit(5 * SECOND);
    assert_eq!(code, Some(0));
    assert_eq!(stderr.matches("waiting for the sidecar to write").count(), 1, "said once: {stderr}");
}

#[test]
fn a_new_configuration_is_checked_and_applied_with_one_reload() {
    let pod = Pod::live();
    pod.desire("stream { first }\n");
    assert!(pod.saw("started", 5 * SECOND), "{}", pod.events());
    let written = Instant::now();
    let id = pod.desire("stream { second }\n");
    assert!(pod.within(5 * SECOND, |pod| pod.read("served") == format!("{id}\n")), "{}", pod.events());
    eprintln!("served the second configuration {:?} after it was written", written.elapsed());
    assert!(pod.saw(&format!("reload {id}"), SECOND), "nginx reloaded the new file: {}", pod.events());
    assert_eq!(pod.read("running.conf"), desired_file("stream { second }\n"));
    std::thread::sleep(2 * SECOND);
    assert_eq!(pod.count("reload"), 1, "{}", pod.events());
    assert_eq!(pod.count("checked"), 2, "each id is checked once: {}", pod.events());
    assert_eq!(pod.read("rejected"), "");
}

#[test]
fn changes_arriving_within_one_interval_are_applied_once_the_newest() {
    // An interval long enough that a loaded machine still writes within it.
    let pod = Pod::live_on(true, ReloadPolicy { min_interval: 2 * SECOND, ..RELOAD_POLICY });
    pod.desire("stream { first }\n");
    assert!(pod.saw("started", 5 * SECOND), "{}", pod.events());
    let id = pod.desire("stream { second }\n");
    assert!(pod.within(5 * SECOND, |pod| pod.read("served") == format!("{id}\n")), "{}", pod.events());
    // Within the interval after that reload: only the newest is applied, once.
    for n in 3..=6 {
        pod.desire(&format!("stream {{ {n} }}\n"));
    }
    let newest = pod.desire("stream { newest }\n");
    assert!(pod.within(5 * SECOND, |pod| pod.read("served") == format!("{newest}\n")), "{}", pod.events());
    let reloads: Vec<String> = pod.events().lines().filter(|l| l.starts_with("reload")).map(String::from).collect();
    assert_eq!(reloads, [format!("reload {id}"), format!("reload {newest}")]);
}

#[test]
fn a_refused_configuration_is_reported_and_nginx_keeps_the_last_good_one() {
    let pod = Pod::live();
    let good = pod.desire("stream { good }\n");
    assert!(pod.saw("started", 5 * SECOND), "{}", pod.events());
    let bad = pod.desire("stream {\n    garbage;\n}\n");
    assert!(pod.within(5 * SECOND, |pod| pod.read("rejected").starts_with(&bad)), "{}", pod.events());
    let rejected = pod.read("rejected");
    assert!(rejected.contains("unknown directive \"garbage\""), "nginx -t's words: {rejected}");
    std::thread::sleep(SECOND);
    assert_eq!(pod.read("served"), format!("{good}\n"), "still serving the good one");
    assert_eq!(pod.read("running.conf"), desired_file("stream { good }\n"));
    assert_eq!(pod.count("reload"), 0, "{}", pod.events());
    assert_eq!(pod.count("checked"), 2, "the refused id is not checked again: {}", pod.events());
    // The next good one is applied.
    let next = pod.desire("stream { better }\n");
    assert!(pod.within(5 * SECOND, |pod| pod.read("served") == format!("{next}\n")), "{}", pod.events());
    assert_eq!(pod.count("reload"), 1, "{}", pod.events());
    pod.terminate();
    let (_, stderr) = pod.exit(5 * SECOND);
    let refused: Vec<&str> = stderr.lines().filter(|l| l.contains("refused")).collect();
    assert_eq!(refused.len(), 1, "one line: {stderr}");
    assert!(refused[0].contains(bad.trim_start_matches(CONFIG_ID_PREFIX)), "{stderr}");
    assert!(refused[0].contains("unknown directive"), "{stderr}");
}

/// A file `nginx -t` accepts can still fail to load (a port another process holds): nginx
/// then keeps its workers and the previous file, and says so in its log.
#[test]
fn a_configuration_nginx_does_not_load_is_reported_and_not_tried_again() {
    let pod = Pod::live();
    let good = pod.desire("stream { good }\n");
    assert!(pod.saw("started", 5 * SECOND), "{}", pod.events());
    let unloadable = pod.desire("stream { unloadable }\n");
    assert!(pod.saw(&format!("reload {unloadable}"), 5 * SECOND), "{}", pod.events());
    assert!(pod.within(8 * SECOND, |pod| pod.read("rejected").starts_with(&unloadable)), "{}", pod.events());
    assert!(pod.read("rejected").contains("did not apply it"), "{}", pod.read("rejected"));
    assert_eq!(pod.read("served"), format!("{good}\n"), "still serving the good one");
    std::thread::sleep(SECOND);
    assert_eq!(pod.count("reload"), 1, "not tried again: {}", pod.events());
    let next = pod.desire("stream { better }\n");
    assert!(pod.within(5 * SECOND, |pod| pod.read("served") == format!("{next}\n")), "{}", pod.events());
    pod.terminate();
    let (_, stderr) = pod.exit(5 * SECOND);
    assert!(stderr.contains("nginx did not apply configuration"), "{stderr}");
}

/// A refused first file leaves the pod waiting (unready: no nginx, no pid file).
#[test]
fn a_refused_first_configuration_keeps_the_pod_waiting() {
    let pod = Pod::live();
    let bad = pod.desire("garbage\n");
    assert!(pod.within(5 * SECOND, |pod| pod.read("rejected").starts_with(&bad)), "{}", pod.events());
    assert!(!pod.saw("started", SECOND), "{}", pod.events());
    assert_eq!(pod.read("served"), "");
    let good = pod.desire("stream { good }\n");
    assert!(pod.saw("started", 5 * SECOND), "{}", pod.events());
    assert_eq!(pod.read("served"), format!("{good}\n"));
}

/// The refusal's output is bounded, whatever nginx -t prints.
#[test]
fn the_rejected_file_holds_at_most_4_kib_of_nginx_output() {
    let pod = Pod::live();
    pod.desire("stream { good }\n");
    assert!(pod.saw("started", 5 * SECOND), "{}", pod.events());
    // The stand-in prints the refused file in its error.
    let long = format!("stream {{ garbage }}\n{}\n", "#".repeat(10_000));
    let bad = pod.desire(&long);
    assert!(pod.within(5 * SECOND, |pod| pod.read("rejected").starts_with(&bad)), "{}", pod.events());
    let rejected = pod.read("rejected");
    assert_eq!(rejected.len(), bad.len() + 1 + 4096, "the id line and 4 KiB of the error");
}

#[test]
fn on_a_node_without_ipv6_nginx_runs_and_reloads_without_the_ipv6_listens() {
    let conf = |port: u16| {
        format!("stream {{\n    server {{\n        listen {port};\n        listen [::]:{port};\n    }}\n}}\n")
    };
    let ipv4 = |port: u16| format!("stream {{\n    server {{\n        listen {port};\n    }}\n}}\n");
    let pod = Pod::live_on(false, RELOAD_POLICY);
    let first = pod.desire(&conf(80));
    assert!(pod.saw("started", 5 * SECOND), "{}", pod.events());
    assert_eq!(pod.read("running.conf"), format!("{first}\n{}", ipv4(80)));
    let second = pod.desire(&conf(81));
    assert!(pod.saw(&format!("reload {second}"), 5 * SECOND), "{}", pod.events());
    assert_eq!(pod.read("running.conf"), format!("{second}\n{}", ipv4(81)));
    pod.terminate();
    let (_, stderr) = pod.exit(5 * SECOND);
    assert_eq!(stderr.matches("this node has no IPv6").count(), 1, "{stderr}");

    let pod = Pod::live_on(true, RELOAD_POLICY);
    pod.desire(&conf(80));
    assert!(pod.saw("started", 5 * SECOND), "{}", pod.events());
    assert_eq!(pod.read("running.conf"), desired_file(&conf(80)), "kept where the node has IPv6");
}

#[test]
fn sigterm_becomes_nginx_graceful_quit() {
    let pod = Pod::live();
    pod.desire("stream {}\n");
    assert!(pod.saw("started", 5 * SECOND), "{}", pod.events());
    pod.terminate();
    assert!(pod.saw("quit", 5 * SECOND), "SIGTERM becomes SIGQUIT: {}", pod.events());
    let (code, _) = pod.exit(5 * SECOND);
    assert_eq!(code, Some(0), "the entrypoint exits as nginx did");
}

#[test]
fn a_sigterm_while_waiting_ends_the_entrypoint_promptly() {
    let pod = Pod::live();
    std::thread::sleep(Duration::from_millis(300));
    pod.terminate();
    let started = Instant::now();
    let (code, _) = pod.exit(3 * SECOND);
    assert_eq!(code, Some(143));
    assert!(started.elapsed() < SECOND, "within a poll: {:?}", started.elapsed());
}

#[test]
fn nginx_exiting_by_itself_ends_the_entrypoint_with_its_status() {
    let pod = Pod::live();
    pod.desire("stream {}\n");
    assert!(pod.saw("started", 5 * SECOND), "{}", pod.events());
    // The stand-in's own pid, once written whole (not the stale one, and not a half-written file).
    let own_pid = |pod: &Entrypoint| {
        let pid = pod.read("nginx.pid").trim().to_string();
        (pid != "12345" && pid.parse::<u32>().is_ok()).then_some(pid)
    };
    assert!(pod.within(5 * SECOND, |pod| own_pid(pod).is_some()), "{}", pod.events());
    let pid = own_pid(&pod).expect("the pid");
    pod.signal("-USR2", &pid);
    let stopped = Instant::now();
    let (code, _) = pod.exit(5 * SECOND);
    assert_eq!(code, Some(3));
    // Within a poll or so; more when the machine is busy with other tests.
    assert!(stopped.elapsed() < 2 * SECOND, "noticed within a poll or so: {:?}", stopped.elapsed());
}
