//! Table-driven tests of every admission rule in `balancer::spec::validation`, one
//! module per part of the spec; the runner and the sample are in `table`.
//!
//! Each row starts from the project's sample Balancer (valid, no warnings),
//! applies one mutation and states the complete report: every error as it is
//! rendered (`<field path>: <problem>`), in order, and every warning.
//! The expected texts are written out here on purpose rather than built from
//! the crate's constants, so that a changed message is a failing test.

mod backends;
mod exposure;
mod formats;
mod names;
mod ports;
mod proxy;
mod rendering;
mod scheduling;
mod table;
mod whole_spec;
