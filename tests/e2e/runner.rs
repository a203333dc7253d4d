//! Scenarios that build on each other, run in order against one world, each
//! reported as a test. Shared by the e2e and node suites.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::FutureExt;

/// One scenario: an async step over the shared world.
pub type Scenario<W> = for<'a> fn(&'a mut W) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

/// `[(name, scenario)]` from the scenario functions' names.
macro_rules! scenarios {
    ($world:ty: $($name:ident),* $(,)?) => {
        vec![$((stringify!($name), (|w| Box::pin($name(w))) as crate::runner::Scenario<$world>)),*]
    };
}
pub(crate) use scenarios;

/// What the command line asks for: a filter, and `--skip NAME` for scenarios to leave out.
struct Selection {
    filter: Option<String>,
    skip: Vec<String>,
}

impl Selection {
    fn from_args() -> Selection {
        let mut selection = Selection { filter: None, skip: Vec::new() };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            if arg == "--skip" {
                selection.skip.extend(args.next());
            } else if !arg.starts_with('-') && selection.filter.is_none() {
                selection.filter = Some(arg);
            }
        }
        selection
    }
}

/// Runs `all` in order, up to the last one whose name contains the command line's filter
/// (later scenarios build on earlier ones), and stops at the first failure after `diagnose`.
/// `--skip NAME` leaves out the scenarios whose names contain NAME: only those that no later
/// one builds on. Returns how many passed and failed.
pub async fn run_in_order<W>(world: &mut W, all: Vec<(&str, Scenario<W>)>, diagnose: impl Fn(&W)) -> (usize, usize) {
    let selection = Selection::from_args();
    let last = match &selection.filter {
        Some(f) => all.iter().rposition(|(name, _)| name.contains(f.as_str())).map_or(0, |i| i + 1),
        None => all.len(),
    };
    let mut passed = 0;
    for (name, scenario) in all.into_iter().take(last) {
        if selection.skip.iter().any(|skip| name.contains(skip.as_str())) {
            println!("test {name} ... skipped (--skip)");
            continue;
        }
        let started = Instant::now();
        match std::panic::AssertUnwindSafe(scenario(world)).catch_unwind().await {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({:.1} s)", started.elapsed().as_secs_f64());
            }
            Err(_) => {
                println!("test {name} ... FAILED");
                diagnose(world);
                return (passed, 1);
            }
        }
    }
    (passed, 0)
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
