//! A certificate's validity period, read from its DER without an X.509
//! library: just enough of RFC 5280 to tell an operator that the client
//! certificate a server refused had expired (or was not valid yet), which
//! the server's alert (`BadCertificate`) does not say.
//!
//! Layout walked: `Certificate ::= SEQUENCE { tbsCertificate SEQUENCE {
//! [0] version OPTIONAL, serialNumber INTEGER, signature SEQUENCE, issuer
//! SEQUENCE, validity SEQUENCE { notBefore Time, notAfter Time }, ... } }`,
//! `Time ::= UTCTime (YYMMDDHHMMSSZ) | GeneralizedTime (YYYYMMDDHHMMSSZ)`.
//! Anything else (a truncated length, an unexpected tag, a time with
//! fractions or an offset) gives `None`: the caller then says nothing about
//! validity rather than something wrong.

use std::fmt;

/// One instant of a certificate's validity, in UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct CertTime {
    /// Seconds since the Unix epoch (negative before 1970).
    pub(crate) unix: i64,
    fields: [u32; 6],
}

impl fmt::Display for CertTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [y, mo, d, h, mi, s] = self.fields;
        write!(f, "{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02} UTC")
    }
}

/// `(notBefore, notAfter)` of the DER certificate `der`.
pub(crate) fn validity(der: &[u8]) -> Option<(CertTime, CertTime)> {
    let (cert, _) = tlv(der, 0x30)?;
    let (tbs, _) = tlv(cert, 0x30)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = skip(rest)?;
    }
    for _ in 0..3 {
        // serialNumber, signature, issuer
        rest = skip(rest)?;
    }
    let (validity, _) = tlv(rest, 0x30)?;
    let (not_before, rest) = time(validity)?;
    let (not_after, _) = time(rest)?;
    Some((not_before, not_after))
}

/// The content of the TLV at the start of `buf` if its tag is `tag`, and
/// what follows it.
fn tlv(buf: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (found, content, rest) = any_tlv(buf)?;
    (found == tag).then_some((content, rest))
}

fn skip(buf: &[u8]) -> Option<&[u8]> {
    any_tlv(buf).map(|(_, _, rest)| rest)
}

fn any_tlv(buf: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = buf.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, rest) = rest.split_at(n);
        let len = bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, rest)
    };
    if rest.len() < len {
        return None;
    }
    let (content, rest) = rest.split_at(len);
    Some((tag, content, rest))
}

fn time(buf: &[u8]) -> Option<(CertTime, &[u8])> {
    let (tag, content, rest) = any_tlv(buf)?;
    let text = std::str::from_utf8(content).ok()?;
    let digits = text.strip_suffix('Z')?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (year, digits) = match (tag, digits.len()) {
        // UTCTime: YY >= 50 is 19YY (RFC 5280 4.1.2.5.1).
        (0x17, 12) => {
            let yy: u32 = digits[..2].parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &digits[2..])
        }
        (0x18, 14) => (digits[..4].parse().ok()?, &digits[4..]),
        _ => return None,
    };
    let field = |i: usize| -> Option<u32> { digits.get(i..i + 2)?.parse().ok() };
    let fields = [year, field(0)?, field(2)?, field(4)?, field(6)?, field(8)?];
    let [y, mo, d, h, mi, s] = fields;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(i64::from(y), i64::from(mo), i64::from(d));
    let unix = days * 86_400 + i64::from(h) * 3_600 + i64::from(mi) * 60 + i64::from(s);
    Some((CertTime { unix, fields }, rest))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`); the inputs are bounded above, so nothing overflows.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2026, 12, 1), 20_788);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
    }

    /// A DER SEQUENCE around `parts`.
    fn seq(parts: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = parts.concat();
        der(0x30, &body)
    }

    fn der(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        if body.len() < 0x80 {
            out.push(body.len() as u8);
        } else {
            out.push(0x82);
            out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(body);
        out
    }

    fn cert(not_before: Vec<u8>, not_after: Vec<u8>) -> Vec<u8> {
        let tbs = seq(&[
            der(0xa0, &der(0x02, &[2])),
            der(0x02, &[1, 2, 3]),
            seq(&[der(0x06, &[42])]),
            seq(&[der(0x31, &[0; 200])]),
            seq(&[not_before, not_after]),
            seq(&[]),
        ]);
        seq(&[tbs, seq(&[]), der(0x03, &[0])])
    }

    #[test]
    fn reads_utc_and_generalized_times() {
        let c = cert(der(0x17, b"991231235959Z"), der(0x18, b"20500101000000Z"));
        let (before, after) = validity(&c).expect("a validity");
        assert_eq!(before.to_string(), "1999-12-31 23:59:59 UTC");
        assert_eq!(after.to_string(), "2050-01-01 00:00:00 UTC");
        assert_eq!(after.unix, 2_524_608_000);
        let c = cert(der(0x17, b"200101000000Z"), der(0x17, b"490101000000Z"));
        assert_eq!(
            validity(&c).map(|(_, a)| a.to_string()),
            Some("2049-01-01 00:00:00 UTC".into())
        );
    }

    #[test]
    fn anything_unexpected_is_none_never_a_panic() {
        let good = cert(der(0x17, b"200101000000Z"), der(0x17, b"300101000000Z"));
        for cut in 0..good.len() {
            // Every truncation, and every single-byte corruption.
            let _ = validity(&good[..cut]);
            let mut bad = good.clone();
            bad[cut] ^= 0xff;
            let _ = validity(&bad);
        }
        assert_eq!(validity(&good[..good.len() / 2]), None);
        let offset = cert(der(0x17, b"200101000000+0100"), der(0x17, b"300101000000Z"));
        assert_eq!(validity(&offset), None);
        let month13 = cert(der(0x17, b"201301000000Z"), der(0x17, b"300101000000Z"));
        assert_eq!(validity(&month13), None);
    }
}
