//! Parsing of byte sizes and durations as people write them.
//!
//! Byte sizes accept plain bytes (`1048576`), IEC units (`512KiB`, `512MiB`, `2GiB`,
//! `1TiB`), Kubernetes binary quantities (`64Ki`, `512Mi`, `2Gi`, `1Ti`) and SI units
//! (`500k`/`500K`/`500KB`, `500M`/`500MB`, `2G`/`2GB`, `1T`/`1TB`). Durations use
//! humantime syntax (`30s`, `15m`, `1h`, `1h 30m`, `2days`). Pure; no I/O.

use std::time::Duration;

/// A size or duration string that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string is not a byte size.
    #[error(
        "'{input}' is not a byte size: use a whole number with an optional unit, e.g. 512MiB, 64Mi, 2G or 1048576"
    )]
    InvalidBytes {
        /// The rejected input.
        input: String,
    },
    /// The byte size does not fit in 64 bits.
    #[error("'{input}' is too large a byte size")]
    BytesOverflow {
        /// The rejected input.
        input: String,
    },
    /// The string is not a duration.
    #[error("'{input}' is not a duration: use e.g. 30s, 15m, 1h or 2days")]
    InvalidDuration {
        /// The rejected input.
        input: String,
    },
}

/// Parses a byte size such as `512MiB`, `64Mi`, `2G` or `1048576`.
///
/// # Errors
/// [`QuantityError::InvalidBytes`] for anything else (negative numbers, fractions,
/// unknown units), [`QuantityError::BytesOverflow`] past `u64::MAX`.
pub fn parse_bytes(input: &str) -> Result<u64, QuantityError> {
    let trimmed = input.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let invalid = || QuantityError::InvalidBytes {
        input: input.to_owned(),
    };
    if digits.is_empty() {
        return Err(invalid());
    }
    let value: u64 = digits.parse().map_err(|_| QuantityError::BytesOverflow {
        input: input.to_owned(),
    })?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        "Ti" | "TiB" => 1 << 40,
        "k" | "K" | "KB" | "kB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        _ => return Err(invalid()),
    };
    value
        .checked_mul(multiplier)
        .ok_or_else(|| QuantityError::BytesOverflow {
            input: input.to_owned(),
        })
}

/// Formats a byte count with the largest IEC unit that divides it exactly.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (size, unit) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

/// Parses a duration such as `30s`, `15m`, `1h` or `1h 30m`.
///
/// # Errors
/// [`QuantityError::InvalidDuration`] when humantime cannot read it.
pub fn parse_duration(input: &str) -> Result<Duration, QuantityError> {
    humantime::parse_duration(input.trim()).map_err(|_| QuantityError::InvalidDuration {
        input: input.to_owned(),
    })
}

/// Formats a duration the way [`parse_duration`] reads it back (`1h 30m`).
pub fn format_duration(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_in_every_accepted_unit() {
        assert_eq!(parse_bytes("1048576"), Ok(1_048_576));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("64Mi"), Ok(64 << 20));
        assert_eq!(parse_bytes("2Gi"), Ok(2 << 30));
        assert_eq!(parse_bytes("1TiB"), Ok(1 << 40));
        assert_eq!(parse_bytes("4KiB"), Ok(4096));
        assert_eq!(parse_bytes("2G"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("500k"), Ok(500_000));
        assert_eq!(parse_bytes(" 10 MB "), Ok(10_000_000));
    }

    #[test]
    fn bad_byte_sizes_are_refused_with_the_input_named() {
        for bad in ["", "MiB", "-5", "1.5GiB", "12 parsecs", "0x10"] {
            let err = parse_bytes(bad).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
        assert!(matches!(
            parse_bytes("99999999999TiB"),
            Err(QuantityError::BytesOverflow { .. })
        ));
    }

    #[test]
    fn byte_sizes_format_and_parse_back() {
        for bytes in [0, 1, 1000, 4096, 512 << 20, 3 << 30, (1 << 40) + 1] {
            assert_eq!(parse_bytes(&format_bytes(bytes)), Ok(bytes));
        }
        assert_eq!(format_bytes(512 << 20), "512MiB");
    }

    #[test]
    fn durations_parse_and_format_back() {
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(
            parse_duration(&format_duration(Duration::from_secs(90))),
            Ok(Duration::from_secs(90))
        );
        assert!(parse_duration("soon").is_err());
    }
}
