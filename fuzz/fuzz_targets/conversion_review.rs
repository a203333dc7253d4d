//! A ConversionReview body, as any client of the webhook port may send it: converted objects or
//! a 400, never a panic.
#![no_main]

use balancer::webhook::conversion::conversion_review;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let _ = conversion_review(body);
});
