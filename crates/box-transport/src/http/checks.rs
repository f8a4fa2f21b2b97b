//! The request checks: Host, Origin, the bearer token, the session and
//! protocol-version headers, the bounded body, and the ask a request makes
//! through its path and `Box-*` headers.

use super::*;

pub(super) const LOOPBACK_NAMES: [&str; 4] = ["localhost", "127.0.0.1", "::1", "[::1]"];

/// Split `host[:port]` (brackets kept off IPv6).
pub(super) fn host_part(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => authority,
    }
}

pub(super) fn host_is_allowed(options: &HttpOptions, authority: &str) -> bool {
    let host = host_part(authority).to_ascii_lowercase();
    if LOOPBACK_NAMES.contains(&host.as_str()) {
        return true;
    }
    if let Ok(ip) = host.parse::<IpAddr>()
        && ip.is_loopback()
    {
        return true;
    }
    options.allowed_hosts.iter().any(|allowed| {
        allowed.eq_ignore_ascii_case(authority) || allowed.eq_ignore_ascii_case(&host)
    })
}

pub(super) fn origin_is_allowed(options: &HttpOptions, origin: &str) -> bool {
    if options
        .allowed_origins
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    (scheme == "http" || scheme == "https")
        && !authority.contains('/')
        && !authority.contains('@')
        && host_is_allowed(
            &HttpOptions {
                allowed_hosts: Vec::new(),
                ..options.clone()
            },
            authority,
        )
}

/// Equal in constant time: both sides are hashed first, so neither the
/// position of the first difference nor the token's length leaks.
pub(super) fn token_matches(given: &str, expected: &str) -> bool {
    let given = Sha256::digest(given.as_bytes());
    let expected = Sha256::digest(expected.as_bytes());
    given
        .iter()
        .zip(expected.iter())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

/// Whether a request must carry the bearer token (when one is configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Auth {
    /// Everything but the probes.
    Required,
    /// `/healthz` and `/readyz`: they reveal nothing, and a probe (a load
    /// balancer's, the kubelet's) carries no token.
    Probe,
}

/// What the bearer token check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bearer {
    /// No token is configured, or the request carries it.
    Valid,
    /// The request carries no token.
    Missing,
    /// The request carries another token.
    Wrong,
}

pub(super) fn bearer(options: &HttpOptions, headers: &HeaderMap) -> Bearer {
    let Some(expected) = &options.token else {
        return Bearer::Valid;
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))
        });
    match given {
        None => Bearer::Missing,
        Some(given) if token_matches(given.trim(), expected) => Bearer::Valid,
        Some(_) => Bearer::Wrong,
    }
}

/// A header value as a log may quote it: at most 200 bytes, escaped.
pub(super) fn quoted(value: &HeaderValue) -> String {
    let text = String::from_utf8_lossy(value.as_bytes());
    let cut: String = text.chars().take(200).collect();
    format!("{cut:?}")
}

