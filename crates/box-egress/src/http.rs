//! HTTP/1.x as far as the proxy needs it: bounded request and response heads (parsed
//! by `httparse`), the absolute-form target, body framing, and forwarding bodies
//! byte-exact under the unit's bandwidth cap.
//!
//! Framing is strict where a parser differential could smuggle a second request past
//! the check: a request with both `Transfer-Encoding` and `Content-Length`, with
//! conflicting lengths, or with a transfer coding other than `chunked` is refused; the
//! request line and headers forwarded upstream are rebuilt, never the raw bytes.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use box_policy::allow::parse_authority;

use crate::limit::TokenBucket;
use crate::{Host, HostError};

/// The bound on a `CONNECT` request head.
pub(crate) const CONNECT_HEAD_LIMIT: usize = 8 * 1024;
/// The bound on any other request head.
pub(crate) const HEAD_LIMIT: usize = 16 * 1024;
/// The bound on an upstream response head (servers send long cookie headers).
pub(crate) const RESPONSE_HEAD_LIMIT: usize = 64 * 1024;
/// Headers per head; more is refused like an over-long head.
const MAX_HEADERS: usize = 128;
/// The bound on one chunk-size or trailer line.
const LINE_LIMIT: usize = 4096;
/// The most read at once when nothing caps the rate: large reads halve the system
/// calls of a bulk download (about 15% less CPU per GiB than 64 KiB in the bench).
pub(crate) const COPY_BUFFER: usize = 256 * 1024;
/// Where a copy buffer starts; it doubles while reads fill it, so an idle or chatty
/// connection never holds the bulk size.
const FIRST_COPY_BUFFER: usize = 16 * 1024;

/// One header as received: name and raw value (httparse has checked both).
pub(crate) type Header = (String, Vec<u8>);

/// A request head.
#[derive(Debug)]
pub(crate) struct RequestHead {
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) minor_version: u8,
    pub(crate) headers: Vec<Header>,
}

/// A response head, with its bytes to forward as they came.
#[derive(Debug)]
pub(crate) struct ResponseHead {
    pub(crate) code: u16,
    pub(crate) minor_version: u8,
    pub(crate) headers: Vec<Header>,
    pub(crate) raw: Vec<u8>,
}

/// Why no head could be read.
#[derive(Debug)]
pub(crate) enum HeadError {
    TooLarge(usize),
    Malformed(String),
    /// The peer closed in the middle of a head.
    Truncated,
    Io(io::Error),
}

/// Why a body could not be forwarded.
#[derive(Debug)]
pub(crate) enum BodyError {
    Malformed(String),
    Io(io::Error),
}

impl From<io::Error> for BodyError {
    fn from(error: io::Error) -> Self {
        Self::Io(error)
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Malformed(detail) => formatter.write_str(detail),
            Self::Io(error) => error.fmt(formatter),
        }
    }
}

/// How a body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    None,
    Length(u64),
    Chunked,
    /// Until the sender closes (responses only).
    UntilClose,
}

/// A reader with a buffer of what was read but not yet used, so a head can be parsed
/// across reads and the bytes after it (a body, a pipelined request, a ClientHello)
/// are kept.
pub(crate) struct Inbound<R> {
    reader: R,
    buffer: Vec<u8>,
    start: usize,
}

impl<R: AsyncRead + Unpin> Inbound<R> {
    pub(crate) fn new(reader: R) -> Self {
        Self {
            reader,
            buffer: Vec::new(),
            start: 0,
        }
    }

    /// A reader whose first bytes were read already.
    pub(crate) fn with_buffered(reader: R, buffer: Vec<u8>) -> Self {
        Self {
            reader,
            buffer,
            start: 0,
        }
    }

    /// What was read and not yet consumed.
    pub(crate) fn buffered(&self) -> &[u8] {
        &self.buffer[self.start..]
    }

