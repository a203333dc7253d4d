//! The pure builders of what a Balancer owns, and the proxy container's entrypoint.

mod builders;
mod entrypoint;
