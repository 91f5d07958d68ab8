//! `%XX` decoding: the one way herald reads a percent-encoded part of a URI (a file or k8s
//! URI's path and query, a notice's URI, a NATS URL's user and password). Each caller says
//! what went wrong in its own words; `+` is a space only where the caller says so (a query).

/// Why a string does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undecodable {
    /// A `%` not followed by two hex digits.
    Escape,
    /// The bytes decoded are not UTF-8.
    Utf8,
}

/// `s` with each `%XX` replaced by the byte it names.
pub fn decode(s: &str) -> Result<String, Undecodable> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = |at: usize| b.get(at).and_then(|c| (*c as char).to_digit(16));
            let (Some(h), Some(l)) = (hex(i + 1), hex(i + 2)) else {
                return Err(Undecodable::Escape);
            };
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| Undecodable::Utf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_decode_and_bad_ones_are_told_apart() {
        assert_eq!(decode("/a%20b/%C3%A9").as_deref(), Ok("/a b/é"));
        assert_eq!(decode("p%40ss%3Aword").as_deref(), Ok("p@ss:word"));
        assert_eq!(decode("a+b").as_deref(), Ok("a+b"));
        assert_eq!(decode("").as_deref(), Ok(""));
        for bad in ["%", "%2", "a%zz", "%+1", "%é1"] {
            assert_eq!(decode(bad), Err(Undecodable::Escape), "{bad}");
        }
        assert_eq!(decode("/a%FF"), Err(Undecodable::Utf8));
    }
}