    pub(crate) fn consume(&mut self, count: usize) {
        self.start += count;
        if self.start >= self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
        }
    }

    /// Read at most `max` more bytes into the buffer; 0 at end of stream.
    pub(crate) async fn fill(&mut self, max: usize) -> io::Result<usize> {
        if self.start > 0 {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        self.buffer.reserve(max);
        (&mut self.reader)
            .take(max as u64)
            .read_buf(&mut self.buffer)
            .await
    }

    /// Read a request head; `None` when the peer closed before sending a byte of one.
    pub(crate) async fn read_request(&mut self) -> Result<Option<RequestHead>, HeadError> {
        loop {
            let limit = if self.buffered().starts_with(b"CONNECT ") {
                CONNECT_HEAD_LIMIT
            } else {
                HEAD_LIMIT
            };
            if let Some((head, length)) = parse_request(self.buffered(), limit)? {
                self.consume(length);
                return Ok(Some(head));
            }
            if self.fill(HEAD_LIMIT).await.map_err(HeadError::Io)? == 0 {
                return if self.buffered().is_empty() {
                    Ok(None)
                } else {
                    Err(HeadError::Truncated)
                };
            }
        }
    }

    /// Read a response head.
    pub(crate) async fn read_response(&mut self) -> Result<ResponseHead, HeadError> {
        loop {
            if let Some((head, length)) = parse_response(self.buffered())? {
                self.consume(length);
                return Ok(head);
            }
            if self
                .fill(RESPONSE_HEAD_LIMIT)
                .await
                .map_err(HeadError::Io)?
                == 0
            {
                return Err(HeadError::Truncated);
            }
        }
    }

    /// Forward what is buffered, then everything until end of stream.
    pub(crate) async fn forward_to_end<W: AsyncWrite + Unpin>(
        &mut self,
        writer: &mut W,
        bucket: Option<&TokenBucket>,
        sent: &mut u64,
    ) -> io::Result<()> {
        let buffered = self.buffered().len();
        send(writer, &self.buffer[self.start..], bucket, sent).await?;
        self.consume(buffered);
        pump(&mut self.reader, writer, bucket, sent).await
    }

    /// Forward exactly `length` bytes.
    async fn forward_exact<W: AsyncWrite + Unpin>(
        &mut self,
        mut length: u64,
        writer: &mut W,
        bucket: Option<&TokenBucket>,
        sent: &mut u64,
    ) -> Result<(), BodyError> {
        let chunk = bucket.map_or(FIRST_COPY_BUFFER * 4, TokenBucket::chunk);
        while length > 0 {
            if self.buffered().is_empty() && self.fill(chunk).await? == 0 {
                return Err(BodyError::Malformed(format!(
                    "the stream ended {length} bytes before the body did"
                )));
            }
            let take = self
                .buffered()
                .len()
                .min(usize::try_from(length).unwrap_or(usize::MAX))
                .min(chunk);
            send(
                writer,
                &self.buffer[self.start..self.start + take],
                bucket,
                sent,
            )
            .await?;
            self.consume(take);
            length -= take as u64;
        }
        Ok(())
    }

    /// Read one CRLF-terminated line (bounded) and return its length with the CRLF.
    async fn line(&mut self) -> Result<usize, BodyError> {
        loop {
            if let Some(end) = self.buffered().windows(2).position(|pair| pair == b"\r\n") {
                return Ok(end + 2);
            }
            if self.buffered().len() > LINE_LIMIT {
                return Err(BodyError::Malformed(format!(
                    "a chunk line is longer than {LINE_LIMIT} bytes"
                )));
            }
            if self.fill(LINE_LIMIT).await? == 0 {
                return Err(BodyError::Malformed(
                    "the stream ended inside a chunked body".to_owned(),
                ));
            }
        }
    }

    /// Forward a body framed as `body`.
    pub(crate) async fn forward_body<W: AsyncWrite + Unpin>(
        &mut self,
        body: Body,
        writer: &mut W,
        bucket: Option<&TokenBucket>,
        sent: &mut u64,
    ) -> Result<(), BodyError> {
        match body {
            Body::None => Ok(()),
            Body::Length(length) => self.forward_exact(length, writer, bucket, sent).await,
            Body::UntilClose => Ok(self.forward_to_end(writer, bucket, sent).await?),
            Body::Chunked => loop {
                let length = self.line().await?;
                let size = chunk_size(&self.buffered()[..length - 2])?;
                send(
                    writer,
                    &self.buffer[self.start..self.start + length],
                    bucket,
                    sent,
                )
                .await?;
                self.consume(length);
                if size == 0 {
                    // Trailers, up to the empty line.
                    loop {
                        let length = self.line().await?;
                        send(
                            writer,
                            &self.buffer[self.start..self.start + length],
                            bucket,
                            sent,
                        )
                        .await?;
                        self.consume(length);
                        if length == 2 {
                            return Ok(());
                        }
                    }
                }
                self.forward_exact(size + 2, writer, bucket, sent).await?;
            },
        }
    }
}

