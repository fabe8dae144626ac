//! The `wirepool-timeout` request header: a duration with a unit.

use std::time::Duration;

/// Parses a timeout such as `250ms`, `2s`, `1500u` or `5M`.
///
/// The value is 1 to 12 ASCII digits followed by a unit: `ns`, `us`, `ms`, `s`, `h`, or the
/// gRPC letters `n` (nanoseconds), `u` (microseconds), `m` (milliseconds), `S` (seconds),
/// `M` (minutes), `H` (hours). Anything else is `None`.
///
/// ```
/// use std::time::Duration;
/// use wirepool_gateway::parse_timeout;
/// assert_eq!(parse_timeout("250ms"), Some(Duration::from_millis(250)));
/// assert_eq!(parse_timeout("250m"), Some(Duration::from_millis(250))); // gRPC style
/// assert_eq!(parse_timeout("2S"), Some(Duration::from_secs(2)));
/// assert_eq!(parse_timeout("5M"), Some(Duration::from_secs(300)));
/// assert_eq!(parse_timeout("soon"), None);
/// ```
pub fn parse_timeout(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() || digits.len() > 12 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "n" | "ns" => Duration::from_nanos(n),
        "u" | "us" => Duration::from_micros(n),
        "m" | "ms" => Duration::from_millis(n),
        "S" | "s" => Duration::from_secs(n),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "H" | "h" => Duration::from_secs(n.checked_mul(3600)?),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_bad_values() {
        assert_eq!(parse_timeout("7n"), Some(Duration::from_nanos(7)));
        assert_eq!(parse_timeout("7us"), Some(Duration::from_micros(7)));
        assert_eq!(parse_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_timeout("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_timeout("0ms"), Some(Duration::ZERO));
        for bad in [
            "",
            "ms",
            "10",
            "-1s",
            "1.5s",
            "1 s",
            "1sec",
            "1234567890123s",
            "1\u{e9}",
        ] {
            assert_eq!(parse_timeout(bad), None, "{bad:?}");
        }
    }
}
