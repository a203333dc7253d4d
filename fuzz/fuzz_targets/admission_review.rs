//! An AdmissionReview body, as any client of the webhook port may send it, through both
//! webhooks: an answer or a 400, never a panic.
#![no_main]

use balancer::spec::SpecPolicy;
use balancer::webhook::admission::{Webhook, review};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    for webhook in [Webhook::Validate, Webhook::Mutate] {
        let _ = review(webhook, body, &SpecPolicy::default());
    }
});