/// Write `bytes` after taking their tokens, and count them.
pub(crate) async fn send<W: AsyncWrite + Unpin>(
    writer: &mut W,
    bytes: &[u8],
    bucket: Option<&TokenBucket>,
    sent: &mut u64,
) -> io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    if let Some(bucket) = bucket {
        bucket.take(bytes.len()).await;
    }
    writer.write_all(bytes).await?;
    *sent += bytes.len() as u64;
    Ok(())
}

/// Copy until end of stream, then shut down the writer's side.
pub(crate) async fn pump<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    reader: &mut R,
    writer: &mut W,
    bucket: Option<&TokenBucket>,
    sent: &mut u64,
) -> io::Result<()> {
    let most = bucket.map_or(COPY_BUFFER, TokenBucket::chunk);
    let mut buffer = vec![0; most.min(FIRST_COPY_BUFFER)];
    loop {
        let read = reader.read(&mut buffer).await?;
        if read == 0 {
            return writer.shutdown().await;
        }
        send(writer, &buffer[..read], bucket, sent).await?;
        if read == buffer.len() && buffer.len() < most {
            buffer.resize((buffer.len() * 2).min(most), 0);
        }
    }
}

fn chunk_size(line: &[u8]) -> Result<u64, BodyError> {
    let size = line.split(|&b| b == b';').next().unwrap_or(line);
    let malformed = || {
        BodyError::Malformed(format!(
            "{:?} is not a chunk size",
            String::from_utf8_lossy(line)
        ))
    };
    if size.is_empty() || size.len() > 15 || !size.iter().all(u8::is_ascii_hexdigit) {
        return Err(malformed());
    }
    let text = std::str::from_utf8(size).map_err(|_| malformed())?;
    u64::from_str_radix(text, 16).map_err(|_| malformed())
}

fn owned_headers(headers: &[httparse::Header<'_>]) -> Vec<Header> {
    headers
        .iter()
        .map(|header| (header.name.to_owned(), header.value.to_vec()))
        .collect()
}

fn parse_error(error: httparse::Error, limit: usize) -> HeadError {
    match error {
        httparse::Error::TooManyHeaders => HeadError::TooLarge(limit),
        other => HeadError::Malformed(format!("the request head is not HTTP/1.x: {other}")),
    }
}

fn parse_request(bytes: &[u8], limit: usize) -> Result<Option<(RequestHead, usize)>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(bytes) {
        Ok(httparse::Status::Complete(length)) if length <= limit => Ok(Some((
            RequestHead {
                method: request.method.unwrap_or_default().to_owned(),
                target: request.path.unwrap_or_default().to_owned(),
                minor_version: request.version.unwrap_or(1),
                headers: owned_headers(request.headers),
            },
            length,
        ))),
        Ok(httparse::Status::Complete(_)) => Err(HeadError::TooLarge(limit)),
        Ok(httparse::Status::Partial) if bytes.len() >= limit => Err(HeadError::TooLarge(limit)),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(error) => Err(parse_error(error, limit)),
    }
}

fn parse_response(bytes: &[u8]) -> Result<Option<(ResponseHead, usize)>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(bytes) {
        Ok(httparse::Status::Complete(length)) => Ok(Some((
            ResponseHead {
                code: response.code.unwrap_or_default(),
                minor_version: response.version.unwrap_or(1),
                headers: owned_headers(response.headers),
                raw: bytes[..length].to_vec(),
            },
            length,
        ))),
        Ok(httparse::Status::Partial) if bytes.len() >= RESPONSE_HEAD_LIMIT => {
            Err(HeadError::TooLarge(RESPONSE_HEAD_LIMIT))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(error) => Err(HeadError::Malformed(format!(
            "the response head is not HTTP/1.x: {error}"
        ))),
    }
}

/// Every value of the header `name` (case-insensitive).
pub(crate) fn values<'a>(headers: &'a [Header], name: &'a str) -> impl Iterator<Item = &'a [u8]> {
    headers
        .iter()
        .filter(move |(header, _)| header.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_slice())
}

