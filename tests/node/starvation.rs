//! Any pod can reach the webhook port: one that holds slow and idle uploads to it must not make
//! the webhooks refuse the API server (see docs/security.md, "The webhooks answer the API
//! server").

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::faults::probe_balancer;
use crate::fixtures::{pod_ips, restricted_container, restricted_pod, wait_available};
use crate::toolkit::kubectl::Kubectl;
use crate::toolkit::runner::eventually;
use crate::{BASE_IMAGE, NS, OPERATOR_NS, World};

/// The hostile pod's program: from each of its threads, one client of one kind against one
/// operator pod, starting again 100 ms after the server closes it, until the time is up; then
/// the outcomes, as JSON (written by hand: python3-minimal has no `json`). Kinds: `convert` and `validate` send the head of a POST declaring
/// 16 MiB and 1 MiB, then a byte every 250 ms; `tls` completes a handshake and says nothing;
/// `tcp` connects and says nothing. Certificates are not checked: an attacker would not.
const SLOW_CLIENTS: &str = r#"import socket, ssl, sys, threading, time
targets = [t.rsplit(':', 1) for t in sys.argv[1].split(',')]
counts = dict(zip(('convert', 'validate', 'tls', 'tcp'), map(int, sys.argv[2].split(','))))
end = time.time() + float(sys.argv[3])
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
lock = threading.Lock()
tally = {}
def count(what):
    with lock:
        tally[what] = tally.get(what, 0) + 1
def once(kind, host, port):
    s = socket.create_connection((host, int(port)), timeout=5)
    try:
        count('connections')
        if kind != 'tcp':
            s = context.wrap_socket(s)
        if kind in ('convert', 'validate'):
            length = 16777216 if kind == 'convert' else 1048576
            head = 'POST /%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{'
            s.sendall((head % (kind, length)).encode())
        s.settimeout(0.25)
        while time.time() < end:
            try:
                data = s.recv(512)
            except socket.timeout:
                if kind in ('convert', 'validate'):
                    s.sendall(b' ')
                continue
            if not data:
                return 'closed'
            parts = data.split(b' ')
            return 'answered ' + (parts[1].decode() if len(parts) > 1 else '?')
        return 'held to the end'
    finally:
        s.close()
def client(kind, host, port):
    while time.time() < end:
        try:
            outcome = once(kind, host, port)
        except Exception as e:
            outcome = type(e).__name__
        count(kind + ': ' + outcome)
        time.sleep(0.1)
threading.stack_size(256 * 1024)
threads = [threading.Thread(target=client, args=(kind, host, port), daemon=True)
           for host, port in targets for kind, n in counts.items() for _ in range(n)]
for t in threads:
    t.start()
print('attacking with %d clients' % len(threads), flush=True)
for t in threads:
    t.join()
print('{' + ', '.join('"%s": %d' % item for item in sorted(tally.items())) + '}', flush=True)
"#;

/// Clients per operator pod: slow conversions, slow reviews, idle TLS, idle TCP.
const PER_POD: [usize; 4] = [60, 160, 80, 50];

/// How long the API server's requests are measured without the attack, and under it.
const IDLE_WINDOW: Duration = Duration::from_secs(10);
const ATTACK_WINDOW: Duration = Duration::from_secs(15);
/// Time for every slow client to connect and start its upload before the attack is measured.
const RAMP: Duration = Duration::from_secs(5);

const HOSTILE_POD: &str = "slow-clients";
const PROBE: &str = "starvation-probe";

/// The API server's requests, timed: `kubectl apply` of a v1alpha1 Balancer (through the
/// conversion, mutating and validating webhooks) and `kubectl get` of it as v1alpha1 (through
/// the conversion webhook), one after another.
struct Measured {
    latencies: Vec<Duration>,
    failures: BTreeMap<String, usize>,
}

impl Measured {
    /// The `q` quantile (nearest rank), in milliseconds.
    fn quantile(&self, q: f64) -> f64 {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let Some(last) = sorted.len().checked_sub(1) else { return f64::NAN };
        let rank = ((q * sorted.len() as f64).ceil() as usize).saturating_sub(1).min(last);
        sorted[rank].as_secs_f64() * 1000.0
    }

    fn describe(&self) -> String {
        format!(
            "{} requests, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms, failures {:?}",
            self.latencies.len(),
            self.quantile(0.5),
            self.quantile(0.99),
            self.quantile(1.0),
            self.failures
        )
    }
}