/// Host, Origin and (as `auth` says) bearer checks, in that order; a refusal
/// is the answer and what the host is told of it.
pub(super) fn check_request(
    options: &HttpOptions,
    headers: &HeaderMap,
    auth: Auth,
) -> Result<(), (Response, RefusalReason, String)> {
    let host = headers.get(header::HOST);
    let host_text = host.and_then(|value| value.to_str().ok());
    match host_text {
        Some(host) if host_is_allowed(options, host) => {}
        _ => {
            let detail = match host {
                Some(host) => format!("Host {} is not served here", quoted(host)),
                None => "no Host header".to_owned(),
            };
            return Err((
                refuse(
                    StatusCode::MISDIRECTED_REQUEST,
                    code::INVALID_REQUEST,
                    "the Host header names a host this server does not serve (DNS rebinding guard); see --allow-host",
                ),
                RefusalReason::Host,
                detail,
            ));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let allowed = origin
            .to_str()
            .is_ok_and(|origin| origin_is_allowed(options, origin));
        if !allowed {
            return Err((
                refuse(
                    StatusCode::FORBIDDEN,
                    code::INVALID_REQUEST,
                    "the Origin is not allowed; see --allow-origin",
                ),
                RefusalReason::Origin,
                format!("Origin {} is not allowed (--allow-origin)", quoted(origin)),
            ));
        }
    }
    if auth == Auth::Probe {
        return Ok(());
    }
    let (challenge, detail) = match bearer(options, headers) {
        Bearer::Valid => return Ok(()),
        Bearer::Missing => (
            "Bearer realm=\"box\"",
            "no bearer token in the Authorization header",
        ),
        Bearer::Wrong => (
            "Bearer realm=\"box\", error=\"invalid_token\"",
            "a wrong bearer token",
        ),
    };
    let mut response = refuse(
        StatusCode::UNAUTHORIZED,
        code::INVALID_REQUEST,
        "a bearer token is required in the Authorization header (never in the URL)",
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    Err((response, RefusalReason::Unauthorized, detail.to_owned()))
}

impl AppState {
    /// [`check_request`] for a request to `path`; a refusal is reported to
    /// the host before it is answered.
    pub(super) fn check(
        &self,
        headers: &HeaderMap,
        path: &str,
        auth: Auth,
    ) -> Result<(), Response> {
        check_request(&self.options, headers, auth).map_err(|(response, reason, detail)| {
            self.sessions_factory.refused(&Refusal {
                reason,
                status: response.status().as_u16(),
                path: path.to_owned(),
                detail,
            });
            response
        })
    }
}

pub(super) fn session_header(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SESSION_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

/// Whether a request must carry `MCP-Protocol-Version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    /// POSTs on a session that negotiated 2025-06-18 or later: every SDK
    /// sends it there, and security case E63 asks for 400 when it is missing.
    Required,
    /// POSTs on an older session (the header did not exist yet; the
    /// negotiated version governs), and GET: some clients (TypeScript) send
    /// only `Accept` there; a missing header means 2025-03-26, which box serves.
    Optional,
}

/// 400 listing the supported versions for an unsupported (or, where required,
/// missing) `MCP-Protocol-Version`.
pub(super) fn check_version(headers: &HeaderMap, need: Version) -> Result<(), Response> {
    let version = match headers.get(VERSION_HEADER) {
        Some(value) => value.to_str().unwrap_or(""),
        None if need == Version::Optional => return Ok(()),
        None => "",
    };
    if SUPPORTED_VERSIONS.contains(&version) {
        return Ok(());
    }
    Err(json_response(
        StatusCode::BAD_REQUEST,
        json!({"jsonrpc": "2.0", "id": null, "error": {
            "code": code::INVALID_REQUEST,
            "message": if version.is_empty() {
                format!("MCP-Protocol-Version is missing; send the negotiated one of: {}", SUPPORTED_VERSIONS.join(", "))
            } else {
                format!("unsupported MCP-Protocol-Version {version:?}; supported: {}", SUPPORTED_VERSIONS.join(", "))
            },
            "data": {"supported": SUPPORTED_VERSIONS, "requested": version},
        }}),
    ))
}

pub(super) fn mint_session_id() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    hex::encode(bytes)
}

pub(super) async fn read_body(
    options: &HttpOptions,
    headers: &HeaderMap,
    body: Body,
) -> Result<Value, Response> {
    let too_large = || {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            code::INVALID_REQUEST,
            format!("the body is larger than {} bytes", options.max_body_bytes),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > options.max_body_bytes as u64) {
        return Err(too_large());
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    if !content_type
        .split(';')
        .next()
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
    {
        return Err(refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code::INVALID_REQUEST,
            "Content-Type must be application/json",
        ));
    }
    let bytes = match tokio::time::timeout(
        options.body_read_timeout,
        axum::body::to_bytes(body, options.max_body_bytes),
    )
    .await
    {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => return Err(too_large()),
        Err(_) => {
            return Err(refuse(
                StatusCode::REQUEST_TIMEOUT,
                code::INVALID_REQUEST,
                format!(
                    "the body did not arrive within {}",
                    humantime::format_duration(options.body_read_timeout)
                ),
            ));
        }
    };
    serde_json::from_slice(&bytes).map_err(|error| {
        refuse(
            StatusCode::BAD_REQUEST,
            code::PARSE_ERROR,
            format!("the body is not JSON: {error}"),
        )
    })
}

/// One `Box-*` header's value: absent, or given once as UTF-8 text.
pub(super) fn ask_header(
    headers: &HeaderMap,
    name: &str,
    shown: &str,
) -> Result<Option<AskPart>, String> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let source = format!("the {shown} header");
    if values.next().is_some() {
        return Err(format!("{source} is given more than once; send it once"));
    }
    let text =
        std::str::from_utf8(value.as_bytes()).map_err(|_| format!("{source} is not UTF-8 text"))?;
    Ok(Some(AskPart::new(text, source)))
}

/// What a request asks through HTTP: the path's profile (`/mcp/p/{profile}`)
/// or `Box-Profile` (the same when both are given), `Box-Tighten`,
/// `Box-Max-Read-Bytes`. Their meaning is the host's to check; here only
/// their form (each header once, UTF-8, the path and header agreeing).
pub(super) fn transport_ask(
    path_profile: Option<&str>,
    headers: &HeaderMap,
) -> Result<TransportAsk, String> {
    let header_profile = ask_header(headers, PROFILE_HEADER, "Box-Profile")?;
    let profile = match (path_profile, header_profile) {
        (Some(path), Some(header)) if header.text != path => {
            return Err(format!(
                "box.profile: the path /mcp/p/{path} asks for `{path}` but {} asks for `{}`; ask in one place, or the same in both",
                header.source, header.text
            ));
        }
        (Some(path), _) => Some(AskPart::new(path, format!("the path /mcp/p/{path}"))),
        (None, header) => header,
    };
    Ok(TransportAsk {
        profile,
        tighten: ask_header(headers, TIGHTEN_HEADER, "Box-Tighten")?,
        max_read_bytes: ask_header(headers, MAX_READ_BYTES_HEADER, "Box-Max-Read-Bytes")?,
        reattach: ask_header(headers, REATTACH_HEADER, "Box-Reattach")?,
    })
}

