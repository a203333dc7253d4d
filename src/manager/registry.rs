//! Every area's metrics in one registry: the only place that knows them all.

use std::sync::Arc;

use prometheus_client::registry::Registry;

use crate::controller::metrics::ControllerMetrics;
use crate::runtime::contact::Contact;
use crate::runtime::metrics;
use crate::runtime::throttle::ThrottleMetrics;
use crate::runtime::tls::TlsMetrics;
use crate::webhook::metrics::AdmissionMetrics;

/// Every area's metrics, registered in one registry under the `balancer_` prefix. Each area
/// registers its own series and creates every series it knows at zero, so a fresh process
/// already exports them: `rate()` sees the first increment and `absent()` alerts mean what
/// they say.
pub struct Metrics {
    /// The one registry every series is registered in.
    pub registry: Arc<Registry>,
    /// The webhooks' series.
    pub admission: Arc<AdmissionMetrics>,
    /// The serving certificate's series.
    pub tls: Arc<TlsMetrics>,
    /// The controller's series.
    pub controller: Arc<ControllerMetrics>,
    /// The client throttle's series.
    pub throttle: ThrottleMetrics,
    /// Whether the API server answers.
    pub contact: Contact,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("balancer");
        let admission = Arc::new(AdmissionMetrics::register(&mut registry));
        let tls = Arc::new(TlsMetrics::register(&mut registry));
        let controller = Arc::new(ControllerMetrics::register(&mut registry));
        let throttle = ThrottleMetrics::register(&mut registry);
        let contact = Contact::register(&mut registry);
        Metrics { registry: Arc::new(registry), admission, tls, controller, throttle, contact }
    }
}

impl Metrics {
    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        metrics::encode(&self.registry)
    }
}
