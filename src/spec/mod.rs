//! What a Balancer means, as pure functions: the one spec pipeline. A spec is read ([`read_spec`],
//! [`parse_spec`]), defaulted ([`fill_defaults`]) and validated ([`validation`]) here, and only what passes becomes an
//! [`Admitted`] spec, the type every builder of children requires.
//!
//! The validating webhook, the controller, `balancer check` and `balancer render` all go
//! through [`admit`], so they cannot disagree about what a Balancer means.

use std::ops::Deref;
use std::str::FromStr;

pub mod canary;
mod defaults;
mod policy;
mod read;
pub(crate) mod report;
pub mod validation;

pub use defaults::{defaults_patch, fill_defaults, with_defaults};
pub use policy::{SchedulingPolicy, SpecPolicy};
pub use read::{parse_spec, read_spec};
pub use report::{FieldError, ObjectName, Report, denial_message};
pub use validation::{ANY_TAINT, unchangeable, validate, validate_proxy_settings};

use crate::api::{
    Algorithm, BalancerPort, BalancerSpec, ExternalTrafficPolicy, Protocol, ServiceType, SessionAffinity, UpstreamKind,
};
use crate::spec::canary::CanaryPlan;

/// A spec with its defaults filled in that passed every rule, with its enumerated fields read
/// into their types.
#[derive(Clone, Debug, PartialEq)]
pub struct Admitted {
    spec: BalancerSpec,
    warnings: Vec<String>,
    typed: Typed,
    /// The split a running canary puts on the wire instead of the spec's weights.
    split: Option<LiveSplit>,
}

/// What a running canary puts on the wire: each backend's weight, in spec order, in place of
/// the spec's, and the window the proxy pods' sidecars count its sessions under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveSplit {
    /// One per backend of the spec.
    pub weights: Vec<u32>,
    /// The canary step's window (see `canary::progress::window`); `None` once it has completed.
    pub window: Option<String>,
    /// The backend being measured (its index), while the canary runs: its passive health check
    /// is off, so that it takes its share and the gates see what it does with it (nginx still
    /// moves a failed connect to the next backend).
    pub measured: Option<usize>,
}

/// The enumerated fields of a valid, defaulted spec.
#[derive(Clone, Debug, PartialEq)]
struct Typed {
    algorithm: Algorithm,
    upstreams: UpstreamKind,
    session_affinity: SessionAffinity,
    service_type: ServiceType,
    external_traffic_policy: Option<ExternalTrafficPolicy>,
    /// One per port, in spec order.
    protocols: Vec<Protocol>,
    /// `spec.canary`, read.
    canary: Option<CanaryPlan>,
}

impl Typed {
    /// `None` when a field holds a value that validation refuses.
    fn read(spec: &BalancerSpec) -> Option<Typed> {
        let service = spec.service.as_ref();
        Some(Typed {
            algorithm: read(spec.algorithm.as_ref())?.unwrap_or_default(),
            upstreams: read(spec.proxy.as_ref().and_then(|p| p.upstreams.as_ref()))?.unwrap_or_default(),
            session_affinity: read(spec.session_affinity.as_ref())?.unwrap_or_default(),
            service_type: read(service.and_then(|s| s.type_.as_ref()))?.unwrap_or_default(),
            external_traffic_policy: read(service.and_then(|s| s.external_traffic_policy.as_ref()))?,
            protocols: spec
                .ports
                .iter()
                .map(|p| Some(read(p.protocol.as_ref())?.unwrap_or_default()))
                .collect::<Option<_>>()?,
            canary: match &spec.canary {
                Some(canary) => Some(validation::read_canary(canary, spec, &mut Report::default())?),
                None => None,
            },
        })
    }
}

/// An optional field's value: `Some(None)` when unset, `None` when it does not read.
fn read<T: FromStr>(text: Option<&String>) -> Option<Option<T>> {
    text.map(|t| t.parse()).transpose().ok()
}

/// One port of an admitted spec, with its protocol.
#[derive(Clone, Copy, Debug)]
pub struct AdmittedPort<'a> {
    /// The port as the spec gives it.
    pub spec: &'a BalancerPort,
    /// Its protocol, read.
    pub protocol: Protocol,
}