/// A later request's ask against the session's: each part it gives must be
/// the one the session was started with (the ask is read at initialize only).
pub(super) fn same_ask(session: &TransportAsk, later: &TransportAsk) -> Result<(), String> {
    let parts = [
        ("the profile", &session.profile, &later.profile),
        ("Box-Tighten", &session.tighten, &later.tighten),
        (
            "Box-Max-Read-Bytes",
            &session.max_read_bytes,
            &later.max_read_bytes,
        ),
    ];
    for (name, started, asked) in parts {
        if let Some(asked) = asked
            && started.as_ref().map(|part| &part.text) != Some(&asked.text)
        {
            return Err(format!(
                "{name}: {} differs from what this session was initialized with; a session's ask is read at initialize only and never changes: send the same, or initialize a new session",
                asked.source
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins() {
        let options = HttpOptions::loopback();
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "[::1]:9",
            "127.0.0.2",
        ] {
            assert!(host_is_allowed(&options, host), "{host}");
        }
        for host in ["evil.example", "evil.example:80", "localhost.evil.example"] {
            assert!(!host_is_allowed(&options, host), "{host}");
        }
        for origin in ["http://localhost:3000", "https://127.0.0.1"] {
            assert!(origin_is_allowed(&options, origin), "{origin}");
        }
        for origin in [
            "https://evil.example",
            "null",
            "http://localhost@evil.example",
            "file://",
        ] {
            assert!(!origin_is_allowed(&options, origin), "{origin}");
        }
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(token_matches("secret-token-123456", "secret-token-123456"));
        assert!(!token_matches("secret-token-12345", "secret-token-123456"));
        assert!(!token_matches("", "secret-token-123456"));
    }

    fn headers(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_bytes(value).unwrap());
        }
        map
    }

    #[test]
    fn the_ask_is_read_from_the_path_and_headers_naming_each_source() {
        let ask = transport_ask(
            Some("ci"),
            &headers(&[
                ("box-profile", b"ci"),
                ("box-tighten", br#"{"servers": []}"#),
                ("box-max-read-bytes", b"4096"),
            ]),
        )
        .unwrap();
        assert_eq!(
            ask,
            TransportAsk {
                profile: Some(AskPart::new("ci", "the path /mcp/p/ci")),
                tighten: Some(AskPart::new(r#"{"servers": []}"#, "the Box-Tighten header")),
                max_read_bytes: Some(AskPart::new("4096", "the Box-Max-Read-Bytes header")),
                reattach: None,
            }
        );
        assert!(transport_ask(None, &HeaderMap::new()).unwrap().is_empty());
        let ask = transport_ask(None, &headers(&[("box-profile", b"ci")])).unwrap();
        assert_eq!(
            ask.profile,
            Some(AskPart::new("ci", "the Box-Profile header"))
        );
        // UTF-8 in a header is text (a tightening may name anything).
        let ask = transport_ask(None, &headers(&[("box-tighten", "\"é\"".as_bytes())])).unwrap();
        assert_eq!(ask.tighten.unwrap().text, "\"é\"");
    }

    #[test]
    fn a_malformed_ask_is_refused_naming_the_header() {
        for (path, pairs, expected) in [
            (
                Some("ci"),
                vec![("box-profile", &b"default"[..])],
                "box.profile: the path /mcp/p/ci asks for `ci` but the Box-Profile header asks for `default`",
            ),
            (
                None,
                vec![("box-tighten", &b"{}"[..]), ("box-tighten", &b"{}"[..])],
                "the Box-Tighten header is given more than once",
            ),
            (
                None,
                vec![("box-max-read-bytes", &b"\xff"[..])],
                "the Box-Max-Read-Bytes header is not UTF-8 text",
            ),
        ] {
            let error = transport_ask(path, &headers(&pairs)).unwrap_err();
            assert!(error.starts_with(expected), "{error}");
        }
    }

    #[test]
    fn a_later_request_may_repeat_the_ask_or_leave_it_out_but_not_change_it() {
        let started = TransportAsk {
            profile: Some(AskPart::new("ci", "the path /mcp/p/ci")),
            tighten: Some(AskPart::new("{}", "the Box-Tighten header")),
            max_read_bytes: None,
            reattach: None,
        };
        assert_eq!(same_ask(&started, &started), Ok(()));
        assert_eq!(same_ask(&started, &TransportAsk::default()), Ok(()));
        // The same profile from another place is the same ask.
        let by_header = TransportAsk {
            profile: Some(AskPart::new("ci", "the Box-Profile header")),
            ..TransportAsk::default()
        };
        assert_eq!(same_ask(&started, &by_header), Ok(()));
        let changed = TransportAsk {
            max_read_bytes: Some(AskPart::new("5", "the Box-Max-Read-Bytes header")),
            ..TransportAsk::default()
        };
        let error = same_ask(&started, &changed).unwrap_err();
        assert!(
            error.starts_with("Box-Max-Read-Bytes: the Box-Max-Read-Bytes header differs"),
            "{error}"
        );
    }
}