/// Whether a comma-separated header (like `Connection`) carries `token`.
pub(crate) fn has_token(headers: &[Header], name: &str, token: &str) -> bool {
    values(headers, name).any(|value| {
        value
            .split(|&b| b == b',')
            .any(|item| item.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

fn content_length(headers: &[Header]) -> Result<Option<u64>, String> {
    let mut found: Option<u64> = None;
    for value in values(headers, "content-length") {
        for item in value.split(|&b| b == b',') {
            let item = item.trim_ascii();
            let number = std::str::from_utf8(item)
                .ok()
                .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|text| text.parse::<u64>().ok())
                .ok_or_else(|| {
                    format!(
                        "Content-Length {:?} is not a length",
                        String::from_utf8_lossy(item)
                    )
                })?;
            if found.is_some_and(|previous| previous != number) {
                return Err("the request carries two different Content-Length values".to_owned());
            }
            found = Some(number);
        }
    }
    Ok(found)
}

/// The transfer codings, lower case, in order.
fn transfer_codings(headers: &[Header]) -> Vec<String> {
    values(headers, "transfer-encoding")
        .flat_map(|value| value.split(|&b| b == b','))
        .map(|item| String::from_utf8_lossy(item.trim_ascii()).to_ascii_lowercase())
        .collect()
}

/// How a request's body ends; ambiguous framing is refused.
pub(crate) fn request_body(head: &RequestHead) -> Result<Body, String> {
    let codings = transfer_codings(&head.headers);
    let length = content_length(&head.headers)?;
    match (codings.as_slice(), length) {
        ([], None) => Ok(Body::None),
        ([], Some(length)) => Ok(Body::Length(length)),
        ([only], None) if only == "chunked" => Ok(Body::Chunked),
        ([_, ..], Some(_)) => {
            Err("the request carries both Transfer-Encoding and Content-Length".to_owned())
        }
        ([_, ..], None) => Err(format!(
            "Transfer-Encoding {:?} is not accepted; send chunked or a Content-Length",
            codings.join(", ")
        )),
    }
}

/// How a response's body ends (RFC 9112 §6.3).
pub(crate) fn response_body(method: &str, head: &ResponseHead) -> Result<Body, String> {
    if method.eq_ignore_ascii_case("HEAD")
        || (100..200).contains(&head.code)
        || head.code == 204
        || head.code == 304
    {
        return Ok(Body::None);
    }
    let codings = transfer_codings(&head.headers);
    match codings.last() {
        Some(last) if last == "chunked" => Ok(Body::Chunked),
        Some(_) => Ok(Body::UntilClose),
        None => Ok(content_length(&head.headers)?.map_or(Body::UntilClose, Body::Length)),
    }
}

/// Whether the exchange leaves the connection open, by version and `Connection`.
pub(crate) fn keeps_alive(minor_version: u8, headers: &[Header]) -> bool {
    if has_token(headers, "connection", "close") {
        return false;
    }
    minor_version >= 1 || has_token(headers, "connection", "keep-alive")
}

/// An absolute-form request target: `http://authority/path?query`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AbsoluteTarget {
    pub(crate) host: Host,
    pub(crate) port: u16,
    /// The authority as written in the URL, for a `Host` header when the request has none.
    pub(crate) authority: String,
    /// Origin-form: the path and query, at least `/`.
    pub(crate) path: String,
}

/// Why a target is not one the proxy forwards.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TargetError {
    /// Not absolute-form `http://`.
    Form(String),
    /// The authority's host is not one box accepts.
    Host(String, HostError),
}

/// Parse an absolute-form target.
pub(crate) fn absolute_target(target: &str) -> Result<AbsoluteTarget, TargetError> {
    let scheme_end = target.find("://");
    let rest = match scheme_end {
        Some(end) if target[..end].eq_ignore_ascii_case("http") => &target[end + 3..],
        Some(end) if target[..end].eq_ignore_ascii_case("https") => {
            return Err(TargetError::Form(
                "an https:// URL goes through CONNECT host:443, not as a plain request".to_owned(),
            ));
        }
        Some(_) => {
            return Err(TargetError::Form(format!(
                "{target:?} is not an http:// URL; the proxy forwards http:// requests and CONNECT"
            )));
        }
        None => {
            return Err(TargetError::Form(format!(
                "{target:?} is not an absolute http:// URL; send requests to the proxy as GET http://host/path, or CONNECT host:port"
            )));
        }
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.contains('@') {
        return Err(TargetError::Form(
            "user info in the URL (user@host) is not accepted".to_owned(),
        ));
    }
    if path.contains('#') {
        return Err(TargetError::Form(
            "a fragment (#) is not sent in a request".to_owned(),
        ));
    }
    let (host, port) = parse_authority(authority, Some(80))
        .map_err(|error| TargetError::Host(authority.to_owned(), error))?;
    let path = match path {
        "" => "/".to_owned(),
        query if query.starts_with('?') => format!("/{query}"),
        path => path.to_owned(),
    };
    Ok(AbsoluteTarget {
        host,
        port,
        authority: authority.to_owned(),
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn head(text: &str) -> RequestHead {
        parse_request(text.as_bytes(), HEAD_LIMIT)
            .unwrap()
            .unwrap()
            .0
    }

    #[test]
    fn absolute_targets_become_origin_form() {
        let check = |target: &str, expected: (&str, u16, &str)| {
            let parsed = absolute_target(target).unwrap();
            assert_eq!(
                (
                    parsed.host.to_string().as_str(),
                    parsed.port,
                    parsed.path.as_str()
                ),
                expected,
                "{target}"
            );
        };
        check(
            "http://Example.com/a/b?c=d",
            ("example.com", 80, "/a/b?c=d"),
        );
        check("HTTP://example.com", ("example.com", 80, "/"));
        check("http://example.com:8080?x", ("example.com", 8080, "/?x"));
        check("http://[::1]:8080/", ("[::1]", 8080, "/"));
        for bad in [
            "/path",
            "https://example.com/",
            "ftp://example.com/",
            "http://user@example.com/",
            "http://example.com/#frag",
            "http://127.1/",
            "http://2130706433/",
            "http:///path",
            "http://example.com:0/",
        ] {
            assert!(absolute_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ambiguous_request_framing_is_refused() {
        let body = |text: &str| request_body(&head(text));
        assert_eq!(body("GET http://a/ HTTP/1.1\r\n\r\n"), Ok(Body::None));
        assert_eq!(
            body("POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\n\r\n"),
            Ok(Body::Length(5))
        );
        assert_eq!(
            body("POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 5, 5\r\n\r\n"),
            Ok(Body::Length(5))
        );
        assert_eq!(
            body("POST http://a/ HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n"),
            Ok(Body::Chunked)
        );
        for bad in [
            "POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nContent-Length: 0x5\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert!(body(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn heads_are_bounded() {
        let long = format!(
            "GET http://a/ HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(HEAD_LIMIT)
        );
        assert!(matches!(
            parse_request(long.as_bytes(), HEAD_LIMIT),
            Err(HeadError::TooLarge(_))
        ));
        let partial = format!("GET http://a/ HTTP/1.1\r\nX: {}", "a".repeat(HEAD_LIMIT));
        assert!(matches!(
            parse_request(partial.as_bytes(), HEAD_LIMIT),
            Err(HeadError::TooLarge(_))
        ));
        assert!(matches!(
            parse_request(b"GET http://a/ HTTP/1.1\r\n", HEAD_LIMIT),
            Ok(None)
        ));
        assert!(matches!(
            parse_request(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", HEAD_LIMIT),
            Err(HeadError::Malformed(_))
        ));
    }

    #[tokio::test]
    async fn chunked_bodies_are_forwarded_byte_exact_and_end_where_they_end() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let mut inbound = Inbound::new(&body[..]);
        let mut out = Vec::new();
        let mut sent = 0;
        inbound
            .forward_body(Body::Chunked, &mut out, None, &mut sent)
            .await
            .unwrap();
        assert_eq!(out, &body[..body.len() - 4]);
        assert_eq!(sent, out.len() as u64);
        assert_eq!(inbound.buffered(), b"NEXT");
        let mut inbound = Inbound::new(&b"zz\r\n"[..]);
        assert!(
            inbound
                .forward_body(Body::Chunked, &mut Vec::new(), None, &mut 0)
                .await
                .is_err()
        );
    }

    #[test]
    fn response_framing_follows_the_rfc() {
        let response = |text: &str| parse_response(text.as_bytes()).unwrap().unwrap().0;
        let framing = |method, text| response_body(method, &response(text));
        assert_eq!(
            framing("GET", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"),
            Ok(Body::Length(3))
        );
        assert_eq!(
            framing("HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"),
            Ok(Body::None)
        );
        assert_eq!(
            framing("GET", "HTTP/1.1 204 No Content\r\n\r\n"),
            Ok(Body::None)
        );
        assert_eq!(
            framing("GET", "HTTP/1.1 200 OK\r\n\r\n"),
            Ok(Body::UntilClose)
        );
        assert_eq!(
            framing(
                "GET",
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
            ),
            Ok(Body::Chunked)
        );
        assert!(keeps_alive(1, &[]));
        assert!(!keeps_alive(0, &[]));
        assert!(!keeps_alive(
            1,
            &[("Connection".to_owned(), b"Close".to_vec())]
        ));
        assert!(keeps_alive(
            0,
            &[("connection".to_owned(), b"keep-alive".to_vec())]
        ));
    }
}
