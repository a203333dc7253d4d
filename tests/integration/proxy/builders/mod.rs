//! The pure builders: the children a Balancer owns (`balancer::proxy`) and the `nginx.conf` the
//! proxy reads (`balancer::proxy::nginx`), checked field by field, one module per child or
//! subject; what they share is in `fixtures`.

mod fixtures;

mod backend_services;
mod config_hash;
mod front_and_deployment;
mod identity;
mod metrics_sidecar;
mod nginx_conf;
mod pod_upstreams;
mod sni_routes;
