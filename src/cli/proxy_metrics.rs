//! `balancer proxy-metrics`: the proxy pods' metrics sidecar. It runs until SIGTERM and the
//! drain that follows. It does not exit earlier even when it cannot count sessions (see below).

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use super::args::ProxyMetricsArgs;
use super::io::fail;
use crate::exporter::{self, LiveSource, Options, Source};
use crate::runtime::logging::init_logging;
use crate::runtime::signals::Signals;

pub(super) fn command(args: ProxyMetricsArgs) -> ExitCode {
    init_logging(args.log_format.into(), &args.log_level);
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    let source = match (args.configmap, args.config) {
        (Some(config_map), _) => Source::Live(LiveSource {
            config_map,
            dir: args.live_dir,
            key: args.config_key,
            owner: args.owner,
            owner_uid: args.owner_uid.unwrap_or_default(),
        }),
        (None, Some(path)) => Source::File { path, hash: args.config_hash.filter(|h| !h.is_empty()) },
        (None, None) => return fail("either --config or --configmap is required"),
    };
    let options = Options { source, listen: args.listen, log_file: args.log_file, drain: args.drain };
    let result = runtime.block_on(async move {
        let signals = Signals::listen().map_err(|e| format!("cannot listen for signals: {e}"))?;
        let stop = CancellationToken::new();
        let stopper = stop.clone();
        tokio::spawn(async move {
            signals.wait().await;
            stopper.cancel();
        });
        let result = exporter::run(options, stop.clone()).await.map_err(|e| e.to_string());
        if let Err(message) = &result {
            // Exiting would restart the container, and a proxy pod with a container down is not
            // Ready: its Service would stop sending it traffic. So the sidecar waits for SIGTERM.
            tracing::error!(error = %message, "cannot count the proxy's sessions; waiting for the pod to stop");
            stop.cancelled().await;
        }
        result
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!(error = %message, "proxy-metrics stopped");
            fail(&message)
        }
    }
}
