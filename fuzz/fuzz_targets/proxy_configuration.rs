//! The proxy's configuration as the sidecar reads it from the ConfigMap, which whoever writes
//! ConfigMaps in the namespace can replace: the model (`proxy.json`) and the first line of
//! `nginx.conf`, split at the first NUL. Read, or refused, never a panic; a model that reads is
//! turned into the sidecar's upstreams and rendered again.
#![no_main]

use balancer::proxy::model::ProxyConfig;
use balancer::proxy::nginx;
use balancer::proxy::upstreams::Upstreams;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (model, conf) = text.split_once('\0').unwrap_or((text, ""));
    if let Some(config) = ProxyConfig::from_json(model) {
        let _ = nginx::is_rendered_for(conf, &config);
        let _ = Upstreams::of(&config);
        let _ = nginx::write(&config);
    }
});
