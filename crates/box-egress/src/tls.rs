//! Reading the server name out of a TLS ClientHello, without a TLS stack.
//!
//! The ClientHello is one handshake message, but it may be fragmented over several TLS
//! records (a post-quantum key share alone exceeds one MTU, and nothing stops a client
//! from cutting records small), and the records over any number of TCP reads. So the
//! parser is incremental: it is handed everything read so far and says "need more",
//! "here is the hello", or "this is not a ClientHello".

/// The largest ClientHello read (a real one is under 2 KiB; 64 KiB leaves room for
/// large key shares and padding without letting a client make the proxy buffer much).
pub(crate) const MAX_CLIENT_HELLO: usize = 64 * 1024;

const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const SERVER_NAME_HOST: u8 = 0;
/// Records carry at most 2^14 bytes of plaintext (RFC 8446 §5.1).
const MAX_RECORD: usize = 1 << 14;

/// What the bytes read so far are.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hello {
    /// A ClientHello so far; read more.
    Incomplete,
    /// The whole ClientHello, with its server name (case-folded, without a trailing
    /// dot) if it sent one.
    Complete { server_name: Option<String> },
}

/// Why the bytes are not a ClientHello box accepts.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HelloError {
    /// The first bytes are not a TLS handshake record.
    NotTls,
    /// A TLS handshake, but not a well-formed ClientHello.
    Invalid(String),
}

/// Whether `bytes` begin like a TLS handshake record (type 22, version 3.x); two
/// bytes decide it.
pub(crate) fn starts_like_tls(bytes: &[u8]) -> bool {
    match bytes {
        [] => false,
        [first] => *first == RECORD_HANDSHAKE,
        [first, major, ..] => *first == RECORD_HANDSHAKE && *major == 3,
    }
}

/// Reads a ClientHello record by record as bytes arrive; each record is looked at
/// once, so a client writing one byte at a time costs linear work.
#[derive(Debug, Default)]
pub(crate) struct HelloParser {
    /// The handshake bytes gathered from the records so far.
    handshake: Vec<u8>,
    /// How many input bytes those records took.
    offset: usize,
}

impl HelloParser {
    /// Look at `bytes`, every byte the client sent so far (each call's `bytes` extends
    /// the previous call's).
    pub(crate) fn advance(&mut self, bytes: &[u8]) -> Result<Hello, HelloError> {
        if self.offset == 0 && !starts_like_tls(bytes) {
            return if bytes.is_empty() {
                Ok(Hello::Incomplete)
            } else {
                Err(HelloError::NotTls)
            };
        }
        loop {
            if self.handshake.len() >= 4 {
                if self.handshake[0] != HANDSHAKE_CLIENT_HELLO {
                    return Err(invalid(format!(
                        "the first handshake message is of type {}, not a ClientHello",
                        self.handshake[0]
                    )));
                }
                let length = usize::from(self.handshake[1]) << 16
                    | usize::from(self.handshake[2]) << 8
                    | usize::from(self.handshake[3]);
                if length > MAX_CLIENT_HELLO {
                    return Err(invalid(format!(
                        "it is {length} bytes long, more than the {MAX_CLIENT_HELLO} read"
                    )));
                }
                if self.handshake.len() >= 4 + length {
                    let server_name = server_name(&self.handshake[4..4 + length])?;
                    return Ok(Hello::Complete { server_name });
                }
            }
            let Some(header) = bytes.get(self.offset..self.offset + 5) else {
                return Ok(Hello::Incomplete);
            };
            if header[0] != RECORD_HANDSHAKE || header[1] != 3 {
                return Err(invalid(format!(
                    "a record of type {} version {}.{} interrupts the ClientHello",
                    header[0], header[1], header[2]
                )));
            }
            let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
            if length == 0 || length > MAX_RECORD {
                return Err(invalid(format!(
                    "a handshake record is {length} bytes long"
                )));
            }
            let Some(fragment) = bytes.get(self.offset + 5..self.offset + 5 + length) else {
                return Ok(Hello::Incomplete);
            };
            self.handshake.extend_from_slice(fragment);
            self.offset += 5 + length;
        }
    }
}

/// Parse a ClientHello from all of `bytes` at once.
#[cfg(test)]
pub(crate) fn parse_client_hello(bytes: &[u8]) -> Result<Hello, HelloError> {
    HelloParser::default().advance(bytes)
}

fn invalid(detail: String) -> HelloError {
    HelloError::Invalid(detail)
}

/// A cursor over the ClientHello body; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize, what: &str) -> Result<&'a [u8], HelloError> {
        if self.bytes.len() < count {
            return Err(invalid(format!("it ends inside its {what}")));
        }
        let (head, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &str) -> Result<u8, HelloError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, HelloError> {
        let bytes = self.take(2, what)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn vector8(&mut self, what: &str) -> Result<&'a [u8], HelloError> {
        let length = usize::from(self.u8(what)?);
        self.take(length, what)
    }

    fn vector16(&mut self, what: &str) -> Result<&'a [u8], HelloError> {
        let length = usize::from(self.u16(what)?);
        self.take(length, what)
    }
}

