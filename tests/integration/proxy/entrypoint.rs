//! The proxy container's entrypoint under the real `/bin/sh`, with a stand-in `nginx` on its
//! PATH that records how it was started and stopped: nginx starts only on the pod's own
//! configuration, without its IPv6 listens on a node without IPv6, and the kubelet's SIGTERM
//! becomes nginx's graceful SIGQUIT.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use balancer::proxy::nginx::{self, CONFIG_HASH_ENV, ProxyFiles};

use super::{Entrypoint, path};

/// A stand-in nginx: records its arguments, and `quit` on SIGQUIT, then exits. In Perl (in every
/// Debian): like nginx, it sets its own handler over the SIGQUIT that `sh` ignores in a
/// background job, which a shell script cannot.
const FAKE_NGINX: &str = r#"#!/usr/bin/perl
use File::Basename;
sub record { open(my $f, ">>", dirname($0) . "/events") or die; print $f "$_[0]\n"; close $f }
$SIG{QUIT} = sub { record("quit"); exit 0 };
record("started @ARGV");
sleep 1 while 1;
"#;

/// The mounted proxy container's entrypoint, as a test starts it.
type Pod = Entrypoint;

impl Entrypoint {
    /// Runs the entrypoint as the proxy container does, with `conf` mounted and `hash` set, on a
    /// node with IPv6.
    fn mounted(conf: &str, hash: &str) -> Pod {
        Pod::mounted_on(conf, hash, true)
    }

    fn mounted_on(conf: &str, hash: &str, ipv6: bool) -> Pod {
        let dir = Entrypoint::prepare(FAKE_NGINX, ipv6);
        std::fs::write(dir.path().join("nginx.conf"), conf).expect("the mounted file");
        let (mounted, running) = (path(dir.path(), "nginx.conf"), path(dir.path(), "running.conf"));
        let (pid_file, ipv6_probe) = (path(dir.path(), "nginx.pid"), path(dir.path(), "if_inet6"));
        let files = ProxyFiles { mounted: &mounted, running: &running, pid_file: &pid_file, ipv6_probe: &ipv6_probe };
        let search = format!("{}:{}", dir.path().display(), std::env::var("PATH").unwrap_or_default());
        let process = Command::new("/bin/sh")
            .args(["-c", nginx::ENTRYPOINT, "nginx", "-c", "the-conf"])
            .envs(nginx::entrypoint_environment(&files))
            .env("PATH", search)
            .env(CONFIG_HASH_ENV, hash)
            .stderr(Stdio::piped())
            .spawn()
            .expect("/bin/sh runs");
        Entrypoint { dir, process }
    }

    /// The file nginx was started on.
    fn running(&self) -> String {
        self.read("running.conf")
    }

    fn mount(&self, conf: &str) {
        // As the kubelet does: a new file renamed into place.
        let next = self.dir.path().join("nginx.conf.next");
        std::fs::write(&next, conf).expect("the new file");
        std::fs::rename(next, self.dir.path().join("nginx.conf")).expect("renamed into place");
    }
}

#[test]
fn nginx_starts_at_once_on_the_pods_own_configuration_and_quits_gracefully() {
    let conf = "stream {}\n";
    let pod = Pod::mounted(conf, &nginx::config_hash(conf));
    assert!(pod.saw("started -c the-conf", Duration::from_secs(5)), "{}", pod.events());
    assert_eq!(pod.running(), conf, "nginx runs a copy of the mounted file");
    assert!(!Path::new(&path(pod.dir.path(), "nginx.pid")).exists(), "the stale pid file is removed first");
    pod.terminate();
    assert!(pod.saw("quit", Duration::from_secs(5)), "SIGTERM becomes SIGQUIT: {}", pod.events());
    let (code, _) = pod.exit(Duration::from_secs(5));
    assert_eq!(code, Some(0), "the entrypoint exits as nginx did");
}

/// A kubelet whose ConfigMap cache is behind mounts the previous file first.
#[test]
fn nginx_waits_while_the_mounted_configuration_is_an_older_one() {
    let (old, new) = ("stream { old }\n", "stream { new }\n");
    let pod = Pod::mounted(old, &nginx::config_hash(new));
    assert!(!pod.saw("started", Duration::from_millis(1500)), "started on the old file: {}", pod.events());
    pod.mount(new);
    assert!(pod.saw("started", Duration::from_secs(5)), "not started on the new file: {}", pod.events());
    assert_eq!(pod.running(), new);
    pod.terminate();
    let (_, stderr) = pod.exit(Duration::from_secs(5));
    assert_eq!(stderr.matches("waiting for the kubelet to mount").count(), 1, "said once: {stderr}");
}

#[test]
fn a_sigterm_while_waiting_ends_the_entrypoint_promptly() {
    let pod = Pod::mounted("stream { old }\n", &nginx::config_hash("stream { new }\n"));
    std::thread::sleep(Duration::from_millis(300));
    pod.terminate();
    let started = Instant::now();
    let events = pod.events();
    let (code, _) = pod.exit(Duration::from_secs(5));
    assert_eq!(code, Some(143));
    // The trap runs once the 1 s recheck's `sleep` ends; the rest is slack for a busy machine
    // (CI runs the suite's tests in parallel), still far from the kubelet's grace period.
    assert!(started.elapsed() < Duration::from_secs(3), "within the 1 s recheck: {:?}", started.elapsed());
    assert!(!events.contains("started"), "{events}");
}

/// Pods written before the hash was passed, or by hand, start as they did.
#[test]
fn without_a_hash_nginx_starts_on_whatever_is_mounted() {
    let pod = Pod::mounted("stream {}\n", "");
    assert!(pod.saw("started", Duration::from_secs(5)), "{}", pod.events());
}

/// A kernel booted with `ipv6.disable=1` has no `/proc/net/if_inet6`, and nginx would fail on
/// `listen [::]:…`: those lines are left out of the copy, and only those.
#[test]
fn on_a_node_without_ipv6_nginx_runs_without_the_ipv6_listens() {
    let conf = "stream {\n    server {\n        listen 80;\n        listen [::]:80;\n    }\n    server {\n        \
                listen 53 udp;\n        listen [::]:53 udp;\n    }\n}\n";
    let pod = Pod::mounted_on(conf, &nginx::config_hash(conf), false);
    assert!(pod.saw("started", Duration::from_secs(5)), "{}", pod.events());
    let ipv4_only =
        "stream {\n    server {\n        listen 80;\n    }\n    server {\n        listen 53 udp;\n    }\n}\n";
    assert_eq!(pod.running(), ipv4_only);
    pod.terminate();
    let (_, stderr) = pod.exit(Duration::from_secs(5));
    assert!(stderr.contains("this node has no IPv6"), "{stderr}");

    let pod = Pod::mounted_on(conf, &nginx::config_hash(conf), true);
    assert!(pod.saw("started", Duration::from_secs(5)), "{}", pod.events());
    assert_eq!(pod.running(), conf, "kept where the node has IPv6");
}

/// The lines the entrypoint removes are the ones the renderer writes.
#[test]
fn the_rendered_ipv6_listens_are_the_ones_left_out() {
    use crate::support::fixtures::{admitted, named, sample_spec};
    let spec = admitted("example-balancer", sample_spec(), &balancer::spec::SpecPolicy::default());
    let conf = nginx::render("example-balancer", &spec, &[], None, &named);
    let ipv6: Vec<&str> = conf.lines().filter(|l| l.trim_start().starts_with(nginx::IPV6_LISTEN)).collect();
    assert_eq!(ipv6, ["        listen [::]:80;"]);
}
