//! Whole-number arithmetic that weights need.

/// The greatest common divisor of `a` and `b` (`a` when `b` is 0).
pub(crate) fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_greatest_common_divisor() {
        assert_eq!((gcd(12, 18), gcd(7, 0), gcd(0, 7), gcd(5, 3)), (6, 7, 7, 1));
    }
}