/// Sends the API server's requests (see [`Measured`]) for `window`, from a thread.
async fn api_server_requests(kubectl: &Kubectl, first_write: usize, window: Duration) -> Measured {
    let kubectl = kubectl.clone();
    let requests = tokio::task::spawn_blocking(move || {
        let mut measured = Measured { latencies: Vec::new(), failures: BTreeMap::new() };
        let started = Instant::now();
        let mut write = first_write;
        let get = ["-n", NS, "get", "balancers.v1alpha1.exposer.hliangzhao.io", PROBE, "-o", "name"];
        while started.elapsed() < window {
            write += 1;
            let sent = Instant::now();
            let applied = kubectl.try_apply(&probe_balancer(PROBE, 1, write));
            measured.latencies.push(sent.elapsed());
            let sent = Instant::now();
            let (read, _, error) = kubectl.run(&get, None);
            measured.latencies.push(sent.elapsed());
            let failures = [
                applied.err().map(|e| format!("apply: {}", e.trim())),
                (!read).then(|| format!("get: {}", error.trim())),
            ];
            for failure in failures.into_iter().flatten() {
                *measured.failures.entry(failure).or_insert(0) += 1;
            }
        }
        measured
    });
    requests.await.expect("the API server's requests")
}

/// A pod on the pod network holds slow uploads to `/convert` (16 MiB declared) and `/validate`
/// (1 MiB), trickled, and idle TLS and TCP connections, 350 against each operator pod, each
/// starting again once closed; meanwhile every `kubectl apply` of a v1alpha1 Balancer and every
/// read of it as v1alpha1, which the API server can only answer through the webhooks, succeeds.
/// The p99 is printed beside the p99 of the same requests before the attack.
pub async fn the_webhooks_answer_the_api_server_under_slow_clients(world: &mut World) {
    world.ensure_namespace().await;
    world.kubectl.apply(&probe_balancer(PROBE, 1, 0));
    // Its proxy rolled out first, so that the controller's work is not measured as the idle p99.
    wait_available(world, NS, &format!("{PROBE}-proxy"), 1).await;
    let idle = api_server_requests(&world.kubectl, 0, IDLE_WINDOW).await;
    println!("node: the API server's requests without the attack: {}", idle.describe());

    let targets: Vec<String> = pod_ips(world, OPERATOR_NS, "app.kubernetes.io/name=balancer")
        .await
        .into_iter()
        .map(|ip| format!("{ip}:9443"))
        .collect();
    assert!(!targets.is_empty(), "the operator's pods have addresses");
    let counts = PER_POD.map(|n| n.to_string()).join(",");
    // The clients stop soon after the measured window, and print their tally.
    let seconds = (RAMP + ATTACK_WINDOW + Duration::from_secs(5)).as_secs().to_string();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": HOSTILE_POD, "namespace": NS},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": restricted_pod(),
            "containers": [{
                "name": "clients", "image": BASE_IMAGE, "imagePullPolicy": "Never",
                "securityContext": restricted_container(),
                "command": ["python3", "-c", SLOW_CLIENTS, targets.join(","), counts, seconds],
            }],
        },
    });
    world.kubectl.apply(&pod.to_string());
    let logs = ["-n", NS, "logs", HOSTILE_POD];
    let started = eventually("the slow clients attacking", Duration::from_secs(60), || async {
        let (_, out, _) = world.kubectl.run(&logs, None);
        out.contains("attacking").then(|| out.trim().to_string())
    })
    .await;
    println!("node: {HOSTILE_POD}: {started}, against {}", targets.join(" and "));
    tokio::time::sleep(RAMP).await;
    let attacked = api_server_requests(&world.kubectl, 1_000, ATTACK_WINDOW).await;
    println!("node: the API server's requests under the attack: {}", attacked.describe());
    println!("node: p99 without the attack {:.0} ms, under it {:.0} ms", idle.quantile(0.99), attacked.quantile(0.99));

    let tally = eventually("the slow clients' tally", Duration::from_secs(60), || async {
        let (_, out, _) = world.kubectl.run(&logs, None);
        out.lines().last().filter(|line| line.starts_with('{')).map(str::to_string)
    })
    .await;
    println!("node: {HOSTILE_POD}'s outcomes: {tally}");
    world.kubectl.ok(&["-n", NS, "delete", "pod", HOSTILE_POD, "--wait=false"]);
    world.kubectl.ok(&["-n", NS, "delete", "balancer", PROBE]);

    assert!(idle.failures.is_empty(), "without the attack: {}", idle.describe());
    assert!(attacked.failures.is_empty(), "every request the API server sent was answered: {}", attacked.describe());
    let tally: serde_json::Value = serde_json::from_str(&tally).expect("the tally is JSON");
    let connections = tally["connections"].as_u64().unwrap_or(0);
    let expected = (PER_POD.iter().sum::<usize>() * targets.len()) as u64;
    assert!(connections >= expected, "the attack made {connections} connections, fewer than its {expected} clients");
}
