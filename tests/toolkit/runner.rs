//! Scenarios run against one shared world, each reported as a test, with libtest's filter and
//! `--skip NAME` on the command line.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::FutureExt;

/// One scenario: an async step over the shared world.
pub type Scenario<W> = for<'a> fn(&'a mut W) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

/// `[(name, scenario)]` from the scenario functions' names.
macro_rules! scenarios {
    ($world:ty: $($name:ident),* $(,)?) => {
        vec![$((stringify!($name), (|w| Box::pin($name(w))) as crate::toolkit::runner::Scenario<$world>)),*]
    };
}
pub(crate) use scenarios;

/// What a name filter on the command line runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// The scenarios whose names contain it, and no other: each sets up what it needs.
    RunsOnlyTheNamed,
    /// Every scenario up to the last one whose name contains it, in order: later scenarios
    /// build on the state earlier ones leave.
    RunsUpToTheNamed,
}

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

    /// Whether `--skip` leaves the scenario `name` out.
    fn skips(&self, name: &str) -> bool {
        self.skip.iter().any(|skip| name.contains(skip.as_str()))
    }

    /// Whether the filter selects the scenario at `index` of `names`.
    fn selects(&self, names: &[&str], index: usize, filter: Filter) -> bool {
        let Some(wanted) = &self.filter else { return true };
        match filter {
            Filter::RunsOnlyTheNamed => names[index].contains(wanted.as_str()),
            Filter::RunsUpToTheNamed => names[index..].iter().any(|later| later.contains(wanted.as_str())),
        }
    }
}

/// Whether the command line selects any of the scenarios `names`, and does not skip it.
pub fn selects_any(names: &[&str], filter: Filter) -> bool {
    let selection = Selection::from_args();
    (0..names.len()).any(|index| selection.selects(names, index, filter) && !selection.skips(names[index]))
}

/// Runs the scenarios of `all` that the command line selects, in order, and stops at the
/// first failure after `diagnose`. `--skip NAME` leaves out the scenarios whose names contain
/// NAME (with [`Filter::RunsUpToTheNamed`], only those that no later one builds on). Returns
/// how many passed and failed.
pub async fn run<W>(
    world: &mut W,
    all: Vec<(&str, Scenario<W>)>,
    filter: Filter,
    diagnose: impl Fn(&W),
) -> (usize, usize) {
    let selection = Selection::from_args();
    let names: Vec<&str> = all.iter().map(|(name, _)| *name).collect();
    let mut passed = 0;
    for (index, (name, scenario)) in all.into_iter().enumerate() {
        if !selection.selects(&names, index, filter) {
            continue;
        }
        if selection.skips(name) {
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
