//! The pure builders of what a Balancer owns, the proxy container's entrypoint and its stop hook.

mod builders;
mod entrypoint;
mod pre_stop;