impl AdmittedPort<'_> {
    /// The port's number, which validation keeps within 1–65535.
    pub fn number(&self) -> u16 {
        u16::try_from(self.spec.port).unwrap_or_default()
    }
}

impl Deref for AdmittedPort<'_> {
    type Target = BalancerPort;

    fn deref(&self) -> &BalancerPort {
        self.spec
    }
}

impl Admitted {
    /// Legal but suspicious things about it (a weight of 0 on every backend, say).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The number of proxy pods (always set once defaulted).
    pub fn replicas(&self) -> i32 {
        self.spec.replicas.unwrap_or_default()
    }

    /// How long connections opened before a configuration change go on (`spec.proxy.drainTimeout`,
    /// or the default), in nginx's time syntax.
    pub fn drain_timeout(&self) -> &str {
        self.spec.proxy.as_ref().and_then(|p| p.drain_timeout.as_deref()).unwrap_or(crate::api::DEFAULT_DRAIN_TIMEOUT)
    }

    /// How the proxy picks a backend for a new connection.
    pub fn algorithm(&self) -> Algorithm {
        self.typed.algorithm
    }

    /// What the proxy is asked to send connections to (`spec.proxy.upstreams`).
    pub fn upstreams(&self) -> UpstreamKind {
        self.typed.upstreams
    }

    /// Whether a client's connections stick to one backend.
    pub fn session_affinity(&self) -> SessionAffinity {
        self.typed.session_affinity
    }

    /// The front Service's type.
    pub fn service_type(&self) -> ServiceType {
        self.typed.service_type
    }

    /// The front Service's `externalTrafficPolicy`; `None` leaves it to Kubernetes.
    pub fn external_traffic_policy(&self) -> Option<ExternalTrafficPolicy> {
        self.typed.external_traffic_policy
    }

    /// `spec.canary`, read.
    pub fn canary(&self) -> Option<&CanaryPlan> {
        self.typed.canary.as_ref()
    }

    /// The spec, with the split a running canary sets; one weight per backend (another count
    /// leaves the spec's weights).
    pub fn with_split(mut self, split: LiveSplit) -> Admitted {
        self.split = (split.weights.len() == self.spec.backends.len()).then_some(split);
        self
    }

    /// The weight backend `index` gets on the wire: a running canary's, else the spec's.
    pub fn weight(&self, index: usize) -> u32 {
        match &self.split {
            Some(split) => split.weights.get(index).copied().unwrap_or_default(),
            None => self.spec.backends.get(index).map_or(0, |b| u32::try_from(b.effective_weight()).unwrap_or(0)),
        }
    }

    /// Whether backend `index` is a running canary's, measured rather than health-checked.
    pub fn is_measured(&self, index: usize) -> bool {
        self.split.as_ref().is_some_and(|s| s.measured == Some(index))
    }

    /// The window a running canary's step is counted under.
    pub fn canary_window(&self) -> Option<&str> {
        self.split.as_ref().and_then(|s| s.window.as_deref())
    }

    /// The ports, in spec order, each with its protocol.
    pub fn ports(&self) -> impl ExactSizeIterator<Item = AdmittedPort<'_>> + Clone {
        self.spec.ports.iter().zip(&self.typed.protocols).map(|(spec, &protocol)| AdmittedPort { spec, protocol })
    }
}

impl Deref for Admitted {
    type Target = BalancerSpec;

    fn deref(&self) -> &BalancerSpec {
        &self.spec
    }
}

/// Defaults `spec` and checks it against every rule; the report lists every violation.
pub fn admit(name: ObjectName<'_>, mut spec: BalancerSpec, policy: &SpecPolicy) -> Result<Admitted, Report> {
    fill_defaults(&mut spec, policy);
    let mut report = validate(name, &spec, policy);
    match (report.is_valid(), Typed::read(&spec)) {
        (true, Some(typed)) => Ok(Admitted { spec, warnings: report.warnings, typed, split: None }),
        (true, None) => {
            // Validation refuses every value `Typed::read` cannot read, so this is a bug in one
            // of them; the spec is refused with a message rather than a panic.
            report.error("spec", "holds a value the validation rules let through but balancer cannot read");
            Err(report)
        }
        (false, _) => Err(report),
    }
}
