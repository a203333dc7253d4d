//! What a Balancer means, pure: the one spec pipeline. A spec is read ([`read_spec`],
//! [`parse_spec`]), defaulted ([`fill_defaults`]) and validated ([`validation`]) here, and only what passes becomes an
//! [`Admitted`] spec, the type every builder of children requires.
//!
//! The validating webhook, the controller, `balancer check` and `balancer render` all go
//! through [`admit`], so they cannot disagree about what a Balancer means.

use std::ops::Deref;

mod defaults;
mod policy;
mod read;
pub(crate) mod report;
pub mod validation;

pub use defaults::{defaults_patch, fill_defaults, with_defaults};
pub use policy::SpecPolicy;
pub use read::{parse_spec, read_spec};
pub use report::{FieldError, ObjectName, Report, denial_message};
pub use validation::{unchangeable, validate};

use crate::api::BalancerSpec;

/// A spec with its defaults filled in that passed every rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Admitted {
    spec: BalancerSpec,
    warnings: Vec<String>,
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
    let report = validate(name, &spec, policy);
    match report.is_valid() {
        true => Ok(Admitted { spec, warnings: report.warnings }),
        false => Err(report),
    }
}
