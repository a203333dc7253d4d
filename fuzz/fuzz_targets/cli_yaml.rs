//! YAML as `balancer check` reads it (files users are given, `kubectl get -o yaml` output): a
//! report or a parse error, never a panic.
#![no_main]

use balancer::cli::check::check_yaml;
use balancer::spec::SpecPolicy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &[u8]| {
    if let Ok(text) = std::str::from_utf8(text) {
        let _ = check_yaml("fuzz.yaml", text, &SpecPolicy::default());
    }
});