/// The server name of a ClientHello body (after the handshake header).
fn server_name(body: &[u8]) -> Result<Option<String>, HelloError> {
    let mut reader = Reader { bytes: body };
    reader.take(2, "version")?;
    reader.take(32, "random")?;
    reader.vector8("session id")?;
    reader.vector16("cipher suites")?;
    reader.vector8("compression methods")?;
    if reader.bytes.is_empty() {
        return Ok(None);
    }
    let extensions = reader.vector16("extensions")?;
    if !reader.bytes.is_empty() {
        return Err(invalid("it has bytes after its extensions".to_owned()));
    }
    let mut extensions = Reader { bytes: extensions };
    let mut found: Option<String> = None;
    while !extensions.bytes.is_empty() {
        let kind = extensions.u16("extension type")?;
        let data = extensions.vector16("extension")?;
        if kind != EXTENSION_SERVER_NAME {
            continue;
        }
        // Two server names would let the proxy judge one and the server serve the other.
        if found.is_some() {
            return Err(invalid("it carries two server_name extensions".to_owned()));
        }
        let mut list = Reader { bytes: data };
        let mut names = Reader {
            bytes: list.vector16("server name list")?,
        };
        if !list.bytes.is_empty() {
            return Err(invalid(
                "its server_name extension has trailing bytes".to_owned(),
            ));
        }
        while !names.bytes.is_empty() {
            let kind = names.u8("server name type")?;
            let name = names.vector16("server name")?;
            if kind != SERVER_NAME_HOST {
                continue;
            }
            if found.is_some() {
                return Err(invalid("it names two servers".to_owned()));
            }
            let Ok(name) = std::str::from_utf8(name) else {
                return Err(invalid("its server name is not ASCII".to_owned()));
            };
            if !name.is_ascii() || name.is_empty() {
                return Err(invalid("its server name is not ASCII".to_owned()));
            }
            let lower = name.to_ascii_lowercase();
            found = Some(lower.strip_suffix('.').unwrap_or(&lower).to_owned());
        }
    }
    Ok(found)
}

#[cfg(test)]
#[path = "../tests/it/client_hello.rs"]
mod client_hello;

#[cfg(test)]
mod tests {
    use super::client_hello::ClientHello;
    use super::*;
    use pretty_assertions::assert_eq;

    fn complete(name: Option<&str>) -> Result<Hello, HelloError> {
        Ok(Hello::Complete {
            server_name: name.map(str::to_owned),
        })
    }

    #[test]
    fn the_server_name_is_read_case_folded() {
        let hello = ClientHello::new(Some("Example.COM.")).bytes();
        assert_eq!(parse_client_hello(&hello), complete(Some("example.com")));
        let hello = ClientHello::new(None).bytes();
        assert_eq!(parse_client_hello(&hello), complete(None));
    }

    #[test]
    fn every_prefix_is_incomplete_and_records_may_be_split() {
        let hello = ClientHello::new(Some("example.com")).padding(3000).bytes();
        let mut parser = HelloParser::default();
        for end in 0..hello.len() {
            assert_eq!(
                parse_client_hello(&hello[..end]),
                Ok(Hello::Incomplete),
                "{end}"
            );
            assert_eq!(
                parser.advance(&hello[..end]),
                Ok(Hello::Incomplete),
                "{end}"
            );
        }
        assert_eq!(parser.advance(&hello), complete(Some("example.com")));
        for fragment in [1, 7, 100, 1000] {
            let split = ClientHello::new(Some("example.com"))
                .padding(3000)
                .records(fragment);
            assert_eq!(
                parse_client_hello(&split),
                complete(Some("example.com")),
                "{fragment}"
            );
        }
    }

    #[test]
    fn what_is_not_a_client_hello_is_refused() {
        assert_eq!(
            parse_client_hello(b"GET / HTTP/1.1\r\n"),
            Err(HelloError::NotTls)
        );
        assert_eq!(parse_client_hello(b"\x16\x02"), Err(HelloError::NotTls));
        assert_eq!(parse_client_hello(b""), Ok(Hello::Incomplete));
        // A ServerHello (type 2) where a ClientHello belongs.
        let mut hello = ClientHello::new(Some("example.com")).bytes();
        hello[5] = 2;
        assert!(matches!(
            parse_client_hello(&hello),
            Err(HelloError::Invalid(_))
        ));
        // An alert record in the middle of a fragmented hello.
        let split = ClientHello::new(Some("example.com")).records(50);
        let mut interrupted = split[..55].to_vec();
        interrupted.extend_from_slice(b"\x15\x03\x03\x00\x02\x02\x28");
        assert!(matches!(
            parse_client_hello(&interrupted),
            Err(HelloError::Invalid(_))
        ));
        // A body that ends inside its extensions.
        let truncated = ClientHello::new(Some("example.com")).cut(3).bytes();
        assert!(matches!(
            parse_client_hello(&truncated),
            Err(HelloError::Invalid(_))
        ));
        // Two server names.
        let doubled = ClientHello::new(Some("a.test"))
            .extra_server_name("b.test")
            .bytes();
        assert!(matches!(
            parse_client_hello(&doubled),
            Err(HelloError::Invalid(_))
        ));
        // A record of length zero.
        assert!(matches!(
            parse_client_hello(b"\x16\x03\x01\x00\x00"),
            Err(HelloError::Invalid(_))
        ));
    }
}
