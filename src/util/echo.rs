//! Echoing client-controlled text back in messages, within a budget.
//!
//! Names, labels and parse errors are quoted back to help the user, but a client
//! controls their length: a 60,000-character name echoed once per backend would
//! make a 55 MB answer. Every echo goes through here and is cut with a marker.

use std::borrow::Cow;

/// Marks text cut short by [`cut`].
pub(crate) const CUT_MARKER: &str = "…(truncated)";
/// Bytes of a value quoted by [`quoted`] before it is cut: a whole label key (317) fits.
pub(crate) const MAX_QUOTED_BYTES: usize = 320;

/// `text` cut, on a character boundary, so that its JSON encoding takes at most
/// `max` bytes, [`CUT_MARKER`] included; unchanged when it already fits.
pub(crate) fn cut(text: &str, max: usize) -> Cow<'_, str> {
    if text.chars().map(json_width).sum::<usize>() <= max {
        return Cow::Borrowed(text);
    }
    let budget = max.saturating_sub(CUT_MARKER.len());
    let mut used = 0;
    let mut end = 0;
    for (i, c) in text.char_indices() {
        used += json_width(c);
        if used > budget {
            break;
        }
        end = i + c.len_utf8();
    }
    Cow::Owned(format!("{}{CUT_MARKER}", &text[..end]))
}

/// `value` in double quotes with Rust's escapes (`"a\u{7f}"`), cut first to [`MAX_QUOTED_BYTES`].
pub(crate) fn quoted(value: &str) -> String {
    format!("{:?}", cut(value, MAX_QUOTED_BYTES))
}

/// Bytes one character takes in JSON, at most: control characters become `\u00XX`.
fn json_width(c: char) -> usize {
    match c {
        '"' | '\\' => 2,
        '\u{0}'..='\u{1f}' => 6,
        c => c.len_utf8(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept() {
        assert_eq!(cut("abc", 3), "abc");
        assert!(matches!(cut("abc", 3), Cow::Borrowed(_)));
    }

    #[test]
    fn long_text_is_cut_within_its_encoded_budget() {
        for text in ["x".repeat(1000), "\u{1}".repeat(1000), "é".repeat(1000), "\"".repeat(1000)] {
            let kept = cut(&text, 100);
            assert!(kept.ends_with(CUT_MARKER), "{kept}");
            let encoded = serde_json::to_string(kept.as_ref()).unwrap();
            assert!(encoded.len() <= 100 + 2, "{} bytes: {encoded}", encoded.len());
        }
    }

    #[test]
    fn quoted_values_are_short() {
        let name = "\u{7f}".repeat(60_000);
        assert!(quoted(&name).len() < 6 * MAX_QUOTED_BYTES);
    }
}
