//! The pure builders of what a Balancer owns.

mod builders;
