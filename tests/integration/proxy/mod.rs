//! The pure builders of what a Balancer owns, the proxy container's entrypoints and its stop hook.

mod builders;
mod entrypoint;
mod pre_stop;
mod reload;
