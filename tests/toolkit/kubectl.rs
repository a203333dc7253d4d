//! The one way the suites run `kubectl`: as one user of one cluster, from any thread.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// `kubectl` with one kubeconfig (one user of one cluster). Cheap to clone, and usable from a
/// plain thread, as the writers that apply a Balancer every 200 ms do.
#[derive(Clone, Debug)]
pub struct Kubectl {
    kubeconfig: PathBuf,
}

impl Kubectl {
    pub fn new(kubeconfig: PathBuf) -> Kubectl {
        Kubectl { kubeconfig }
    }

    /// Runs `kubectl args`, with `stdin` as its input if given: whether it succeeded, its
    /// standard output and its error output. A failure is the caller's to judge.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let mut child = Command::new("kubectl")
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        if let Some(input) = stdin {
            child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write to kubectl");
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("kubectl ends");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
    }

    /// Runs `kubectl args` and returns its output; panics with the error output if it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        self.succeed(args, None)
    }

    /// [`Kubectl::ok`] with `stdin` as the command's input.
    pub fn ok_with(&self, args: &[&str], stdin: &str) -> String {
        self.succeed(args, Some(stdin))
    }

    /// `kubectl apply -f -` of `manifest` (YAML or JSON); panics if it fails.
    pub fn apply(&self, manifest: &str) -> String {
        self.succeed(&["apply", "-f", "-"], Some(manifest))
    }

    /// `kubectl apply -f -` of `manifest`: Ok, or the error output. For writes that may be
    /// refused, and for callers that count failures.
    pub fn try_apply(&self, manifest: &str) -> Result<(), String> {
        let (ok, _, err) = self.run(&["apply", "-f", "-"], Some(manifest));
        if ok { Ok(()) } else { Err(err) }
    }

    fn succeed(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = self.run(args, stdin);
        assert!(ok, "kubectl {} failed: {err}{out}", args.join(" "));
        out
    }
}
