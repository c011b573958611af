//! The bearer token of `vramtop serve --token-file` and `vramtop --remote --token-file`:
//! read from a file (so it never shows in `ps`), checked in constant time.
//! Must not depend on the HTTP stack beyond a header's bytes.

use std::path::Path;

use subtle::ConstantTimeEq;

use super::TelemetryError;

/// A shared secret that requests must carry as `Authorization: Bearer <token>`.
#[derive(Clone)]
pub struct BearerToken(Vec<u8>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret, not even in a debug dump.
        write!(f, "BearerToken({} bytes)", self.0.len())
    }
}

impl BearerToken {
    /// The token in `text`, trimmed of surrounding whitespace (a trailing newline is
    /// what `echo` and editors leave).
    pub fn parse(text: &str) -> Result<BearerToken, TelemetryError> {
        let token = text.trim();
        if token.is_empty() {
            return Err(TelemetryError::Token {
                path: None,
                why: "is empty: put the token on its first line",
            });
        }
        // RFC 6750's token68 is visible ASCII; anything else could not travel in a header.
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TelemetryError::Token {
                path: None,
                why: "holds spaces, line breaks or non-ASCII characters: a token is one word \
                      of visible ASCII (e.g. from `openssl rand -hex 32`)",
            });
        }
        Ok(BearerToken(token.as_bytes().to_vec()))
    }

    /// Read the token from `path`; the error is one line naming the file.
    pub fn from_file(path: &Path) -> Result<BearerToken, TelemetryError> {
        let text = std::fs::read_to_string(path).map_err(|source| TelemetryError::TokenFile {
            path: path.to_path_buf(),
            source,
        })?;
        BearerToken::parse(&text).map_err(|e| match e {
            TelemetryError::Token { why, .. } => TelemetryError::Token {
                path: Some(path.to_path_buf()),
                why,
            },
            other => other,
        })
    }

    /// Whether the token file can be read by other users (a warning, not an error: the
    /// admin may have meant it, e.g. a group shared with Prometheus).
    pub fn readable_by_others(path: &Path) -> bool {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o004 != 0)
    }

    /// Whether an `Authorization` header value carries this token. The scheme is
    /// case-insensitive (RFC 9110); the token is compared in constant time, so the time
    /// taken says nothing about how much of a guess was right.
    pub fn accepts(&self, header: Option<&[u8]>) -> bool {
        let Some(value) = header else {
            return false;
        };
        let Some((scheme, rest)) = split_scheme(value) else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case(b"bearer") {
            return false;
        }
        rest.trim_ascii().ct_eq(&self.0).into()
    }

    /// The `Authorization` header value a client sends.
    pub fn header_value(&self) -> String {
        format!("Bearer {}", String::from_utf8_lossy(&self.0))
    }
}

fn split_scheme(value: &[u8]) -> Option<(&[u8], &[u8])> {
    let space = value.iter().position(|&b| b == b' ')?;
    Some((&value[..space], &value[space + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_the_exact_token() {
        let token = BearerToken::parse("s3cret-token\n").unwrap();
        assert!(token.accepts(Some(b"Bearer s3cret-token")));
        assert!(token.accepts(Some(b"bearer s3cret-token")));
        assert!(token.accepts(Some(b"BEARER  s3cret-token ")));
        for bad in [
            &b"Bearer s3cret-toke"[..],
            b"Bearer s3cret-tokenx",
            b"Bearer ",
            b"Basic s3cret-token",
            b"s3cret-token",
            b"",
        ] {
            assert!(
                !token.accepts(Some(bad)),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(!token.accepts(None));
    }

    #[test]
    fn refuses_empty_or_spaced_tokens() {
        let said = |text: &str| BearerToken::parse(text).unwrap_err().to_string();
        assert!(said(" \n").contains("empty"));
        assert!(said("two words").contains("one word"));
        assert!(format!("{:?}", BearerToken::parse("abc").unwrap()).contains("3 bytes"));
    }

    #[test]
    fn a_missing_file_is_one_line_naming_it() {
        let err = BearerToken::from_file(Path::new("/nonexistent/vramtop-token"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/nonexistent/vramtop-token: "), "{err}");
        assert_eq!(err.lines().count(), 1);
        // A file that holds no token says which file.
        let empty =
            std::env::temp_dir().join(format!("vramtop-empty-token-{}", std::process::id()));
        std::fs::write(&empty, "\n").unwrap();
        let err = BearerToken::from_file(&empty).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{}: the token is empty: put the token on its first line",
                empty.display()
            )
        );
        let _ = std::fs::remove_file(&empty);
    }
}
