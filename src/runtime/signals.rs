//! SIGTERM and SIGINT, the stop signals of every long-running command.

/// SIGTERM and SIGINT, listened for from the moment this is created: a signal that comes
/// during start-up is not lost.
pub(crate) struct Signals {
    term: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn listen() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals { term: signal(SignalKind::terminate())?, interrupt: signal(SignalKind::interrupt())? })
    }

    /// Waits for the first SIGTERM or SIGINT.
    pub(crate) async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}
